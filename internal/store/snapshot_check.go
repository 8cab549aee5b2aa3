package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// A snapshot comes from the bucket, where any client of the account can
// put one: before a restore copies anything from it, CheckSnapshot makes
// sure it is a sound SQLite file holding exactly the schema this binary's
// migrations create, so that no view or trigger of its own runs during the
// restore (a recursive view grew a follower's WAL to 152 MB in 8 s).

// ErrBadSnapshot is why a snapshot file is refused before its restore.
var ErrBadSnapshot = errors.New("not a sound syncd snapshot")

// maxCheckProblems bounds the lines of quick_check's answer read.
const maxCheckProblems = 10

// CheckSnapshot checks the database at path without trusting it: opened
// read-only, immutable (no journal or WAL beside it is read or made), with
// trusted_schema off, it must pass PRAGMA quick_check, and its schema (the
// tables, indexes, views and triggers of sqlite_schema, with their SQL)
// must equal that of a mirror freshly migrated to one of this binary's
// schema versions. The error wraps ErrBadSnapshot and names the first
// difference.
func CheckSnapshot(ctx context.Context, path string) error { return checkSnapshot(ctx, path, true) }

// checkSnapshot is CheckSnapshot, without the quick_check unless quick.
func checkSnapshot(ctx context.Context, path string, quick bool) (err error) {
	defer func() {
		if err != nil && ctx.Err() != nil {
			// Not the snapshot's failure.
			err = fmt.Errorf("check snapshot: %w", ctx.Err())
		}
	}()
	if strings.ContainsAny(path, "?#") {
		return fmt.Errorf("check snapshot: path %q may not contain '?' or '#'", path)
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&immutable=1&_pragma=trusted_schema(0)&_pragma=query_only(1)")
	if err != nil {
		return fmt.Errorf("open snapshot %s: %w", path, err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	if quick {
		if err := quickCheck(ctx, db); err != nil {
			return err
		}
	}
	have, err := schemaOf(ctx, db)
	if err != nil {
		return fmt.Errorf("%w: read its schema: %v", ErrBadSnapshot, err)
	}
	refs, err := referenceSchemas(ctx)
	if err != nil {
		return fmt.Errorf("check snapshot: %w", err)
	}
	for _, ref := range refs {
		if slices.Equal(withoutDeferred(have, ref), withoutDeferred(ref, ref)) {
			return nil
		}
	}
	latest := refs[len(refs)-1]
	return fmt.Errorf(
		"%w: its schema is not one this syncd creates: %s",
		ErrBadSnapshot,
		schemaDiff(withoutDeferred(have, latest), withoutDeferred(latest, latest)),
	)
}

// withoutDeferred returns objs without the indexes a mirror goes without
// until its first sync's histories are read (deferredIndexes) that are
// exactly as in ref: a leader writes snapshots meanwhile too. Such an
// index with other SQL than ref's stays, and fails the comparison.
func withoutDeferred(objs, ref []schemaObject) []schemaObject {
	return slices.DeleteFunc(slices.Clone(objs), func(o schemaObject) bool {
		if o.typ != "index" || !slices.Contains(ref, o) {
			return false
		}
		return slices.ContainsFunc(deferredIndexes, func(ix struct{ name, create string }) bool { return ix.name == o.name })
	})
}

// quickCheck runs PRAGMA quick_check on db: its only line must be "ok".
func quickCheck(ctx context.Context, db *sql.DB) error {
	lines, err := quickCheckLines(ctx, db)
	if err != nil {
		return fmt.Errorf("%w: quick_check: %v", ErrBadSnapshot, err)
	}
	if len(lines) != 1 || lines[0] != "ok" {
		return fmt.Errorf("%w: quick_check: %s", ErrBadSnapshot, strings.Join(lines, "; "))
	}
	return nil
}

// quickCheckLines returns PRAGMA quick_check's answer, at most
// maxCheckProblems lines.
func quickCheckLines(ctx context.Context, q querier) ([]string, error) {
	var lines []string
	err := queryRows(ctx, q, `PRAGMA quick_check(`+fmt.Sprint(maxCheckProblems)+`)`, nil, func(r *sql.Rows) error {
		var s string
		err := r.Scan(&s)
		lines = append(lines, s)
		return err
	})
	return lines, err
}

// schemaObject is one row of sqlite_schema.
type schemaObject struct{ typ, name, table, sql string }

func (o schemaObject) String() string { return o.typ + " " + o.name + " on " + o.table }

// schemaOf lists db's schema objects in order.
func schemaOf(ctx context.Context, db interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}) ([]schemaObject, error) {
	var out []schemaObject
	err := queryRows(
		ctx,
		db,
		`SELECT type, name, tbl_name, COALESCE(sql, '') FROM sqlite_schema ORDER BY type, name`,
		nil,
		func(r *sql.Rows) error {
			var o schemaObject
			err := r.Scan(&o.typ, &o.name, &o.table, &o.sql)
			out = append(out, o)
			return err
		},
	)
	return out, err
}

// schemaDiff names the first object in one schema and not the other.
func schemaDiff(have, want []schemaObject) string {
	for _, o := range have {
		if !slices.Contains(want, o) {
			return "it has " + o.String() + " that this syncd's does not"
		}
	}
	for _, o := range want {
		if !slices.Contains(have, o) {
			return "it lacks " + o.String()
		}
	}
	return "its objects differ"
}

var (
	refOnce    sync.Once
	refSchemas [][]schemaObject
	refErr     error
)

// referenceSchemas are the schemas of a mirror migrated to each of this
// binary's schema versions, oldest first, with the replica digest's
// triggers from the version that has its table on: what Open makes of a
// new file (a snapshot of an older leader has an older version's). They
// are built once, in memory.
func referenceSchemas(ctx context.Context) ([][]schemaObject, error) {
	refOnce.Do(func() { refSchemas, refErr = buildReferenceSchemas(context.WithoutCancel(ctx)) })
	return refSchemas, refErr
}

func buildReferenceSchemas(ctx context.Context) ([][]schemaObject, error) {
	db, err := sql.Open("sqlite", ":memory:")
	if err != nil {
		return nil, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1) // one connection: one in-memory database
	if _, err := db.ExecContext(ctx, createMigrationsSQL); err != nil {
		return nil, err
	}
	ms, err := migrations()
	if err != nil {
		return nil, err
	}
	var out [][]schemaObject
	for _, m := range ms {
		tx, err := db.BeginTx(ctx, nil)
		err = runTx(tx, err, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			if _, err := tx.ExecContext(
				ctx,
				`INSERT INTO schema_migrations (version, name, applied_time) VALUES (?, ?, '')`,
				m.version,
				m.name,
			); err != nil {
				return err
			}
			var digest int
			if err := tx.QueryRowContext(
				ctx,
				`SELECT count(*) FROM sqlite_schema WHERE type = 'table' AND name = 'replica_digest'`,
			).Scan(
				&digest,
			); err != nil ||
				digest == 0 {
				return err
			}
			return createDigest(ctx, tx)
		})
		if err != nil {
			return nil, fmt.Errorf("reference schema: %w", err)
		}
		objs, err := schemaOf(ctx, db)
		if err != nil {
			return nil, fmt.Errorf("reference schema: %w", err)
		}
		out = append(out, objs)
	}
	return out, nil
}
