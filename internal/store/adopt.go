package store

import (
	"context"
	"database/sql"
	"fmt"
	"sync/atomic"

	"modernc.org/sqlite"
)

// An empty mirror adopts a verified snapshot's file rather than copying
// its tables (Restore, Provenance): the file is made what the mirror is to
// hold in place, then copied into the mirror a page at a time.

// adoptable reports whether the mirror of the writer connection conn may
// adopt the snapshot open as snap: it is empty, and the two files have
// the same page size and auto-vacuum mode (SQLite's backup API cannot copy
// pages of another size into a database in WAL mode).
func adoptable(ctx context.Context, conn *sql.Conn, snap *Store) (bool, error) {
	empty, err := isEmpty(ctx, conn)
	if err != nil || !empty {
		return false, err
	}
	for _, pragma := range []string{"page_size", "auto_vacuum"} {
		var mine, theirs int64
		if err := conn.QueryRowContext(ctx, `PRAGMA `+pragma).Scan(&mine); err != nil {
			return false, fmt.Errorf("read the mirror's %s: %w", pragma, err)
		}
		if err := snap.w.QueryRowContext(ctx, `PRAGMA `+pragma).Scan(&theirs); err != nil {
			return false, fmt.Errorf("read the snapshot's %s: %w", pragma, err)
		}
		if mine != theirs {
			snap.log.Info("restore: the snapshot's file differs from the mirror's; copying its tables",
				"pragma", pragma, "mirror", mine, "snapshot", theirs)
			return false, nil
		}
	}
	return true, nil
}

// adopt restores the snapshot at path, open as snap, into the empty mirror
// whose writer connection conn is: the snapshot file is made what the
// mirror is to hold (restoreTables's result) in place, and then becomes
// the mirror's file a page at a time through SQLite's backup API, in one
// write transaction of the mirror. Copying its tables row by row and
// building their indexes again took 26 s for the benchmark's mirror
// (746 MB); adopting it, less than half of that (docs/performance.md).
//
// Only a Verified snapshot is adopted: its pages come as they are (see
// Provenance). What the leader's file holds that a restore does not copy
// is overwritten (secure_delete), and the file header's free fields
// (user_version, application_id, the suggested cache size) are set to
// the mirror's.
func (s *Store) adopt(ctx context.Context, conn *sql.Conn, snap *Store, path string, at SnapshotAt) error {
	if err := s.prepareFile(ctx, conn, snap, path, at, false); err != nil {
		return err
	}
	// The digest is computed from the snapshot's rows while its pages are
	// copied, on the other core; the copy's last page, which commits it,
	// waits for the digest, so that a snapshot whose rows cannot be read
	// is refused with the mirror as it was.
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var d struct {
		d   ReplicaDigest
		err error
	}
	done := make(chan struct{}) // closed once d is set
	go func() {
		defer close(done)
		if d.err = adoptDigestFault; d.err == nil {
			d.d, d.err = digestOf(dctx, path)
		}
	}()
	committed, err := copyPages(ctx, conn, path, func() error {
		<-done
		return d.err
	})
	if err != nil && !committed {
		cancel()
		<-done
		// The copied pages, rolled back, are still in the write-ahead log.
		if _, cerr := conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA wal_checkpoint(TRUNCATE)`); cerr != nil {
			s.log.Warn("restore: truncating the write-ahead log after a failed copy", "err", cerr)
		}
		return err
	}
	if err != nil {
		s.log.Warn("restore: the copy of the snapshot committed, then failed to end", "err", err)
	}
	<-done
	// The mirror is the snapshot's from here on: the rest is done even if
	// ctx ends (a crash here leaves the mirror without the digest's
	// triggers, and Open computes it again: ensureDigest).
	ctx = context.WithoutCancel(ctx)
	err = d.err
	if err == nil {
		tx, terr := conn.BeginTx(ctx, nil)
		err = runTx(tx, terr, func(tx *sql.Tx) error { return setDigest(ctx, tx, d.d) })
	}
	if err != nil {
		s.log.Warn("restore: recording the replica digest of the adopted snapshot failed; computing it again", "err", err)
		tx, err := conn.BeginTx(ctx, nil)
		if err = runTx(tx, err, func(tx *sql.Tx) error { return createDigest(ctx, tx) }); err != nil {
			return fmt.Errorf("%w: the replica digest: %w", ErrRestoreUnfinished, err)
		}
	}
	adoptions.Add(1)
	// The copy's pages are in the write-ahead log: into the file with them
	// now, and the log truncated, rather than at the next commit (which
	// does it anyway, should this fail).
	if _, err := conn.ExecContext(ctx, `PRAGMA wal_checkpoint(TRUNCATE)`); err != nil {
		s.log.Warn("restore: checkpointing the adopted snapshot", "err", err)
	}
	return nil
}

// prepareFile makes the snapshot at path, open as snap, what the mirror
// whose writer connection conn is is to hold, in place (see adopt), and
// closes snap: its events published, its failures bounded, its deferred
// indexes built, the mirror's own tables and meta in, the file header's
// free fields the mirror's, out of WAL mode. keepDigest keeps the
// snapshot's replica digest and its triggers (AdoptFile); otherwise they
// go, for adopt to compute the digest from the rows.
func (s *Store) prepareFile(ctx context.Context, conn *sql.Conn, snap *Store, path string, at SnapshotAt,
	keepDigest bool) error {
	var header [3]int64
	for i, pragma := range adoptedHeader {
		if err := conn.QueryRowContext(ctx, `PRAGMA `+pragma).Scan(&header[i]); err != nil {
			return fmt.Errorf("read the mirror's %s: %w", pragma, err)
		}
	}
	if err := snap.sortingConn(ctx, func(sc *sql.Conn) error {
		if _, err := sc.ExecContext(ctx, `PRAGMA secure_delete = ON`); err != nil {
			return fmt.Errorf("prepare the snapshot: %w", err)
		}
		for i, pragma := range adoptedHeader {
			if _, err := sc.ExecContext(ctx, fmt.Sprintf(`PRAGMA %s = %d`, pragma, header[i])); err != nil {
				return fmt.Errorf("prepare the snapshot: set %s: %w", pragma, err)
			}
		}
		tx, err := sc.BeginTx(ctx, nil)
		return runTx(tx, err, func(tx *sql.Tx) error { return s.prepareAdopted(ctx, tx, keepDigest) })
	}); err != nil {
		return err
	}
	if err := snap.Close(); err != nil {
		return fmt.Errorf("close snapshot: %w", err)
	}
	// The mirror's own tables (those a restore leaves alone) and meta go
	// into the snapshot, from the mirror as it is now.
	if _, err := conn.ExecContext(ctx, `ATTACH DATABASE ? AS snap`, "file:"+path); err != nil {
		return fmt.Errorf("attach snapshot %s: %w", path, err)
	}
	_, err := conn.ExecContext(ctx, `PRAGMA snap.secure_delete = ON`)
	if err == nil {
		var tx *sql.Tx
		tx, err = conn.BeginTx(ctx, nil)
		err = runTx(tx, err, func(tx *sql.Tx) error {
			if err := s.keepOwnTables(ctx, tx, at); err != nil || !keepDigest {
				return err
			}
			// Its kept digest and its pages are checked once it is the
			// mirror (CheckAdopted), on every start until done.
			return setMeta(ctx, tx, "snap", adoptedCheckKey, FormatTime(s.now()))
		})
	}
	if _, derr := conn.ExecContext(context.WithoutCancel(ctx), `DETACH DATABASE snap`); err == nil && derr != nil {
		err = fmt.Errorf("detach snapshot: %w", derr)
	}
	if err != nil {
		return err
	}
	// Out of WAL mode, the snapshot is read by the copy and the digest at
	// once without either recovering its log (the other gets "database is
	// locked"), and is one file, whole, to rename (AdoptFile).
	return leaveWAL(ctx, path)
}

// adoptedHeader are the file header's fields no migration sets that an
// adopted snapshot takes from the mirror.
var adoptedHeader = []string{"user_version", "application_id", "default_cache_size"}

// leaveWAL puts the database at path in rollback journal mode, its
// write-ahead log checkpointed into it and removed.
func leaveWAL(ctx context.Context, path string) error {
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		return fmt.Errorf("open snapshot %s: %w", path, err)
	}
	defer db.Close()
	var mode string
	if err := db.QueryRowContext(ctx, `PRAGMA journal_mode = DELETE`).Scan(&mode); err != nil {
		return fmt.Errorf("snapshot %s out of WAL mode: %w", path, err)
	}
	if mode != "delete" {
		return fmt.Errorf("snapshot %s out of WAL mode: journal mode stayed %s", path, mode)
	}
	return nil
}

// copyPages replaces the database of conn with the one at path, a page at
// a time through SQLite's backup API, in one write transaction: the step
// that copies the last page commits it, and runs only once beforeCommit
// succeeded (otherwise the copy is rolled back). committed says whether
// the copy committed, whatever the error.
func copyPages(
	ctx context.Context,
	conn *sql.Conn,
	path string,
	beforeCommit func() error,
) (committed bool, _ error) {
	err := conn.Raw(func(dc any) error {
		r, ok := dc.(interface {
			NewRestore(string) (*sqlite.Backup, error)
		})
		if !ok {
			return fmt.Errorf("adopt snapshot: the SQLite driver's connection %T has no backup API", dc)
		}
		b, err := r.NewRestore("file:" + path + "?mode=ro")
		if err != nil {
			return fmt.Errorf("adopt snapshot %s: %w", path, err)
		}
		fail := func(err error) error {
			b.Finish()
			return err
		}
		// The first step copies one page and learns the page count.
		pages := int32(1)
		for {
			if err := ctx.Err(); err != nil {
				return fail(err)
			}
			last := pages < 0
			if last {
				if err := beforeCommit(); err != nil {
					return fail(fmt.Errorf("adopt snapshot %s: %w", path, err))
				}
			}
			more, err := b.Step(pages)
			if err != nil {
				return fail(fmt.Errorf("adopt snapshot %s: %w", path, err))
			}
			if adoptStepped != nil {
				adoptStepped(!more)
			}
			if !more {
				committed = true
				if !last {
					// A file of one page, committed already: adopt sees
					// beforeCommit's failure itself.
					_ = beforeCommit()
				}
				break
			}
			pages = -1
			if left := b.Remaining(); left > 1 {
				pages = int32(min(left-1, int(adoptPages)))
			}
		}
		if err := b.Finish(); err != nil {
			return fmt.Errorf("adopt snapshot %s: %w", path, err)
		}
		return nil
	})
	return committed, err
}

// adoptPages is how many pages a step of adopt copies between two looks
// at its context: 64 MiB of 4 KiB pages. adoptStepped, when set, is
// called after each step with whether it committed the copy, and
// adoptDigestFault, when set, is the digest's failure (tests).
var (
	adoptPages       int32 = 16384
	adoptStepped     func(committed bool)
	adoptDigestFault error
	// adoptions counts the restores that adopted a snapshot, and
	// fileAdoptions the snapshots AdoptFile made mirrors (tests).
	adoptions, fileAdoptions atomic.Int64
)

// prepareAdopted makes the snapshot, in tx on its own connection, what
// restoreTables makes of the mirror it copies it into: its events count
// as published, its failures are bounded, its deferred indexes built; its
// replica digest and triggers go, to be set once it is the mirror, unless
// keepDigest.
// The mirror's own tables follow in keepOwnTables.
func (s *Store) prepareAdopted(ctx context.Context, tx *sql.Tx, keepDigest bool) error {
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`INSERT INTO event_publishes (first_seq, last_seq, published_time) SELECT seq, seq, ? FROM outbox
			WHERE seq IN (SELECT seq FROM event_log)`, []any{FormatTime(s.now())}},
		{`DELETE FROM outbox`, nil},
		{`UPDATE crawl_failures SET next_attempt_time = ?1 WHERE next_attempt_time > ?1`,
			[]any{FormatTime(s.now().Add(MaxFailureBackoff))}},
	} {
		if _, err := tx.ExecContext(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("prepare the snapshot: %w", err)
		}
	}
	// A snapshot written during its leader's first sync goes without the
	// deferred indexes, which a follower has from its start.
	if err := s.buildIndexes(ctx, tx); err != nil {
		return err
	}
	if keepDigest {
		return nil
	}
	// Its digest is set when it is the mirror (adopt).
	if _, err := tx.ExecContext(ctx, `DELETE FROM replica_digest`); err != nil {
		return fmt.Errorf("prepare the snapshot: %w", err)
	}
	return dropDigestTriggers(ctx, tx)
}

// keepOwnTables replaces, in tx on the mirror's writer with the snapshot
// attached as snap, the snapshot's copies of the tables a restore leaves
// alone with the mirror's, and its meta with the mirror's, but for the
// snapshot's baseline if the mirror has none and the sequence it covers.
func (s *Store) keepOwnTables(ctx context.Context, tx *sql.Tx, at SnapshotAt) error {
	baseline, _, err := s.restoredBaseline(ctx, tx)
	if err != nil {
		return err
	}
	for _, t := range SnapshotSkippedTables {
		if t == "replica_digest" {
			continue
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM snap.`+t); err != nil {
			return fmt.Errorf("empty the snapshot's %s: %w", t, err)
		}
		if err := copyRows(ctx, tx, t, "main", "snap"); err != nil {
			return err
		}
	}
	return recordRestore(ctx, tx, "snap", at, baseline)
}
