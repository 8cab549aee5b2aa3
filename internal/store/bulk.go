package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"
)

// rowsPerStatement is how many rows one multi-row INSERT carries. Around 200
// rows the per-statement cost is amortised (the measured ceiling in the
// architecture notes), and even the widest table stays far below SQLite's
// limit of 32766 bound parameters.
const rowsPerStatement = 200

// uidsPerQuery bounds the IN lists of lookups by uid for the same reason.
const uidsPerQuery = 500

// insertRows writes the rows in args, width values each, with one multi-row
// statement per rowsPerStatement rows: head is "INSERT INTO t (a, b)" and
// tail follows the VALUES list (an ON CONFLICT clause, or ""). It returns
// how many rows SQLite reports changed.
func insertRows(ctx context.Context, tx *sql.Tx, head, tail string, width int, args []any) (int64, error) {
	rows := len(args) / width
	if rows*width != len(args) {
		return 0, fmt.Errorf("insert rows: %d values is not a multiple of %d columns", len(args), width)
	}
	tuple := "(" + placeholders(width) + ")"
	var total int64
	for start := 0; start < rows; start += rowsPerStatement {
		end := min(start+rowsPerStatement, rows)
		var q strings.Builder
		q.Grow(len(head) + len(tail) + (end-start)*(len(tuple)+1) + 16)
		q.WriteString(head)
		q.WriteString(" VALUES ")
		for i := start; i < end; i++ {
			if i > start {
				q.WriteByte(',')
			}
			q.WriteString(tuple)
		}
		q.WriteByte(' ')
		q.WriteString(tail)
		res, err := tx.ExecContext(ctx, q.String(), args[start*width:end*width]...)
		if err != nil {
			return total, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

// queryByUIDs runs query, whose "%s" stands for a list of placeholders, for
// the uids in chunks, calling scan for every row.
func queryByUIDs(ctx context.Context, tx *sql.Tx, query string, uids []string, scan func(*sql.Rows) error) error {
	for start := 0; start < len(uids); start += uidsPerQuery {
		end := min(start+uidsPerQuery, len(uids))
		args := make([]any, end-start)
		for i, u := range uids[start:end] {
			args[i] = u
		}
		if err := queryRows(ctx, tx, fmt.Sprintf(query, placeholders(end-start)), args, scan); err != nil {
			return err
		}
	}
	return nil
}

// queryRows runs query and calls scan for every row.
func queryRows(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, query string, args []any, scan func(*sql.Rows) error) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := scan(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// execByUIDs runs stmt, whose "%s" stands for a list of placeholders, for the
// uids in chunks; lead are arguments that come before the list.
func execByUIDs(ctx context.Context, tx *sql.Tx, stmt string, lead []any, uids []string) error {
	for start := 0; start < len(uids); start += uidsPerQuery {
		end := min(start+uidsPerQuery, len(uids))
		args := append(make([]any, 0, len(lead)+end-start), lead...)
		for _, u := range uids[start:end] {
			args = append(args, u)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf(stmt, placeholders(end-start)), args...); err != nil {
			return err
		}
	}
	return nil
}

// lastByUID drops all but the last occurrence of each uid, keeping order of
// the survivors, so that a page that repeats a resource (a listing that
// shifted under its cursor) records one change for it.
func lastByUID[T any](items []T, uid func(T) string) []T {
	last := make(map[string]int, len(items))
	for i, it := range items {
		last[uid(it)] = i
	}
	if len(last) == len(items) {
		return items
	}
	out := make([]T, 0, len(last))
	for i, it := range items {
		if last[uid(it)] == i {
			out = append(out, it)
		}
	}
	return out
}

func jsonList(v []string) string {
	if len(v) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

// parseList reads a JSON array of strings stored by jsonList.
func parseList(s string) ([]string, error) {
	var v []string
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("decode list %q: %w", s, err)
	}
	if len(v) == 0 {
		return nil, nil
	}
	return v, nil
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}
