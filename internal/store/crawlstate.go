package store

import (
	"context"
	"fmt"
	"time"
)

// NewestTagUpdate is the newest update time the platform stamped on a tag
// below group that the mirror holds: the watermark an updated_since listing
// starts from. It is the upstream's clock, never syncd's. Zero when the
// mirror holds none.
func (s *Store) NewestTagUpdate(ctx context.Context, group string) (time.Time, error) {
	var v string
	err := s.r.QueryRowContext(
		ctx,
		`SELECT COALESCE(MAX(update_time), '') FROM tags WHERE uid > ? AND uid < ?`,
		group+"/",
		group+"0",
	).
		Scan(&v)
	if err != nil {
		return time.Time{}, fmt.Errorf("newest tag update below %s: %w", group, err)
	}
	return ParseTime(v)
}

// PendingHistories returns the live tags below group whose history is
// behind their listing: the walk has not read up to the tag's update time
// and digest, because a read failed, was held back, or was cut short. A
// listing that shows only what changed (updated_since) would not show
// them again, so the crawl asks for them here. The tags the backfill has
// yet to read are its own.
func (s *Store) PendingHistories(ctx context.Context, group string) ([]TagRef, error) {
	tx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("pending histories: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT uid FROM tags WHERE uid > ? AND uid < ? AND deleted_time IS NULL
		AND (COALESCE(history_update_time, '') != COALESCE(update_time, '') OR history_last_digest != digest)
		AND uid NOT IN (SELECT tag_uid FROM backfill)`, group+"/", group+"0")
	if err != nil {
		return nil, fmt.Errorf("pending histories: %w", err)
	}
	var uids []string
	for rows.Next() {
		var uid string
		if err := rows.Scan(&uid); err != nil {
			rows.Close()
			return nil, fmt.Errorf("pending histories: %w", err)
		}
		uids = append(uids, uid)
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(uids) == 0 {
		return nil, err
	}
	old, err := loadTags(ctx, tx, `t.uid IN (%s)`, uids, false)
	if err != nil {
		return nil, err
	}
	refs := make([]TagRef, 0, len(old))
	for _, uid := range uids {
		t := old[uid]
		refs = append(refs, t.ref())
	}
	return refs, nil
}

// FailureCounts counts the recorded failures by kind ("repo", "tag").
func (s *Store) FailureCounts(ctx context.Context) (map[string]int, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT kind, COUNT(*) FROM crawl_failures GROUP BY kind`)
	if err != nil {
		return nil, fmt.Errorf("count failures: %w", err)
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var kind string
		var n int
		if err := rows.Scan(&kind, &n); err != nil {
			return nil, fmt.Errorf("count failures: %w", err)
		}
		out[kind] = n
	}
	return out, rows.Err()
}
