package store

import (
	"context"
	"errors"
	"fmt"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// Writable is the readiness probe of the mirror: it reads from the reader
// pool, and reports the last write transaction the file refused (a full
// disk, an I/O error, a read-only or damaged file) until a write succeeds.
// It never takes the one writer connection: /readyz is unauthenticated,
// and a probe that began a write transaction queued behind ingest for as
// long as a page took, and made ingest queue behind every probe.
func (s *Store) Writable(ctx context.Context) error {
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM schema_migrations`).Scan(&n); err != nil {
		return fmt.Errorf("database not readable: %w", err)
	}
	if err := s.writeErr.Load(); err != nil {
		return fmt.Errorf("database not writable: the last write failed: %w", *err)
	}
	return nil
}

// noteWrite records the outcome of a write transaction for Writable: a
// refusal by the file is kept until a write succeeds; other failures (a
// cancelled context, a constraint) say nothing about the file.
func (s *Store) noteWrite(err error) {
	switch {
	case err == nil:
		if s.writeErr.Load() != nil {
			s.writeErr.Store(nil)
		}
	case fileRefused(err):
		s.writeErr.Store(&err)
	}
}

// fileRefused reports whether err is SQLite saying the file itself cannot
// take a write.
func fileRefused(err error) bool {
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return false
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_FULL, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN,
		sqlite3.SQLITE_PERM, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB:
		return true
	}
	return false
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
		return fmt.Errorf(
			"%w: %s is not a syncd mirror or is damaged; it was left as it is: restore it from a backup, or set [store] path to a new file",
			err,
			path,
		)
	case sqlite3.SQLITE_FULL:
		return fmt.Errorf("%w: free space on the disk holding %s; nothing was written", err, path)
	case sqlite3.SQLITE_READONLY, sqlite3.SQLITE_CANTOPEN, sqlite3.SQLITE_PERM:
		return fmt.Errorf("%w: syncd needs to read and write %s and create files beside it", err, path)
	}
	return err
}
