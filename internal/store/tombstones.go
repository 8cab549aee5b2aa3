package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"
)

// Deletions never drop rows: a resource that disappears upstream keeps its
// row with deleted_time set (a tombstone), its deletions count goes up, and
// a deleted (or withdrawn) event carries its last known state as before.
// The crawler calls these only for resources a completed listing no longer
// shows and a Get answered 404 for; the store records what it is told.
// A later Apply that sees the resource again revives the same row.

// MarkReposDeleted tombstones the live repos among uids and, because a
// repo's tags go with it, their live tags, recording tag.deleted events for
// the tags and then repo.deleted for the repo, in one transaction. Unknown
// and already deleted uids are ignored. It returns how many events it
// recorded.
func (s *Store) MarkReposDeleted(ctx context.Context, uids []string) (int, error) {
	n, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		repos, err := loadRepos(ctx, tx, `r.deleted_time IS NULL AND r.uid IN (%s)`, uids)
		if err != nil {
			return 0, err
		}
		live := sortedKeys(repos)
		tags, err := loadTags(ctx, tx, `t.deleted_time IS NULL AND t.repo_uid IN (%s)`, live, false)
		if err != nil {
			return 0, err
		}
		now := s.now()
		var cs []change
		tagUIDs := sortedKeys(tags)
		for _, uid := range tagUIDs {
			cs = append(cs, tagDeleted(tags[uid], now))
		}
		for _, uid := range live {
			r := repos[uid]
			cs = append(
				cs,
				change{
					typ:     RepoDeleted,
					scope:   r.Path,
					subject: uid,
					disc:    deletedDisc(r.deletions + 1),
					time:    now,
					before:  r.Repo,
				},
			)
		}
		if err := s.tombstone(ctx, tx, "tags", FormatTime(now), tagUIDs); err != nil {
			return 0, err
		}
		if err := s.tombstone(ctx, tx, "repos", FormatTime(now), live); err != nil {
			return 0, err
		}
		if !s.announce(baseline) {
			return 0, nil
		}
		return s.appendEvents(ctx, tx, cs)
	})
	if err != nil {
		return 0, fmt.Errorf("mark %d repos deleted: %w", len(uids), err)
	}
	return n, nil
}

// MarkTagsDeleted tombstones the live tags among uids and records a
// tag.deleted event for each, in one transaction. Unknown and already
// deleted uids are ignored. It returns how many events it recorded.
func (s *Store) MarkTagsDeleted(ctx context.Context, uids []string) (int, error) {
	n, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		tags, err := loadTags(ctx, tx, `t.deleted_time IS NULL AND t.uid IN (%s)`, uids, false)
		if err != nil {
			return 0, err
		}
		now := s.now()
		live := sortedKeys(tags)
		var cs []change
		for _, uid := range live {
			cs = append(cs, tagDeleted(tags[uid], now))
		}
		if err := s.tombstone(ctx, tx, "tags", FormatTime(now), live); err != nil {
			return 0, err
		}
		if !s.announce(baseline) {
			return 0, nil
		}
		return s.appendEvents(ctx, tx, cs)
	})
	if err != nil {
		return 0, fmt.Errorf("mark %d tags deleted: %w", len(uids), err)
	}
	return n, nil
}

// MarkAdvisoriesWithdrawn tombstones the live advisories among uids and
// records an advisory.withdrawn event for each, in one transaction. Unknown
// and already withdrawn uids are ignored. It returns how many events it
// recorded.
func (s *Store) MarkAdvisoriesWithdrawn(ctx context.Context, uids []string) (int, error) {
	n, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		advs, err := loadAdvisories(ctx, tx, `deleted_time IS NULL AND uid IN (%s)`, uids)
		if err != nil {
			return 0, err
		}
		now := s.now()
		live := sortedKeys(advs)
		var cs []change
		for _, uid := range live {
			a := advs[uid]
			cs = append(
				cs,
				change{typ: AdvisoryWithdrawn, scope: a.ArtifactName, subject: uid, disc: deletedDisc(a.deletions + 1), time: now,
					before: a.Advisory.forEvent()},
			)
		}
		if err := s.tombstone(ctx, tx, "advisories", FormatTime(now), live); err != nil {
			return 0, err
		}
		if !s.announce(baseline) {
			return 0, nil
		}
		return s.appendEvents(ctx, tx, cs)
	})
	if err != nil {
		return 0, fmt.Errorf("mark %d advisories withdrawn: %w", len(uids), err)
	}
	return n, nil
}

func tagDeleted(t storedTag, now time.Time) change {
	return change{
		typ:     TagDeleted,
		scope:   t.Path,
		subject: t.UID,
		disc:    deletedDisc(t.deletions + 1),
		time:    now,
		before:  t.Tag,
	}
}

// tombstone sets deleted_time on the live rows of table with these uids.
func (s *Store) tombstone(ctx context.Context, tx *sql.Tx, table, now string, uids []string) error {
	err := s.execByUIDs(
		ctx,
		tx,
		`UPDATE `+table+` SET deleted_time = ?, deletions = deletions + 1 WHERE deleted_time IS NULL AND uid IN (%s)`,
		[]any{now},
		uids,
	)
	if err != nil {
		return fmt.Errorf("tombstone %s: %w", table, err)
	}
	// A scope that is gone no longer fails: its failure (a 404 was often
	// the deletion seen early) goes with it.
	if table == "repos" || table == "tags" {
		if err := s.execByUIDs(ctx, tx, `DELETE FROM crawl_failures WHERE uid IN (%s)`, nil, uids); err != nil {
			return fmt.Errorf("forget failures of deleted %s: %w", table, err)
		}
	}
	// A deleted tag has no history left to backfill; if it comes back, it
	// is created anew.
	if table == "tags" {
		if err := s.backfillDone(ctx, tx, uids); err != nil {
			return err
		}
	}
	return nil
}

// sortedKeys orders events of one deletion by uid, so that the same
// deletion always produces the same sequence.
func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// LiveRepoUIDs returns, sorted, the uids of the repos the mirror holds as
// live anywhere below the group groupUID (all live repos when groupUID is
// ""), for a deletion sweep to compare with a completed listing.
func (s *Store) LiveRepoUIDs(ctx context.Context, groupUID string) ([]string, error) {
	q, args := `SELECT uid FROM repos WHERE deleted_time IS NULL ORDER BY uid`, []any(nil)
	if groupUID != "" {
		// uids are hierarchical: everything below g sorts between "g/" and
		// "g0" ('0' follows '/'), a range the uid index answers.
		q, args = `SELECT uid FROM repos WHERE uid > ? AND uid < ? AND deleted_time IS NULL ORDER BY uid`, []any{
			groupUID + "/",
			groupUID + "0",
		}
	}
	uids, err := s.readUIDs(ctx, q, args)
	if err != nil {
		return nil, fmt.Errorf("list live repos below %q: %w", groupUID, err)
	}
	return uids, nil
}

// LiveTagUIDs returns, sorted, the uids of the live tags the mirror holds
// for the repo repoUID.
func (s *Store) LiveTagUIDs(ctx context.Context, repoUID string) ([]string, error) {
	uids, err := s.readUIDs(
		ctx,
		`SELECT uid FROM tags WHERE repo_uid = ? AND deleted_time IS NULL ORDER BY uid`,
		[]any{repoUID},
	)
	if err != nil {
		return nil, fmt.Errorf("list live tags of repo %s: %w", repoUID, err)
	}
	return uids, nil
}

// LiveAdvisoryUIDs returns, sorted, the uids of the advisories the mirror
// holds as not withdrawn.
func (s *Store) LiveAdvisoryUIDs(ctx context.Context) ([]string, error) {
	uids, err := s.readUIDs(ctx, `SELECT uid FROM advisories WHERE deleted_time IS NULL ORDER BY uid`, nil)
	if err != nil {
		return nil, fmt.Errorf("list live advisories: %w", err)
	}
	return uids, nil
}

// readUIDs runs a one-column query on the reader pool: a sweep runs after
// its listing committed, and must not queue behind ingest on the writer.
func (s *Store) readUIDs(ctx context.Context, q string, args []any) ([]string, error) {
	uids := []string{}
	err := queryRows(ctx, s.r, q, args, func(rows *sql.Rows) error {
		var u string
		if err := rows.Scan(&u); err != nil {
			return err
		}
		uids = append(uids, u)
		return nil
	})
	return uids, err
}
