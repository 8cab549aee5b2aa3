package store

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"time"
)

// Tag is a tag as the mirror keeps it.
type Tag struct {
	UID        string    `json:"uid"`
	RepoUID    string    `json:"repoUid"`
	Repo       string    `json:"repo"` // repo name, filled in by the store
	Name       string    `json:"name"`
	Digest     string    `json:"digest"`
	Deprecated bool      `json:"deprecated"`
	Bundles    []string  `json:"bundles,omitempty"`
	CreateTime time.Time `json:"createTime,omitzero"`
	UpdateTime time.Time `json:"updateTime,omitzero"`
}

// TagRef names a tag whose history needs reading, with the bookmark to start
// from.
type TagRef struct {
	UID        string
	RepoUID    string
	Repo       string
	Name       string
	UpdateTime time.Time
	Bookmark   Bookmark
}

type storedTag struct {
	Tag
	deleted           bool
	deletions         int
	baseline          bool // first seen by the baseline crawl
	historyUpdateTime string
	historyLastDigest string
	bookmark          Bookmark
}

// tagColumns is how many values one tags row takes in ApplyTags.
const tagColumns = 10

// ApplyTags upserts one page of tags of repo and records tag.created (also
// for a tag that comes back after a deletion, whose tombstone it clears) and
// tag.deprecated events, all in one transaction. Digest changes are not
// events here: they come from the tag history, one per move, through
// ApplyHistory. It returns the tags whose history needs reading, because
// their digest or update time differs from what the history walk last saw.
func (s *Store) ApplyTags(ctx context.Context, repo Repo, tags []Tag) (need []TagRef, events int, err error) {
	tags = lastByUID(tags, func(t Tag) string { return t.UID })
	events, err = s.commit(ctx, func(tx *sql.Tx) (int, error) {
		need = need[:0]
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		uids := make([]string, len(tags))
		for i, t := range tags {
			uids[i] = t.UID
		}
		old, err := loadTags(ctx, tx, `t.uid IN (%s)`, uids)
		if err != nil {
			return 0, err
		}
		now := FormatTime(s.now())
		var cs []change
		args := make([]any, 0, tagColumns*len(tags))
		for _, t := range tags {
			t.Repo, t.RepoUID = repo.Name, repo.UID
			o, seen := old[t.UID]
			changed := true
			switch {
			case !seen || o.deleted:
				if s.announce(baseline) {
					cs = append(cs, change{typ: TagCreated, scope: repo.Name, subject: t.UID, disc: createdDisc(t.CreateTime, t.UpdateTime, o.deletions),
						time: eventTime(t.CreateTime, s.now()), after: t})
				}
			case t.Deprecated && !o.Deprecated:
				before := o.Tag
				before.Repo = repo.Name
				cs = append(cs, change{typ: TagDeprecated, scope: repo.Name, subject: t.UID, disc: FormatTime(t.UpdateTime),
					time: eventTime(t.UpdateTime, s.now()), before: before, after: t})
			default:
				changed = !sameTag(o.Tag, t)
			}
			if changed {
				args = append(args, t.UID, repo.UID, t.Name, t.Digest, t.Deprecated, jsonList(t.Bundles),
					nullTime(t.CreateTime), nullTime(t.UpdateTime), now, baseline)
			}
			if !seen || o.historyUpdateTime != FormatTime(t.UpdateTime) || o.historyLastDigest != t.Digest {
				need = append(need, TagRef{UID: t.UID, RepoUID: repo.UID, Repo: repo.Name, Name: t.Name, UpdateTime: t.UpdateTime, Bookmark: o.bookmark})
			}
		}
		if _, err := s.insertRows(ctx, tx, bulkTags, args); err != nil {
			return 0, fmt.Errorf("upsert tags: %w", err)
		}
		return s.appendEvents(ctx, tx, cs)
	})
	if err != nil {
		return nil, 0, fmt.Errorf("apply %d tags of repo %s: %w", len(tags), repo.Name, err)
	}
	return need, events, nil
}

func sameTag(a, b Tag) bool {
	return a.Name == b.Name && a.Digest == b.Digest && a.Deprecated == b.Deprecated && slices.Equal(a.Bundles, b.Bundles) &&
		sameTime(a.CreateTime, b.CreateTime) && sameTime(a.UpdateTime, b.UpdateTime)
}

// loadTags reads the tags matching where (on alias t, "%s" standing for the
// list of uids), deleted ones included, with their repo's name.
func loadTags(ctx context.Context, tx *sql.Tx, where string, uids []string) (map[string]storedTag, error) {
	old := make(map[string]storedTag, len(uids))
	err := queryByUIDs(ctx, tx, `SELECT t.uid, t.repo_uid, COALESCE(r.name,''), t.name, t.digest, t.deprecated, t.bundles,
		COALESCE(t.create_time,''), COALESCE(t.update_time,''), t.deleted_time IS NOT NULL, t.deletions,
		COALESCE(t.history_update_time,''), t.history_last_digest, COALESCE(t.history_last_time,''), t.history_last_count, t.history_count, t.baseline
		FROM tags t LEFT JOIN repos r ON r.uid = t.repo_uid WHERE `+where, uids,
		func(rows *sql.Rows) error {
			var t storedTag
			var bundles, ct, ut, lt string
			if err := rows.Scan(&t.UID, &t.RepoUID, &t.Repo, &t.Name, &t.Digest, &t.Deprecated, &bundles, &ct, &ut, &t.deleted, &t.deletions,
				&t.historyUpdateTime, &t.historyLastDigest, &lt, &t.bookmark.LastCount, &t.bookmark.Count, &t.baseline); err != nil {
				return err
			}
			var err error
			if t.Bundles, err = parseList(bundles); err != nil {
				return err
			}
			if t.CreateTime, err = ParseTime(ct); err != nil {
				return err
			}
			if t.UpdateTime, err = ParseTime(ut); err != nil {
				return err
			}
			if t.bookmark.LastTime, err = ParseTime(lt); err != nil {
				return err
			}
			old[t.UID] = t
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("read stored tags: %w", err)
	}
	return old, nil
}
