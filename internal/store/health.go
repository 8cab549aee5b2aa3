package store

import (
	"context"
	"errors"
	"fmt"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Writable checks that the mirror can take a write: it begins an immediate
// transaction (taking SQLite's write lock) and rolls it back.
func (s *Store) Writable(ctx context.Context) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("database not writable: %w", err)
	}
	return tx.Rollback()
}

// explain adds what to do to errors that mean the file itself is the
// problem, so the operator is not left with a bare SQLite code.
func explain(path string, err error) error {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return err
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_NOTADB, sqlite3.SQLITE_CORRUPT:
		return fmt.Errorf("%w: %s is not a syncd mirror or is damaged; it was left as it is: restore it from a backup, or set [store] path to a new file", err, path)
	case sqlite3.SQLITE_FULL:
		return fmt.Errorf("%w: free space on the disk holding %s; nothing was written", err, path)
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM:
		return fmt.Errorf("%w: syncd needs to read and write %s and create files beside it", err, path)
	}
	return err
}
