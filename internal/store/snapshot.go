package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"
)

// A snapshot is a copy of a mirror that a new follower starts from instead
// of the whole event stream: the leader writes one with Backup, a follower
// loads the newest with Restore and then applies the stream's events after
// the stream sequence the snapshot covers (SnapshotSeqKey).

// SnapshotSeqKey is the meta key of the stream sequence a restored
// snapshot covers: the follower's consumer starts after it.
const SnapshotSeqKey = "snapshot_stream_seq"

// snapshotTables are the tables a restore copies, parents before children.
// They are what a follower builds from the stream (the mirror, its change
// log and the leader's crawl_failures), plus the history the stream never
// carried. The others are the leader's own bookkeeping, which a follower
// does not have: crawl_runs, subscriptions, webhook_deliveries, backfill;
// meta gives only baseline_time; outbox is emptied (see Restore);
// replica_digest is computed from the copied rows.
// TestSnapshotTables fails when a table is in neither list.
var snapshotTables = []string{"repos", "tags", "tag_history", "advisories", "advisory_aliases", "advisory_severities",
	"advisory_events", "tag_matured", "event_log", "event_publishes", "crawl_failures"}

// SnapshotSkippedTables are the tables a restore leaves alone (see
// snapshotTables).
var SnapshotSkippedTables = []string{
	"meta",
	"schema_migrations",
	"outbox",
	"replica_digest",
	"crawl_runs",
	"subscriptions",
	"webhook_deliveries",
	"backfill",
}

// SnapshotTables returns the tables a restore copies.
func SnapshotTables() []string { return append([]string(nil), snapshotTables...) }

// Backup writes a consistent copy of the mirror to path, which must not
// exist or be empty: VACUUM INTO, in one read transaction on a connection
// of its own, so that ingest goes on meanwhile. A caller that creates path
// empty first chooses its mode (SQLite would create it 0644).
func (s *Store) Backup(ctx context.Context, path string) error {
	if strings.ContainsAny(path, "?#") {
		return fmt.Errorf("back up mirror: path %q may not contain '?' or '#'", path)
	}
	conn, err := s.r.Conn(ctx)
	if err != nil {
		return fmt.Errorf("back up mirror: %w", err)
	}
	defer conn.Close()
	// query_only forbids VACUUM INTO; this connection goes back to the pool
	// read-only again.
	if _, err := conn.ExecContext(ctx, `PRAGMA query_only = 0`); err != nil {
		return fmt.Errorf("back up mirror: %w", err)
	}
	defer conn.ExecContext(context.WithoutCancel(ctx), `PRAGMA query_only = 1`)
	if _, err := conn.ExecContext(ctx, `VACUUM INTO ?`, path); err != nil {
		return fmt.Errorf("back up mirror to %s: %w", path, err)
	}
	return nil
}

// SnapshotAt is the place in the event stream a snapshot covers: its
// sequence Seq, of the stream created at StreamCreated (zero: not known,
// a snapshot from before syncd recorded it; see SetStreamIncarnation).
type SnapshotAt struct {
	Seq           uint64
	StreamCreated time.Time
}

// Empty reports whether the mirror holds no resource and no event: a
// mirror a follower may fill from a snapshot.
func (s *Store) Empty(ctx context.Context) (bool, error) { return isEmpty(ctx, s.w) }

// SnapshotSeq is the stream sequence the snapshot this mirror was restored
// from covers; 0 when it was not restored from one.
func (s *Store) SnapshotSeq(ctx context.Context) (uint64, error) {
	v, err := s.Meta(ctx, SnapshotSeqKey)
	if err != nil || v == "" {
		return 0, err
	}
	seq, err := strconv.ParseUint(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("meta %s: %w", SnapshotSeqKey, err)
	}
	return seq, nil
}

// Restore replaces the mirror's contents with the snapshot at path (a
// database Backup wrote, migrated here to this binary's schema first) and
// records at, the place in the stream it covers, in one transaction.
//
// The snapshot's events count as published: those its leader had not
// published yet when it copied its mirror reach the stream after the
// snapshot's sequence (the leader puts the snapshot only once they have:
// cluster.Snapshotter), and the follower skips them there by id, since
// they are in the mirror already; were they left in the
// outbox, a follower that becomes the leader would publish them again, and
// one that never meets them (acknowledged before the snapshot's sequence,
// marked published only after the copy) could never compare a checkpoint.
// Except the events this mirror holds unpublished itself (its replica
// recorded them while it led): a leader that restores a snapshot it wrote
// in its own term, which holds them unpublished too, is the one that was
// to publish them. They stay to publish; marked published, a leader that
// restored its own snapshot after a partition lost 32 of them. Should
// another replica lead instead, the follower forfeits them as before.
//
// The snapshot is not trusted: CheckSnapshot must pass before anything of
// it is opened as a mirror or copied. from says whether it is byte for
// byte a trusted leader's Backup: then an empty mirror adopts it (adopt)
// rather than copying its tables. Restore changes the file at path: it
// migrates it, and adopting prepares it in place.
func (s *Store) Restore(ctx context.Context, path string, at SnapshotAt, from Provenance) error {
	if err := CheckSnapshot(ctx, path); err != nil {
		return err
	}
	// Opening the snapshot as a mirror migrates it, so that its tables have
	// this binary's columns.
	snap, err := Open(ctx, path, Options{Logger: s.log, Readers: 1, Now: s.now})
	if err != nil {
		return fmt.Errorf("open snapshot: %w", err)
	}
	defer snap.Close()
	// The writer's one connection is held throughout: nothing else writes
	// the mirror between the look at whether it is empty and the restore.
	err = s.sortingConn(ctx, func(conn *sql.Conn) error {
		if from == Verified {
			ok, err := adoptable(ctx, conn, snap)
			if err != nil {
				return err
			}
			if ok {
				return s.adopt(ctx, conn, snap, path, at)
			}
		}
		if err := snap.Close(); err != nil {
			return fmt.Errorf("close snapshot: %w", err)
		}
		// The indexes are rebuilt after the copy, with the index build's
		// settings.
		if _, err := conn.ExecContext(ctx, `ATTACH DATABASE ? AS snap`, "file:"+path+"?mode=ro"); err != nil {
			return fmt.Errorf("attach snapshot %s: %w", path, err)
		}
		defer conn.ExecContext(context.WithoutCancel(ctx), `DETACH DATABASE snap`)
		tx, err := conn.BeginTx(ctx, nil)
		return runTx(tx, err, func(tx *sql.Tx) error { return s.restoreTables(ctx, tx, at) })
	})
	if err != nil {
		return fmt.Errorf("restore snapshot: %w", err)
	}
	return nil
}

// Provenance is what is known of where a snapshot file comes from.
type Provenance int

const (
	// Unverified: anyone who may write the snapshot bucket may have made
	// the file. Its tables are copied into the mirror row by row, the
	// mirror's constraints checking every row and its indexes built from
	// them; a file that passes CheckSnapshot (quick_check, the schema) may
	// still hold indexes that disagree with their tables, or rows that
	// break a UNIQUE or foreign key constraint, and a restore that adopted
	// its pages would take them in.
	Unverified Provenance = iota
	// Verified: the file is byte for byte what a trusted leader's Backup
	// wrote (its manifest, signed by a key the follower trusts, gives its
	// SHA-256): the leader's own tables and indexes, which its writer kept
	// together, checking every constraint (VACUUM INTO copies an index's
	// records as they are, so the trust is in the leader's file being
	// sound); an empty mirror adopts such a file's pages.
	Verified
)

// ErrRestoreUnfinished marks a restore that replaced the mirror but could
// not finish after: the mirror is the snapshot's, so trying an older
// snapshot instead is wrong.
var ErrRestoreUnfinished = errors.New("restored, but not finished")

// isEmpty is Empty on q.
func isEmpty(ctx context.Context, q queryer) (bool, error) {
	var n int
	err := q.QueryRowContext(
		ctx,
		`SELECT (SELECT COUNT(*) FROM (SELECT 1 FROM repos LIMIT 1))
		+ (SELECT COUNT(*) FROM (SELECT 1 FROM advisories LIMIT 1))
		+ (SELECT COUNT(*) FROM (SELECT 1 FROM event_log LIMIT 1))`,
	).
		Scan(&n)
	if err != nil {
		return false, fmt.Errorf("check whether the mirror is empty: %w", err)
	}
	return n == 0, nil
}

// restoreTables copies the snapshot's tables over the mirror's, in tx.
// The tables' own indexes are dropped while they are filled and built
// again from a sort after: kept up row by row, the indexes by time and
// digest alone (inserted in no order) made a restore of a million history
// rows several times slower than the copy.
func (s *Store) restoreTables(ctx context.Context, tx *sql.Tx, at SnapshotAt) error {
	// The digest is computed from the copied rows once, not a row at a
	// time: a snapshot's own sums are not taken on trust.
	if err := dropDigestTriggers(ctx, tx); err != nil {
		return err
	}
	// The mirror's own unpublished events go first: the copy's trigger
	// puts every copied event in the outbox, under seqs they may hold.
	// Their ids are kept, to keep those the snapshot holds unpublished
	// too (see Restore).
	for _, q := range []string{
		`DROP TABLE IF EXISTS temp.restore_unpublished`,
		`CREATE TEMP TABLE restore_unpublished (id TEXT PRIMARY KEY)`,
		`INSERT OR IGNORE INTO temp.restore_unpublished (id)
			SELECT e.id FROM main.event_log e JOIN main.outbox o ON o.seq = e.seq`,
		`DELETE FROM main.outbox`,
	} {
		if _, err := tx.ExecContext(ctx, q); err != nil {
			return fmt.Errorf("empty outbox: %w", err)
		}
	}
	for i := len(snapshotTables) - 1; i >= 0; i-- {
		if _, err := tx.ExecContext(ctx, `DELETE FROM main.`+snapshotTables[i]); err != nil {
			return fmt.Errorf("empty %s: %w", snapshotTables[i], err)
		}
	}
	indexes, err := dropIndexes(ctx, tx, snapshotTables)
	if err != nil {
		return err
	}
	for _, t := range snapshotTables {
		if err := copyRows(ctx, tx, t, "snap", "main"); err != nil {
			return err
		}
	}
	for _, ix := range indexes {
		if _, err := tx.ExecContext(ctx, ix.create); err != nil {
			return fmt.Errorf("build index %s: %w", ix.name, err)
		}
	}
	if err := createDigest(ctx, tx); err != nil {
		return err
	}
	// The leader's failures hold back no scope longer than a failure read
	// from the stream would (MaxFailureBackoff).
	limit := FormatTime(s.now().Add(MaxFailureBackoff))
	if _, err := tx.ExecContext(ctx, `UPDATE main.crawl_failures SET next_attempt_time = ?1
		WHERE next_attempt_time > ?1`, limit); err != nil {
		return fmt.Errorf("bound the snapshot's failures: %w", err)
	}
	// event_log's trigger put every copied event in the outbox: none is
	// to be published from here but this mirror's own (see Restore).
	// Those the snapshot's outbox held get a publication of their own, so
	// the events view shows them published.
	const own = `SELECT e.seq FROM main.event_log e JOIN snap.outbox so ON so.seq = e.seq
		WHERE e.id IN (SELECT id FROM temp.restore_unpublished)`
	for _, q := range []struct {
		sql  string
		args []any
	}{
		{`DELETE FROM main.outbox WHERE seq NOT IN (` + own + `)`, nil},
		{`INSERT INTO main.event_publishes (first_seq, last_seq, published_time) SELECT seq, seq, ? FROM snap.outbox
			WHERE seq IN (SELECT seq FROM main.event_log) AND seq NOT IN (SELECT seq FROM main.outbox)`,
			[]any{FormatTime(s.now())}},
		{`DROP TABLE temp.restore_unpublished`, nil},
	} {
		if _, err := tx.ExecContext(ctx, q.sql, q.args...); err != nil {
			return fmt.Errorf("mark the snapshot's events published: %w", err)
		}
	}
	baseline, snapBaseline, err := s.restoredBaseline(ctx, tx)
	if err != nil {
		return err
	}
	if err := recordRestore(ctx, tx, "main", at, baseline); err != nil {
		return err
	}
	if snapBaseline != "" {
		// A mirror past its baseline has the deferred indexes.
		return s.buildIndexes(ctx, tx)
	}
	return nil
}

// restoredBaseline returns, in tx with the snapshot attached as snap, the
// baseline time a restored mirror keeps (its own, or else the snapshot's)
// and the snapshot's.
func (s *Store) restoredBaseline(ctx context.Context, tx *sql.Tx) (keep, snapshot string, err error) {
	if keep, err = s.meta(ctx, tx, "baseline_time"); err != nil {
		return "", "", err
	}
	err = tx.QueryRowContext(ctx, `SELECT value FROM snap.meta WHERE key = 'baseline_time'`).Scan(&snapshot)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", "", fmt.Errorf("read the snapshot's baseline: %w", err)
	}
	if keep == "" {
		keep = snapshot
	}
	return keep, snapshot, nil
}

// recordRestore records in the meta of schema (main or snap) the stream
// sequence a restored snapshot covers and the baseline the mirror keeps
// (none when empty).
func recordRestore(ctx context.Context, tx *sql.Tx, schema string, at SnapshotAt, baseline string) error {
	created := ""
	if !at.StreamCreated.IsZero() {
		created = FormatStreamCreated(at.StreamCreated)
	} else if _, err := tx.ExecContext(ctx, `DELETE FROM `+schema+`.meta WHERE key = ?`, StreamCreatedKey); err != nil {
		// Not known: the stream the follower meets is taken for the
		// snapshot's (SetStreamIncarnation).
		return fmt.Errorf("record %s: %w", StreamCreatedKey, err)
	}
	for k, v := range map[string]string{
		SnapshotSeqKey:   strconv.FormatUint(at.Seq, 10),
		StreamSeqKey:     strconv.FormatUint(at.Seq, 10),
		StreamCreatedKey: created,
		"baseline_time":  baseline,
	} {
		if v == "" {
			continue
		}
		if err := setMeta(ctx, tx, schema, k, v); err != nil {
			return fmt.Errorf("record %s: %w", k, err)
		}
	}
	return nil
}

// copyRows inserts the rows of table in schema from into table in schema
// to, by the columns main's table has (both are this binary's schema).
func copyRows(ctx context.Context, tx *sql.Tx, table, from, to string) error {
	cols, err := columns(ctx, tx, table)
	if err != nil {
		return err
	}
	list := strings.Join(cols, ", ")
	q := `INSERT INTO ` + to + `.` + table + ` (` + list + `) SELECT ` + list + ` FROM ` + from + `.` + table
	if _, err := tx.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("copy %s from %s to %s: %w", table, from, to, err)
	}
	return nil
}

// dropIndexes drops the indexes of tables in the main database that a
// statement created (not those of their UNIQUE and PRIMARY KEY
// constraints), and returns them with the statements that build them.
func dropIndexes(ctx context.Context, tx *sql.Tx, tables []string) ([]struct{ name, create string }, error) {
	rows, err := tx.QueryContext(
		ctx,
		`SELECT name, sql FROM main.sqlite_schema
		WHERE type = 'index' AND sql IS NOT NULL AND tbl_name IN (SELECT value FROM json_each(?)) ORDER BY name`,
		jsonList(tables),
	)
	if err != nil {
		return nil, fmt.Errorf("list indexes: %w", err)
	}
	var out []struct{ name, create string }
	for rows.Next() {
		var ix struct{ name, create string }
		if err := rows.Scan(&ix.name, &ix.create); err != nil {
			rows.Close()
			return nil, err
		}
		out = append(out, ix)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	for _, ix := range out {
		if _, err := tx.ExecContext(ctx, `DROP INDEX main."`+ix.name+`"`); err != nil {
			return nil, fmt.Errorf("drop index %s: %w", ix.name, err)
		}
	}
	return out, nil
}

// columns lists the columns of table in the main database.
func columns(ctx context.Context, tx *sql.Tx, table string) ([]string, error) {
	rows, err := tx.QueryContext(ctx, `SELECT name FROM pragma_table_info(?, 'main')`, table)
	if err != nil {
		return nil, fmt.Errorf("columns of %s: %w", table, err)
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			return nil, err
		}
		cols = append(cols, `"`+c+`"`)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if len(cols) == 0 {
		return nil, fmt.Errorf("no table %s", table)
	}
	return cols, nil
}

// CreateEmpty creates path empty with mode 0600 (for Backup): the copy of
// the mirror is as private as the mirror.
func CreateEmpty(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	return f.Close()
}
