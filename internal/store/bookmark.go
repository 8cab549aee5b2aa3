package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// TagBookmark returns where the history walk of a tag stopped; the zero
// Bookmark for a tag the mirror does not have.
func (s *Store) TagBookmark(ctx context.Context, tagUID string) (Bookmark, error) {
	var b Bookmark
	var last string
	err := s.r.QueryRowContext(
		ctx,
		`SELECT COALESCE(history_last_time,''), history_last_count, history_count FROM tags WHERE uid = ?`,
		tagUID,
	).
		Scan(&last, &b.LastCount, &b.Count)
	if errors.Is(err, sql.ErrNoRows) {
		return Bookmark{}, nil
	}
	if err != nil {
		return b, fmt.Errorf("read bookmark of tag %s: %w", tagUID, err)
	}
	b.LastTime, err = ParseTime(last)
	return b, err
}
