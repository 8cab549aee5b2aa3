package store

import (
	"context"
	"database/sql"
	"fmt"
)

// The backfill: the first complete listing ends the baseline, and the tags'
// histories are read after it, while the mirror already serves their
// current state. The backfill table holds the tags whose history is still
// to read, with the update time the listing showed (the end of each tag's
// silent baseline); a tag leaves it when its history is applied. Being in
// SQLite, it survives a crash: a restart reads only what is left.

// startBackfill puts every live tag whose history was never read, or read
// only up to an older listing than the last, into the backfill, with its
// update time as the listing left it, and returns how many it queued.
func startBackfill(ctx context.Context, tx *sql.Tx) (int64, error) {
	// A tag whose history was read during the baseline (a spare read) is
	// left out when that read was whole and of the last listing's state;
	// one that found no record is read again (its records may come just
	// after the time its listing showed).
	res, err := tx.ExecContext(ctx, `INSERT INTO backfill (tag_uid, listed_time)
		SELECT uid, update_time FROM tags
		WHERE deleted_time IS NULL AND (history_count = 0 OR history_update_time IS NULL
			OR history_update_time != COALESCE(update_time, '')
			OR history_last_digest IS NOT digest)
		ON CONFLICT(tag_uid) DO NOTHING`)
	if err != nil {
		return 0, fmt.Errorf("start the history backfill: %w", err)
	}
	return res.RowsAffected()
}

// BackfillRemaining counts the live tags whose history the backfill has
// yet to read: 0 once every tag's history is read (and before the
// baseline ends, when nothing is queued yet).
func (s *Store) BackfillRemaining(ctx context.Context) (int64, error) {
	return backfillRemaining(ctx, s.background())
}

func backfillRemaining(ctx context.Context, q queryer) (int64, error) {
	var n int64
	err := q.QueryRowContext(
		ctx,
		`SELECT COUNT(*) FROM backfill b JOIN tags t ON t.uid = b.tag_uid WHERE t.deleted_time IS NULL`,
	).
		Scan(&n)
	if err != nil {
		return 0, fmt.Errorf("count the backfill: %w", err)
	}
	return n, nil
}

// HistoryReady reports whether the mirror holds every tag's history: the
// baseline has ended and the backfill has nothing left.
func (s *Store) HistoryReady(ctx context.Context) (bool, error) {
	return s.historyReady(ctx, s.background())
}

func (s *Store) historyReady(ctx context.Context, q queryer) (bool, error) {
	in, err := s.InBaseline(ctx)
	if err != nil || in {
		return false, err
	}
	n, err := backfillRemaining(ctx, q)
	return n == 0, err
}

// BackfillNext returns up to n tags of the backfill in its order, leaving
// out those skip names (reads under way, or failed in this pass): the
// tags a later listing showed changed first, then the newest update first.
func (s *Store) BackfillNext(ctx context.Context, n int, skip func(uid string) bool) ([]TagRef, error) {
	tx, err := s.background().BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("read the backfill: %w", err)
	}
	defer tx.Rollback()
	rows, err := tx.QueryContext(ctx, `SELECT b.tag_uid FROM backfill b JOIN tags t ON t.uid = b.tag_uid
		WHERE t.deleted_time IS NULL ORDER BY b.moved DESC, b.listed_time DESC, b.tag_uid`)
	if err != nil {
		return nil, fmt.Errorf("read the backfill: %w", err)
	}
	var uids []string
	for rows.Next() && len(uids) < n {
		var uid string
		if err := rows.Scan(&uid); err != nil {
			rows.Close()
			return nil, fmt.Errorf("read the backfill: %w", err)
		}
		if !skip(uid) {
			uids = append(uids, uid)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil || len(uids) == 0 {
		return nil, err
	}
	tags, err := loadTags(ctx, tx, `t.uid IN (%s)`, uids, false)
	if err != nil {
		return nil, err
	}
	refs := make([]TagRef, 0, len(uids))
	for _, uid := range uids {
		if t, ok := tags[uid]; ok {
			refs = append(refs, t.ref())
		}
	}
	return refs, nil
}

// BackfillRefs returns those of the tags uids that the backfill holds, to
// read now: a pushed move need not wait for its turn.
func (s *Store) BackfillRefs(ctx context.Context, uids []string) ([]TagRef, error) {
	tx, err := s.background().BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("read the backfill: %w", err)
	}
	defer tx.Rollback()
	tags, err := loadTags(ctx, tx, `t.uid IN (%s)`, uids, false)
	if err != nil {
		return nil, err
	}
	var refs []TagRef
	for _, uid := range uids {
		if t, ok := tags[uid]; ok && t.backfill && !t.deleted {
			refs = append(refs, t.ref())
		}
	}
	return refs, nil
}

// backfillMoved marks tags of the backfill that a listing showed changed
// since the first: their moves are news, and they are read first.
func (s *Store) backfillMoved(ctx context.Context, tx *sql.Tx, uids []string) error {
	if err := s.execByUIDs(
		ctx,
		tx,
		`UPDATE backfill SET moved = 1 WHERE moved = 0 AND tag_uid IN (%s)`,
		nil,
		uids,
	); err != nil {
		return fmt.Errorf("mark moved tags of the backfill: %w", err)
	}
	return nil
}

// backfillDone takes tags whose history was read out of the backfill.
func (s *Store) backfillDone(ctx context.Context, tx *sql.Tx, uids []string) error {
	if err := s.execByUIDs(ctx, tx, `DELETE FROM backfill WHERE tag_uid IN (%s)`, nil, uids); err != nil {
		return fmt.Errorf("take read tags out of the backfill: %w", err)
	}
	return nil
}

// background is the pool for reads of syncd's own bookkeeping that walk
// the mirror (Store.bg); a read-only store has only its readers.
func (s *Store) background() *sql.DB {
	if s.bg != nil {
		return s.bg
	}
	return s.r
}
