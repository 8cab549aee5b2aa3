package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"

	"modernc.org/sqlite"
)

// The replica digest proves that two mirrors hold the same replicated
// state (what a follower learns from the stream): for each table, the sum
// modulo 2^64 of a hash of every row's replicated columns, and the row
// count. A sum is independent of the order rows were written in, so a
// follower that applied the stream in batches and a leader that crawled
// agree exactly when their rows agree; and it is kept by triggers in the
// transaction that writes the rows, so reading it costs one small query,
// never a scan, and covers every writer of the file, whatever its path
// (a crawl, a followed event, a restore, or an UPDATE behind syncd's back
// through the same driver).
//
// The columns are those every replica writes the same way. Left out: what
// says when or how this replica learned a row (first_seen_time, raw JSON,
// bookmarks), the times a follower takes from the event rather than the
// listing, and a tombstone's time (only that it is one, and how many
// deletions there were).

// digestTable is one table the digest covers and the columns it hashes.
type digestTable struct {
	table string
	cols  []string
	// countsInserts: the code that inserts rows adds their hashes itself,
	// a statement at a time (see addHistoryDigest), so the table has no
	// insert trigger. A trigger costs 5–7 µs a row, most of a history row's
	// cost, and the history is a million rows; updates and deletions of it
	// (none in syncd's own writing) still have theirs.
	countsInserts bool
}

// digestTables are the tables of the replicated state, in the order a
// divergence is reported in. A column written "x IS NOT NULL" hashes
// whether x is set.
var digestTables = []digestTable{
	{"repos", []string{"uid", "name", "description", "deleted_time IS NOT NULL", "deletions"}, false},
	{"tags", []string{"uid", "repo_uid", "name", "digest", "deprecated", "deleted_time IS NOT NULL", "deletions"}, false},
	{"tag_history", []string{"tag_uid", "seq", "update_time", "digest"}, true},
	{"advisories", []string{"uid", "advisory_id", "artifact_name", "deleted_time IS NOT NULL", "deletions"}, false},
	{"advisory_aliases", []string{"advisory_uid", "seq", "alias"}, false},
	{"advisory_events", []string{"advisory_uid", "seq", "uid", "type", "review_state", "fixed_version"}, false},
	{"tag_matured", []string{"tag_uid", "age", "seq", "update_time", "digest"}, false},
}

// digestVersion names the triggers; a change of the columns is a new
// version, whose triggers replace the old ones and recompute the sums.
const digestVersion = "v1"

func init() {
	sqlite.MustRegisterDeterministicScalarFunction("syncd_row_hash", -1, rowHashFunc)
	sqlite.MustRegisterDeterministicScalarFunction("syncd_digest_add", 3, digestAddFunc)
	if err := sqlite.RegisterFunction("syncd_digest_sum", &sqlite.FunctionImpl{
		NArgs:         1,
		Deterministic: true,
		MakeAggregate: func(sqlite.FunctionContext) (sqlite.AggregateFunction, error) { return &digestSum{}, nil },
	}); err != nil {
		panic(err)
	}
}

// rowHashFunc is syncd_row_hash(values…): the first 64 bits of a SHA-256
// of the values, each encoded with its type and length, so that no two
// different rows encode alike.
func rowHashFunc(_ *sqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
	sum, err := rowHash(args)
	return int64(sum), err
}

// rowHash hashes a row's values as syncd_row_hash does.
func rowHash[V any](args []V) (uint64, error) {
	h := sha256.New()
	var buf [9]byte
	for _, a := range args {
		switch v := any(a).(type) {
		case nil:
			h.Write([]byte{0})
		case int:
			buf[0] = 1
			binary.BigEndian.PutUint64(buf[1:], uint64(v))
			h.Write(buf[:])
		case int64:
			buf[0] = 1
			binary.BigEndian.PutUint64(buf[1:], uint64(v))
			h.Write(buf[:])
		case float64:
			buf[0] = 2
			binary.BigEndian.PutUint64(buf[1:], math.Float64bits(v))
			h.Write(buf[:])
		case string:
			buf[0] = 3
			binary.BigEndian.PutUint64(buf[1:], uint64(len(v)))
			h.Write(buf[:])
			h.Write([]byte(v))
		case []byte:
			buf[0] = 4
			binary.BigEndian.PutUint64(buf[1:], uint64(len(v)))
			h.Write(buf[:])
			h.Write(v)
		default:
			return 0, fmt.Errorf("syncd_row_hash: unexpected %T", a)
		}
	}
	var sum [sha256.Size]byte
	return binary.BigEndian.Uint64(h.Sum(sum[:0])), nil
}

// historyDigest is the hashes' sum and the count of tag_history rows given
// as bulkHistory's values.
func historyDigest(args []any) (uint64, int64, error) {
	var sum uint64
	row := make([]any, 0, 1+historyColumns)
	for i := 0; i+historyColumns <= len(args); i += historyColumns {
		row = append(append(row[:0], "tag_history"), args[i:i+historyColumns]...)
		h, err := rowHash(row)
		if err != nil {
			return 0, 0, err
		}
		sum += h
	}
	return sum, int64(len(args) / historyColumns), nil
}

// addHistoryDigest adds tag_history rows just inserted, given as
// bulkHistory's values, to the digest.
func addHistoryDigest(ctx context.Context, tx *sql.Tx, args []any) error {
	if len(args) == 0 {
		return nil
	}
	sum, n, err := historyDigest(args)
	if err != nil {
		return err
	}
	_, err = tx.ExecContext(
		ctx,
		`UPDATE replica_digest SET sum = syncd_digest_add(sum, ?, 0), rows = rows + ? WHERE name = 'tag_history'`,
		int64(sum),
		n,
	)
	if err != nil {
		return fmt.Errorf("add %d history rows to the replica digest: %w", n, err)
	}
	return nil
}

// digestAddFunc is syncd_digest_add(sum, plus, minus): sum + plus - minus
// modulo 2^64 (SQLite's own integers turn into floats on overflow).
func digestAddFunc(_ *sqlite.FunctionContext, args []driver.Value) (driver.Value, error) {
	var v [3]uint64
	for i, a := range args {
		n, ok := a.(int64)
		if !ok && a != nil {
			return nil, fmt.Errorf("syncd_digest_add: argument %d is %T, not an integer", i+1, a)
		}
		v[i] = uint64(n)
	}
	return int64(v[0] + v[1] - v[2]), nil
}

// digestSum is the aggregate syncd_digest_sum(hash): the wrapping sum of
// the hashes, for a digest computed from the rows themselves.
type digestSum struct{ sum uint64 }

func (d *digestSum) Step(_ *sqlite.FunctionContext, args []driver.Value) error {
	n, _ := args[0].(int64)
	d.sum += uint64(n)
	return nil
}

func (d *digestSum) WindowInverse(_ *sqlite.FunctionContext, args []driver.Value) error {
	n, _ := args[0].(int64)
	d.sum -= uint64(n)
	return nil
}

func (d *digestSum) WindowValue(*sqlite.FunctionContext) (driver.Value, error) {
	return int64(d.sum), nil
}

func (d *digestSum) Final(*sqlite.FunctionContext) {}

// hashExpr is the syncd_row_hash call over t's columns of the row named by
// prefix ("NEW.", "OLD." or "").
func (t digestTable) hashExpr(prefix string) string {
	parts := []string{"'" + t.table + "'"}
	for _, c := range t.cols {
		parts = append(parts, "("+prefix+c+")")
	}
	return "syncd_row_hash(" + strings.Join(parts, ", ") + ")"
}

// changed is the condition under which an UPDATE changes t's hash.
func (t digestTable) changed() string {
	var conds []string
	for _, c := range t.cols {
		col, _, _ := strings.Cut(c, " ")
		conds = append(conds, "NEW."+col+" IS NOT OLD."+col)
	}
	return strings.Join(conds, " OR ")
}

func (t digestTable) trigger(kind string) string {
	return "replica_digest_" + digestVersion + "_" + t.table + "_" + kind
}

// triggers are the statements creating t's triggers.
func (t digestTable) triggers() []string {
	set := func(sum, rows string) string {
		return "UPDATE replica_digest SET sum = " + sum + ", rows = " + rows + " WHERE name = '" + t.table + "';"
	}
	var out []string
	if !t.countsInserts {
		out = append(out, "CREATE TRIGGER "+t.trigger("insert")+" AFTER INSERT ON "+t.table+" BEGIN "+
			set("syncd_digest_add(sum, "+t.hashExpr("NEW.")+", 0)", "rows + 1")+" END")
	}
	return append(out,
		"CREATE TRIGGER "+t.trigger("delete")+" AFTER DELETE ON "+t.table+" BEGIN "+
			set("syncd_digest_add(sum, 0, "+t.hashExpr("OLD.")+")", "rows - 1")+" END",
		"CREATE TRIGGER "+t.trigger("update")+" AFTER UPDATE ON "+t.table+" WHEN "+t.changed()+" BEGIN "+
			set("syncd_digest_add(sum, "+t.hashExpr("NEW.")+", "+t.hashExpr("OLD.")+")", "rows")+" END",
	)
}

// ensureDigest creates the digest's triggers when the mirror lacks them
// (a new mirror, one from before them, or another version's), computing the
// sums from the rows in the same transaction.
func (s *Store) ensureDigest(ctx context.Context) error {
	var have int
	err := s.w.QueryRowContext(ctx, `SELECT count(*) FROM sqlite_schema WHERE type = 'trigger' AND name LIKE ?`,
		"replica_digest_"+digestVersion+"_%").Scan(&have)
	if err != nil {
		return fmt.Errorf("read the replica digest's triggers: %w", err)
	}
	want := 0
	for _, t := range digestTables {
		want += len(t.triggers())
	}
	if have == want {
		return nil
	}
	return s.tx(ctx, func(tx *sql.Tx) error { return createDigest(ctx, tx) })
}

// createDigest drops every digest trigger, computes the sums from the
// rows, and creates this version's triggers, in tx. Tables the file does
// not have are left out: a mirror migrated to an older version, as the
// snapshot check's reference of that version is (the mirror syncd opens
// is always migrated to the last).
func createDigest(ctx context.Context, tx *sql.Tx) error {
	if err := dropDigestTriggers(ctx, tx); err != nil {
		return err
	}
	tables, err := presentDigestTables(ctx, tx)
	if err != nil {
		return err
	}
	if err := recomputeDigest(ctx, tx, tables); err != nil {
		return err
	}
	for _, t := range tables {
		for _, q := range t.triggers() {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("create the replica digest's triggers on %s: %w", t.table, err)
			}
		}
	}
	return nil
}

// digestOf computes the digest of the mirror file at path (this binary's
// schema) from its rows, read-only.
func digestOf(ctx context.Context, path string) (ReplicaDigest, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=query_only(1)")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	return computeDigest(ctx, db)
}

// computeDigest computes the digest of the mirror q reads from its rows.
func computeDigest(ctx context.Context, q queryer) (ReplicaDigest, error) {
	out := make(ReplicaDigest, 0, len(digestTables))
	for _, t := range digestTables {
		var sum int64
		d := TableDigest{Table: t.table}
		if err := q.QueryRowContext(
			ctx,
			`SELECT COALESCE(syncd_digest_sum(`+t.hashExpr("")+`), 0), count(*) FROM main.`+t.table,
		).Scan(&sum, &d.Rows); err != nil {
			return nil, fmt.Errorf("compute the replica digest of %s: %w", t.table, err)
		}
		d.Sum = uint64(sum)
		out = append(out, d)
	}
	return out, nil
}

// setDigest records d, computed from the rows of the mirror tx writes,
// and creates the digest's triggers, which must be missing (as
// dropDigestTriggers leaves them).
func setDigest(ctx context.Context, tx *sql.Tx, d ReplicaDigest) error {
	for _, t := range d {
		if _, err := tx.ExecContext(
			ctx,
			`INSERT INTO main.replica_digest (name, sum, rows) VALUES (?, ?, ?)
			ON CONFLICT(name) DO UPDATE SET sum = excluded.sum, rows = excluded.rows`,
			t.Table,
			int64(t.Sum),
			t.Rows,
		); err != nil {
			return fmt.Errorf("record the replica digest of %s: %w", t.Table, err)
		}
	}
	for _, t := range digestTables {
		for _, q := range t.triggers() {
			if _, err := tx.ExecContext(ctx, q); err != nil {
				return fmt.Errorf("create the replica digest's triggers on %s: %w", t.table, err)
			}
		}
	}
	return nil
}

// presentDigestTables are the digest's tables the file has.
func presentDigestTables(ctx context.Context, tx *sql.Tx) ([]digestTable, error) {
	var out []digestTable
	for _, t := range digestTables {
		var n int
		if err := tx.QueryRowContext(
			ctx,
			`SELECT count(*) FROM main.sqlite_schema WHERE type = 'table' AND name = ?`,
			t.table,
		).Scan(
			&n,
		); err != nil {
			return nil, fmt.Errorf("read the schema: %w", err)
		}
		if n > 0 {
			out = append(out, t)
		}
	}
	return out, nil
}

// dropDigestTriggers drops the digest's triggers of any version: a bulk
// copy (a restore) runs without them and recomputes the sums after.
func dropDigestTriggers(ctx context.Context, tx *sql.Tx) error {
	var names []string
	err := queryRows(
		ctx,
		tx,
		`SELECT name FROM main.sqlite_schema WHERE type = 'trigger' AND name LIKE 'replica_digest_%'`,
		nil,
		func(r *sql.Rows) error {
			var n string
			err := r.Scan(&n)
			names = append(names, n)
			return err
		},
	)
	if err != nil {
		return fmt.Errorf("read the replica digest's triggers: %w", err)
	}
	for _, n := range names {
		if _, err := tx.ExecContext(ctx, `DROP TRIGGER main.`+n); err != nil {
			return fmt.Errorf("drop trigger %s: %w", n, err)
		}
	}
	return nil
}

// recomputeDigest sets the sum and count of each of tables from its rows.
func recomputeDigest(ctx context.Context, tx *sql.Tx, tables []digestTable) error {
	for _, t := range tables {
		q := `INSERT INTO main.replica_digest (name, sum, rows) SELECT ?, COALESCE(syncd_digest_sum(` + t.hashExpr(
			"",
		) + `), 0), count(*) FROM main.` + t.table +
			` WHERE true ON CONFLICT(name) DO UPDATE SET sum = excluded.sum, rows = excluded.rows`
		if _, err := tx.ExecContext(ctx, q, t.table); err != nil {
			return fmt.Errorf("compute the replica digest of %s: %w", t.table, err)
		}
	}
	return nil
}

// TableDigest is one table's part of a ReplicaDigest.
type TableDigest struct {
	Table string `json:"table"`
	Sum   uint64 `json:"sum"`
	Rows  int64  `json:"rows"`
}

func (d TableDigest) String() string {
	return d.Table + ":" + strconv.FormatInt(d.Rows, 10) + ":" + strconv.FormatUint(d.Sum, 16)
}

// ReplicaDigest is the digest of a mirror's replicated state, a table at a
// time in a fixed order.
type ReplicaDigest []TableDigest

// Diff names the first table whose digest differs from other's, and ""
// when the two are equal.
func (d ReplicaDigest) Diff(other ReplicaDigest) string {
	theirs := make(map[string]TableDigest, len(other))
	for _, t := range other {
		theirs[t.Table] = t
	}
	for _, t := range d {
		// A table the other side does not list (a syncd from before it)
		// is as good as empty there.
		o, ok := theirs[t.Table]
		if !ok {
			o = TableDigest{Table: t.Table}
		}
		if o != t {
			return fmt.Sprintf("%s (%d rows here, %d there)", t.Table, t.Rows, o.Rows)
		}
		delete(theirs, t.Table)
	}
	for name, o := range theirs {
		if o.Rows != 0 || o.Sum != 0 {
			return name + " (only there)"
		}
	}
	return ""
}

// ReplicaDigest reads the digest of the mirror's replicated state: one
// small query, whatever the mirror's size.
func (s *Store) ReplicaDigest(ctx context.Context) (ReplicaDigest, error) {
	return readDigest(ctx, s.r)
}

type querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

func readDigest(ctx context.Context, q querier) (ReplicaDigest, error) {
	byName := map[string]TableDigest{}
	rows, err := q.QueryContext(ctx, `SELECT name, sum, rows FROM replica_digest`)
	if err != nil {
		return nil, fmt.Errorf("read the replica digest: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var t TableDigest
		var sum int64
		if err := rows.Scan(&t.Table, &sum, &t.Rows); err != nil {
			return nil, fmt.Errorf("read the replica digest: %w", err)
		}
		t.Sum = uint64(sum)
		byName[t.Table] = t
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("read the replica digest: %w", err)
	}
	out := make(ReplicaDigest, 0, len(digestTables))
	for _, t := range digestTables {
		out = append(out, byName[t.table])
		out[len(out)-1].Table = t.table
	}
	return out, nil
}

// ComputeReplicaDigest computes the digest from the rows themselves (a
// scan of every table): what the maintained one must equal.
func (s *Store) ComputeReplicaDigest(ctx context.Context) (ReplicaDigest, error) {
	return computeDigest(ctx, s.r)
}
