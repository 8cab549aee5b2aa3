package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// ErrMirrorExists is AdoptFile's refusal of a mirror path that exists.
var ErrMirrorExists = errors.New("the mirror exists")

// AdoptFile makes the Verified snapshot at snap, downloaded beside path,
// the mirror file at path, which must not exist yet (neither may its
// -wal, -shm or -journal): a new follower's mirror becomes the leader's
// file, prepared in place as adopt prepares it, then renamed to path.
// Restore into an open empty mirror copies the file's pages through the
// mirror's write-ahead log, which writes them twice (docs/performance.md).
// at is the place in the stream the snapshot covers. opts are those the
// mirror will be opened with.
//
// The snapshot's replica digest and its triggers are kept as the
// leader's writer kept them with its rows: the download was byte for byte
// the leader's file, and the preparation changes none of the tables the
// digest covers. quick_check and the digest's recomputation from the rows
// run once the mirror is open, out of the restore's way, and on every open
// until they have (AdoptedCheckDue, CheckAdopted).
//
// A crash before the rename leaves no mirror at path, and the follower
// starts over; after it, a whole one: the file is synced before the
// rename, its directory after.
func AdoptFile(ctx context.Context, snap, path string, at SnapshotAt, opts Options) error {
	for _, p := range []string{path, path + "-wal", path + "-shm", path + "-journal"} {
		if _, err := os.Lstat(p); err == nil {
			return fmt.Errorf("adopt snapshot: %s: %w", p, ErrMirrorExists)
		} else if !errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf("adopt snapshot: %w", err)
		}
	}
	if strings.ContainsAny(snap, "?#") {
		return fmt.Errorf("adopt snapshot: path %q may not contain '?' or '#'", snap)
	}
	if err := checkSnapshot(ctx, snap, false); err != nil {
		return err
	}
	// A new mirror, beside the snapshot, gives what a mirror holds of its
	// own from its first open (its meta, its file header's fields).
	freshPath := filepath.Join(filepath.Dir(snap), "fresh-"+filepath.Base(snap))
	defer removeDatabase(freshPath)
	fresh, err := Open(ctx, freshPath, Options{Logger: opts.Logger, Now: opts.Now, Readers: 1, CacheKiB: opts.CacheKiB})
	if err != nil {
		return fmt.Errorf("adopt snapshot: %w", err)
	}
	defer fresh.Close()
	sn, err := Open(ctx, snap, Options{Logger: opts.Logger, Now: opts.Now, Readers: 1})
	if err != nil {
		return fmt.Errorf("open snapshot: %w", err)
	}
	defer sn.Close()
	if err := fresh.sortingConn(ctx, func(conn *sql.Conn) error {
		return fresh.prepareFile(ctx, conn, sn, snap, at, true)
	}); err != nil {
		return fmt.Errorf("adopt snapshot: %w", err)
	}
	// The mirror's file is 0600 whatever the download's mode was.
	if err := os.Chmod(snap, 0o600); err != nil {
		return fmt.Errorf("adopt snapshot: %w", err)
	}
	if err := syncPath(snap); err != nil {
		return fmt.Errorf("adopt snapshot: %w", err)
	}
	if err := os.Rename(snap, path); err != nil {
		return fmt.Errorf("adopt snapshot: %w", err)
	}
	fileAdoptions.Add(1)
	if err := syncPath(filepath.Dir(path)); err != nil {
		// The mirror is there: failing now would have it taken for none.
		if opts.Logger != nil {
			opts.Logger.Warn("adopt snapshot: the mirror's directory could not be synced; a power loss may undo the "+
				"rename", "path", path, "err", err)
		}
	}
	return nil
}

// syncPath flushes the file or directory at path to its disk.
func syncPath(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	err = f.Sync()
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// removeDatabase removes the database at path and the files SQLite keeps
// beside it.
func removeDatabase(path string) {
	for _, p := range []string{path, path + "-wal", path + "-shm", path + "-journal"} {
		_ = os.Remove(p)
	}
}

// corrupt reports whether err is SQLite's finding that the file is
// damaged (SQLITE_CORRUPT) or not a database (SQLITE_NOTADB).
func corrupt(err error) bool {
	var serr *sqlite.Error
	if !errors.As(err, &serr) {
		return false
	}
	code := serr.Code() & 0xff
	return code == sqlite3.SQLITE_CORRUPT || code == sqlite3.SQLITE_NOTADB
}

// ErrAdoptedUnsound is CheckAdopted's finding that the mirror AdoptFile
// made is not what its leader's digest says, or fails quick_check.
var ErrAdoptedUnsound = errors.New("the adopted snapshot is unsound")

// Meta keys of the check of a mirror AdoptFile made: when it was made,
// while its check is still to pass; what quick_check found wrong with it,
// once it did.
const (
	adoptedCheckKey   = "adopted_check_due"
	adoptedDamagedKey = "adopted_damaged"
)

// AdoptedCheckDue reports whether the mirror was made by AdoptFile and
// CheckAdopted has not finished with it yet.
func (s *Store) AdoptedCheckDue(ctx context.Context) (bool, error) {
	v, err := s.Meta(ctx, adoptedCheckKey)
	return v != "", err
}

// AdoptedDamage is what CheckAdopted's quick_check found wrong with the
// mirror's file; "" when nothing (or it was not adopted).
func (s *Store) AdoptedDamage(ctx context.Context) (string, error) {
	return s.Meta(ctx, adoptedDamagedKey)
}

// CheckAdopted checks a mirror AdoptFile made, with the mirror in use: its
// quick_check, and its replica digest recomputed from its rows against
// the one kept, read in the same read transaction. A kept digest that
// differs from the rows is replaced by theirs (computed again in one write
// transaction), so that the next checkpoint compares the rows themselves
// with the leader's, and a divergence is repaired as any other. A file
// that fails quick_check is damaged: that is recorded (AdoptedDamage), for
// the operator. Either way the error wraps ErrAdoptedUnsound; once the
// check has ended, it is no longer due (AdoptedCheckDue).
func (s *Store) CheckAdopted(ctx context.Context) error {
	tx, err := s.bg.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("check the adopted snapshot: %w", err)
	}
	// quick_check first: a damaged page fails the digest's reads too,
	// and is then reported as such.
	problems, err := quickCheckLines(ctx, tx)
	var kept, rows ReplicaDigest
	if err == nil {
		kept, err = readDigest(ctx, tx)
	}
	if err == nil {
		rows, err = computeDigest(ctx, tx)
	}
	_ = tx.Rollback()
	var unsound []string
	if corrupt(err) {
		unsound, err = append(unsound, err.Error()), nil
	}
	if err != nil {
		return fmt.Errorf("check the adopted snapshot: %w", err)
	}
	damaged := len(unsound) > 0 || len(problems) != 1 || problems[0] != "ok"
	if len(problems) > 0 && (len(problems) != 1 || problems[0] != "ok") {
		unsound = append(unsound, "quick_check: "+strings.Join(problems, "; "))
	}
	diff := ""
	if !damaged {
		diff = kept.Diff(rows)
	}
	if diff != "" {
		unsound = append(unsound, "its replica digest differs from its rows in table "+diff)
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		if diff != "" {
			if err := createDigest(ctx, tx); err != nil {
				return fmt.Errorf("computing the digest from the rows: %w", err)
			}
		}
		if damaged {
			if err := setMeta(ctx, tx, "main", adoptedDamagedKey, strings.Join(unsound, "; ")); err != nil {
				return err
			}
		}
		_, err := tx.ExecContext(ctx, `DELETE FROM meta WHERE key = ?`, adoptedCheckKey)
		return err
	})
	switch {
	case err != nil && len(unsound) > 0:
		return fmt.Errorf("%w: %s; %w", ErrAdoptedUnsound, strings.Join(unsound, "; "), err)
	case err != nil:
		return fmt.Errorf("check the adopted snapshot: %w", err)
	case len(unsound) > 0:
		return fmt.Errorf("%w: %s", ErrAdoptedUnsound, strings.Join(unsound, "; "))
	}
	return nil
}
