package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"
)

// Repo is a repository as the mirror keeps it.
type Repo struct {
	UID         string    `json:"uid"`
	Name        string    `json:"name"`
	Description string    `json:"description"`
	CatalogTier string    `json:"catalogTier,omitempty"`
	Aliases     []string  `json:"aliases,omitempty"`
	ActiveTags  []string  `json:"activeTags,omitempty"`
	Bundles     []string  `json:"bundles,omitempty"`
	CreateTime  time.Time `json:"createTime,omitzero"`
	UpdateTime  time.Time `json:"updateTime,omitzero"`
}

type storedRepo struct {
	Repo
	deleted   bool
	deletions int
}

// repoColumns is how many values one repos row takes in ApplyRepos.
const repoColumns = 10

// ApplyRepos upserts one page of repos and records repo.created (also for a
// repo that comes back after a deletion, whose tombstone it clears) and
// repo.updated events, all in one transaction. It returns how many events it
// recorded.
func (s *Store) ApplyRepos(ctx context.Context, repos []Repo) (int, error) {
	repos = lastByUID(repos, func(r Repo) string { return r.UID })
	n, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		uids := make([]string, len(repos))
		for i, r := range repos {
			uids[i] = r.UID
		}
		old, err := loadRepos(ctx, tx, `uid IN (%s)`, uids)
		if err != nil {
			return 0, err
		}
		now := FormatTime(s.now())
		var cs []change
		args := make([]any, 0, repoColumns*len(repos))
		for _, r := range repos {
			o, seen := old[r.UID]
			switch {
			case !seen || o.deleted:
				if s.announce(baseline) {
					cs = append(cs, change{typ: RepoCreated, scope: r.Name, subject: r.UID, disc: createdDisc(r.CreateTime, r.UpdateTime, o.deletions),
						time: eventTime(r.CreateTime, s.now()), after: r})
				}
			case !sameRepo(o.Repo, r):
				disc, err := updatedDisc(r.UpdateTime, o.Repo, r)
				if err != nil {
					return 0, err
				}
				cs = append(cs, change{typ: RepoUpdated, scope: r.Name, subject: r.UID, disc: disc, time: eventTime(r.UpdateTime, s.now()), before: o.Repo, after: r})
			default:
				continue
			}
			args = append(args, r.UID, r.Name, r.Description, r.CatalogTier, jsonList(r.Aliases), jsonList(r.ActiveTags), jsonList(r.Bundles),
				nullTime(r.CreateTime), nullTime(r.UpdateTime), now)
		}
		if _, err := s.insertRows(ctx, tx, bulkRepos, args); err != nil {
			return 0, fmt.Errorf("upsert repos: %w", err)
		}
		return s.appendEvents(ctx, tx, cs)
	})
	if err != nil {
		return 0, fmt.Errorf("apply %d repos: %w", len(repos), err)
	}
	return n, nil
}

// loadRepos reads the repos matching where ("%s" stands for the list of
// uids), deleted ones included.
func loadRepos(ctx context.Context, tx *sql.Tx, where string, uids []string) (map[string]storedRepo, error) {
	old := make(map[string]storedRepo, len(uids))
	err := queryByUIDs(ctx, tx, `SELECT uid, name, description, catalog_tier, aliases, active_tags, bundles,
		COALESCE(create_time,''), COALESCE(update_time,''), deleted_time IS NOT NULL, deletions FROM repos WHERE `+where, uids,
		func(rows *sql.Rows) error {
			var r storedRepo
			var aliases, active, bundles, ct, ut string
			if err := rows.Scan(&r.UID, &r.Name, &r.Description, &r.CatalogTier, &aliases, &active, &bundles, &ct, &ut, &r.deleted, &r.deletions); err != nil {
				return err
			}
			var err error
			if r.Aliases, err = parseList(aliases); err != nil {
				return err
			}
			if r.ActiveTags, err = parseList(active); err != nil {
				return err
			}
			if r.Bundles, err = parseList(bundles); err != nil {
				return err
			}
			if r.CreateTime, err = ParseTime(ct); err != nil {
				return err
			}
			if r.UpdateTime, err = ParseTime(ut); err != nil {
				return err
			}
			old[r.UID] = r
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("read stored repos: %w", err)
	}
	return old, nil
}

func sameRepo(a, b Repo) bool {
	return a.Name == b.Name && a.Description == b.Description && a.CatalogTier == b.CatalogTier &&
		slices.Equal(a.Aliases, b.Aliases) && slices.Equal(a.ActiveTags, b.ActiveTags) && slices.Equal(a.Bundles, b.Bundles) &&
		sameTime(a.CreateTime, b.CreateTime) && sameTime(a.UpdateTime, b.UpdateTime)
}

// sameTime compares times as the mirror stores them, to the millisecond, so
// that a finer clock upstream does not look like a change on every crawl.
func sameTime(a, b time.Time) bool { return FormatTime(a) == FormatTime(b) }

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return FormatTime(t)
}

// eventTime is when a change happened upstream, or when syncd saw it if the
// upstream gave no time.
func eventTime(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t
}
