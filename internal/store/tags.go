package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"
)

// Tag is a tag as the mirror keeps it.
type Tag struct {
	UID        string    `json:"uid"`
	RepoUID    string    `json:"repoUid"`
	Repo       string    `json:"repo"` // repo name, filled in by the store
	Path       string    `json:"path"` // repo's registry path, filled in by the store
	Name       string    `json:"name"`
	Digest     string    `json:"digest"`
	Deprecated bool      `json:"deprecated"`
	Bundles    []string  `json:"bundles,omitempty"`
	CreateTime time.Time `json:"createTime,omitzero"`
	UpdateTime time.Time `json:"updateTime,omitzero"`
	// Raw is the tag as the platform sent it, stored in tags.raw; never
	// part of an event. Nil leaves what the mirror has.
	Raw json.RawMessage `json:"-"`
}

// TagRef names a tag whose history needs reading, with the bookmark to start
// from.
type TagRef struct {
	UID     string
	RepoUID string
	Repo    string // the repo's name
	// Path is the repo's registry path, where the tag's history is read.
	Path       string
	Name       string
	UpdateTime time.Time
	Bookmark   Bookmark
	// Listed is the listing's state of a tag whose digest the listing
	// showed moved: its digest and its deprecation are held back from
	// the mirror until the history read that ref asks for has applied the
	// moves, and ApplyHistory applies it after them, in the same
	// transaction. Without it a deprecation seen with the move came
	// before the moves, at the old digest: a state the tag never had,
	// and on the KV bucket values whose update time went back. Only this
	// ref carries it: when its read fails, the read is retried (the tag
	// stays behind its listed update time, PendingHistories) but the
	// deprecation waits for a listing that shows the tag again.
	Listed *Tag
}

type storedTag struct {
	Tag
	raw               string // tags.raw, "" for none or not read
	deleted           bool
	deletions         int
	baseline          bool // first seen by the baseline crawl
	historyUpdateTime string
	historyLastDigest string
	bookmark          Bookmark
	// backfill: the tag's history is still to read in the backfill;
	// listedTime is its update time as the first complete listing showed
	// it, the end of its silent baseline.
	backfill   bool
	listedTime time.Time
}

// ref is t as a tag whose history needs reading, from its bookmark.
func (t storedTag) ref() TagRef {
	return TagRef{UID: t.UID, RepoUID: t.RepoUID, Repo: t.Repo, Path: t.Path, Name: t.Name, UpdateTime: t.UpdateTime,
		Bookmark: t.bookmark}
}

// tagColumns is how many values one tags row takes in ApplyTags.
const tagColumns = 11

// ApplyTags upserts one page of tags of repo and records tag.created (also
// for a tag that comes back after a deletion, whose tombstone it clears) and
// tag.deprecated events, all in one transaction. Digest changes are not
// events here: they come from the tag history, one per move, through
// ApplyHistory. A tag whose raw JSON alone changed is rewritten without an
// event. It returns the tags whose history needs reading, because their
// digest or update time differs from what the history walk last saw.
//
// A tag the backfill has yet to read is not returned: the backfill reads it,
// first when this listing shows it changed, and until then it keeps the
// digest the first listing showed, which its history's moves change.
//
// The tags of a repo the baseline did not finish (repos.baseline_pending)
// are taken as the baseline would have taken them: not news, and their
// past moves the starting point.
func (s *Store) ApplyTags(ctx context.Context, repo Repo, tags []Tag) (need []TagRef, events int, err error) {
	return s.ApplyTagPage(ctx, []RepoTags{{Repo: repo, Tags: tags}})
}

// RepoTags are tags of one repo.
type RepoTags struct {
	Repo Repo
	Tags []Tag
}

// ApplyTagPage is ApplyTags for the tags of several repos (a page of the
// organization's listing), in one transaction.
func (s *Store) ApplyTagPage(ctx context.Context, page []RepoTags) (need []TagRef, events int, err error) {
	events, err = s.commit(ctx, func(tx *sql.Tx) (int, error) {
		need = need[:0]
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		events := 0
		for _, rt := range page {
			tags := lastByUID(rt.Tags, func(t Tag) string { return t.UID })
			more, n, err := s.applyTags(ctx, tx, baseline, rt.Repo, tags)
			if err != nil {
				return 0, fmt.Errorf("apply %d tags of repo %s: %w", len(tags), repoPath(rt.Repo), err)
			}
			need = append(need, more...)
			events += n
		}
		return events, nil
	})
	if err != nil {
		return nil, 0, err
	}
	return need, events, nil
}

// applyTags is ApplyTags' work inside tx, for tags of distinct uids.
func (s *Store) applyTags(
	ctx context.Context,
	tx *sql.Tx,
	baseline bool,
	repo Repo,
	tags []Tag,
) (need []TagRef, events int, err error) {
	events, err = func() (int, error) {
		path, pending, err := repoState(ctx, tx, repo)
		if err != nil {
			return 0, err
		}
		// listing: the store's baseline, whose listings are the state; a
		// repo whose own baseline is pending after it takes its tags as
		// the baseline would, but holds and announces as after it.
		listing := baseline
		baseline = baseline || pending
		uids := make([]string, len(tags))
		for i, t := range tags {
			uids[i] = t.UID
		}
		old, err := loadTags(ctx, tx, `t.uid IN (%s)`, uids, true)
		if err != nil {
			return 0, err
		}
		now := FormatTime(s.now())
		var cs []change
		var moved []string
		args := make([]any, 0, tagColumns*len(tags))
		for _, t := range tags {
			t.Repo, t.RepoUID, t.Path = repo.Name, repo.UID, path
			raw, err := rawJSON(t.Raw)
			if err != nil {
				return 0, fmt.Errorf("tag %s: %w", t.UID, err)
			}
			o, seen := old[t.UID]
			listed := t.Digest
			// A tag whose history the backfill has yet to read is read
			// there, first when the listing shows it changed since.
			backfill := seen && !o.deleted && o.backfill && !baseline
			if backfill && (o.Digest != listed || !sameTime(o.UpdateTime, t.UpdateTime)) {
				moved = append(moved, t.UID)
			}
			var held *Tag
			// During the baseline the listing is the state: a tag read
			// then (a spare read) and listed again after a move takes the
			// listing as it is, and its history is the backfill's from the
			// record it ends at (startBackfill).
			if !listing && seen && !o.deleted && (o.bookmark.Count > 0 || backfill) {
				// The digest moves with the history read this listing
				// asks for, with its tag.moved events: a digest changed
				// here, silently, would be state no event carries.
				t.Digest = o.Digest
				if listed != o.Digest && !backfill {
					// So does a deprecation the listing shows with the
					// move: it came after it. Applied now, it would reach
					// the stream and the KV bucket ahead of the moves, at
					// the old digest. The read applies it after the moves
					// (TagRef.Listed). (A tag the backfill holds is read
					// from the store's refs, which cannot carry it:
					// docs/events.md.)
					l := t
					l.Digest, held = listed, &l
					t.Deprecated = o.Deprecated
				}
			}
			changed := true
			switch {
			case !seen || o.deleted:
				// After the baseline, a tag whose history was never read
				// is announced by its first history read, with the digest
				// it was created at (ApplyHistory): announced here with
				// the listed digest, the moves read after it would take it
				// back to older digests. The baseline's tags (announced
				// in snapshot mode) have no moves to follow.
				if s.announce(baseline) && (baseline || seen && o.bookmark.Count > 0) {
					cs = append(
						cs,
						change{typ: TagCreated, scope: path, subject: t.UID, disc: createdDisc(t.CreateTime, t.UpdateTime, o.deletions),
							time: eventTime(t.CreateTime, s.now()), after: t},
					)
				}
			case t.Deprecated && !o.Deprecated && s.announce(listing):
				// (Without the snapshot's announcements, a deprecation the
				// baseline's listings show is its starting point too.)
				before := o.Tag
				before.Repo, before.Path = repo.Name, path
				cs = append(cs, change{typ: TagDeprecated, scope: path, subject: t.UID, disc: FormatTime(t.UpdateTime),
					time: eventTime(t.UpdateTime, s.now()), before: before, after: t})
			default:
				changed = !sameTag(o.Tag, t) || rawChanged(o.raw, raw)
			}
			if changed {
				args = append(args, t.UID, repo.UID, t.Name, t.Digest, t.Deprecated, jsonList(t.Bundles),
					nullTime(t.CreateTime), nullTime(t.UpdateTime), now, baseline, raw)
			}
			// A held listing is always read: dropped without a read, its
			// deprecation would never be recorded.
			if !backfill && (!seen || held != nil || o.historyUpdateTime != FormatTime(t.UpdateTime) ||
				o.historyLastDigest != listed) {
				need = append(
					need,
					TagRef{
						UID:        t.UID,
						RepoUID:    repo.UID,
						Repo:       repo.Name,
						Path:       path,
						Name:       t.Name,
						UpdateTime: t.UpdateTime,
						Bookmark:   o.bookmark,
						Listed:     held,
					},
				)
			}
		}
		if _, err := s.insertRows(ctx, tx, bulkTags, args); err != nil {
			return 0, fmt.Errorf("upsert tags: %w", err)
		}
		if err := s.backfillMoved(ctx, tx, moved); err != nil {
			return 0, err
		}
		return s.appendEvents(ctx, tx, cs)
	}()
	return need, events, err
}

// repoState returns the registry path of repo as the mirror has it (the
// caller's when it gives one, which its ApplyRepos stored) and whether the
// repo's baseline is pending.
func repoState(ctx context.Context, tx *sql.Tx, repo Repo) (path string, pending bool, err error) {
	var stored string
	err = tx.QueryRowContext(ctx, `SELECT path, baseline_pending FROM repos WHERE uid = ?`, repo.UID).
		Scan(&stored, &pending)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", false, fmt.Errorf("read repo %s: %w", repo.UID, err)
	}
	return scopeOf(repo.Path, scopeOf(stored, repo.Name)), pending, nil
}

func sameTag(a, b Tag) bool {
	return a.Name == b.Name && a.Digest == b.Digest && a.Deprecated == b.Deprecated &&
		slices.Equal(a.Bundles, b.Bundles) &&
		sameTime(a.CreateTime, b.CreateTime) &&
		sameTime(a.UpdateTime, b.UpdateTime)
}

// loadTags reads the tags matching where (on alias t, "%s" standing for the
// list of uids), deleted ones included, with their repo's name and path,
// and their raw JSON if withRaw: the history's writes, which are most of
// ingest, have no use for it.
func loadTags(
	ctx context.Context,
	tx *sql.Tx,
	where string,
	uids []string,
	withRaw bool,
) (map[string]storedTag, error) {
	old := make(map[string]storedTag, len(uids))
	raw := `''`
	if withRaw {
		raw = `COALESCE(t.raw,'')`
	}
	err := queryByUIDs(
		ctx,
		tx,
		`SELECT t.uid, t.repo_uid, COALESCE(r.name,''), COALESCE(r.path,''), t.name, t.digest, t.deprecated, t.bundles,
		COALESCE(t.create_time,''), COALESCE(t.update_time,''), t.deleted_time IS NOT NULL, t.deletions,
		COALESCE(t.history_update_time,''), t.history_last_digest, COALESCE(t.history_last_time,''), t.history_last_count,
			t.history_count, t.baseline,
		b.tag_uid IS NOT NULL, COALESCE(b.listed_time,''),
		`+raw+` FROM tags t LEFT JOIN repos r ON r.uid = t.repo_uid LEFT JOIN backfill b ON b.tag_uid = t.uid WHERE `+where,
		uids,
		func(rows *sql.Rows) error {
			var t storedTag
			var bundles, ct, ut, lt, listed string
			if err := rows.Scan(
				&t.UID,
				&t.RepoUID,
				&t.Repo,
				&t.Path,
				&t.Name,
				&t.Digest,
				&t.Deprecated,
				&bundles,
				&ct,
				&ut,
				&t.deleted,
				&t.deletions,
				&t.historyUpdateTime,
				&t.historyLastDigest,
				&lt,
				&t.bookmark.LastCount,
				&t.bookmark.Count,
				&t.baseline,
				&t.backfill,
				&listed,
				&t.raw,
			); err != nil {
				return err
			}
			t.Path = scopeOf(t.Path, t.Repo)
			if err := t.decodeText(bundles, ct, ut); err != nil {
				return err
			}
			var err error
			if t.bookmark.LastTime, err = ParseTime(lt); err != nil {
				return err
			}
			if t.listedTime, err = ParseTime(listed); err != nil {
				return err
			}
			old[t.UID] = t
			return nil
		},
	)
	if err != nil {
		return nil, fmt.Errorf("read stored tags: %w", err)
	}
	return old, nil
}

// decodeText fills the fields of t that a row holds as text: its bundles
// and its times.
func (t *Tag) decodeText(bundles, createTime, updateTime string) error {
	var err error
	if t.Bundles, err = parseList(bundles); err != nil {
		return err
	}
	if t.CreateTime, err = ParseTime(createTime); err != nil {
		return err
	}
	t.UpdateTime, err = ParseTime(updateTime)
	return err
}
