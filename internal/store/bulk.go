package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"math/bits"
	"strings"
	"unicode/utf8"
)

// rowsPerStatement is how many rows one multi-row INSERT carries. Around 200
// rows the per-statement cost is amortised (the measured ceiling in the
// architecture notes), and even the widest table stays far below SQLite's
// limit of 32766 bound parameters.
const rowsPerStatement = 200

// uidsPerQuery bounds the IN lists of lookups by uid for the same reason.
const uidsPerQuery = 500

// bulk names a multi-row write. Each has a full-size statement (of
// rowsPerStatement rows) prepared on the writer when the store opens:
// parsing a statement with a thousand placeholders for every 200 rows was a
// tenth of ingest's CPU time, and preparing inside a transaction would need
// a second writer connection, which the store does not have.
type bulk int

const (
	bulkRepos bulk = iota
	bulkTags
	bulkAdvisories
	bulkAdvisoryAliases
	bulkAdvisorySeverities
	bulkAdvisoryEvents
	bulkHistory
	bulkEvents
	bulkFollowedEvents
	numBulk
)

// statement returns the parts of b's INSERT: head is "INSERT INTO t (a, b)",
// tail follows the VALUES list (an ON CONFLICT clause, or ""), and width is
// how many values a row takes.
func (b bulk) statement() (head, tail string, width int) {
	switch b {
	case bulkRepos:
		// raw is kept when a write has none (a caller that did not receive it).
		return `INSERT INTO repos (uid, name, path, description, catalog_tier, aliases, active_tags, bundles, create_time,
			update_time, first_seen_time, raw)`,
			`ON CONFLICT(uid) DO UPDATE SET name=excluded.name, path=excluded.path, description=excluded.description,
				catalog_tier=excluded.catalog_tier,
				aliases=excluded.aliases, active_tags=excluded.active_tags, bundles=excluded.bundles,
					create_time=excluded.create_time,
				update_time=excluded.update_time, deleted_time=NULL, raw=COALESCE(excluded.raw, raw)`, repoColumns
	case bulkTags:
		return `INSERT INTO tags (uid, repo_uid, name, digest, deprecated, bundles, create_time, update_time,
			first_seen_time, baseline, raw)`,
			`ON CONFLICT(uid) DO UPDATE SET repo_uid=excluded.repo_uid, name=excluded.name, digest=excluded.digest,
				deprecated=excluded.deprecated,
				bundles=excluded.bundles, create_time=excluded.create_time, update_time=excluded.update_time, deleted_time=NULL,
				raw=COALESCE(excluded.raw, raw)`, tagColumns
	case bulkAdvisories:
		// An advisory written with a deleteTime is a tombstone; one that
		// was live counts a withdrawal. SET sees the row as it was.
		return `INSERT INTO advisories (uid, advisory_id, artifact_name, create_time, update_time, first_seen_time, raw,
			deleted_time,
				author, artifact_type, artifact_architecture, component_name, component_location, component_type,
					legacy_advisory_id, complete)`,
			`ON CONFLICT(uid) DO UPDATE SET advisory_id=excluded.advisory_id, artifact_name=excluded.artifact_name,
				create_time=excluded.create_time, update_time=excluded.update_time, raw=COALESCE(excluded.raw, raw),
				deletions=deletions + (excluded.deleted_time IS NOT NULL AND deleted_time IS NULL),
					deleted_time=excluded.deleted_time,
				author=excluded.author, artifact_type=excluded.artifact_type, artifact_architecture=excluded.artifact_architecture,
				component_name=excluded.component_name, component_location=excluded.component_location,
				component_type=excluded.component_type, legacy_advisory_id=excluded.legacy_advisory_id,
					complete=excluded.complete`, advisoryColumns
	case bulkAdvisoryAliases:
		return `INSERT INTO advisory_aliases (advisory_uid, seq, alias)`, "", 3
	case bulkAdvisorySeverities:
		return `INSERT INTO advisory_severities (advisory_uid, seq, type, score, base_score, rating)`, "", 6
	case bulkAdvisoryEvents:
		return `INSERT INTO advisory_events (advisory_uid, seq, uid, type, create_time, author, reviewer, review_state,
			issue, note,
				fixed_version, patched_versions, false_positive_type, detection_type, findings, details)`, "", advisoryEventColumns
	case bulkHistory:
		return `INSERT INTO tag_history (tag_uid, seq, update_time, digest)`, "", historyColumns
	case bulkEvents:
		return `INSERT INTO event_log (id, type, resource, action, scope, subject, time, data, created_time)`,
			`ON CONFLICT(id) DO NOTHING`, eventColumns
	case bulkFollowedEvents:
		return `INSERT INTO event_log (id, type, resource, action, scope, subject, time, data, created_time, stream_seq)`,
			`ON CONFLICT(id) DO NOTHING`, eventColumns + 1
	}
	panic(fmt.Sprintf("unknown bulk statement %d", b))
}

// bulkSQL returns b's statement for rows rows.
func bulkSQL(b bulk, rows int) string {
	head, tail, width := b.statement()
	tuple := "(" + placeholders(width) + ")"
	var q strings.Builder
	q.Grow(len(head) + len(tail) + rows*(len(tuple)+1) + 16)
	q.WriteString(head)
	q.WriteString(" VALUES ")
	for i := range rows {
		if i > 0 {
			q.WriteByte(',')
		}
		q.WriteString(tuple)
	}
	q.WriteByte(' ')
	q.WriteString(tail)
	return q.String()
}

// prepareBulk prepares the full-size statement of every bulk write.
func (s *Store) prepareBulk(ctx context.Context) error {
	for b := range numBulk {
		stmt, err := s.w.PrepareContext(ctx, bulkSQL(b, rowsPerStatement))
		if err != nil {
			return fmt.Errorf("prepare bulk statement %d: %w", b, err)
		}
		s.bulk[b] = stmt
	}
	return nil
}

// insertRows writes the rows in args, each as many values as b's width,
// with one multi-row statement per rowsPerStatement rows, and returns how
// many rows SQLite reports changed. The shorter rest is insertRest's.
func (s *Store) insertRows(ctx context.Context, tx *sql.Tx, b bulk, args []any) (int64, error) {
	_, _, width := b.statement()
	rows := len(args) / width
	if rows*width != len(args) {
		return 0, fmt.Errorf("insert rows: %d values is not a multiple of %d columns", len(args), width)
	}
	var total int64
	for start := 0; start < rows; start += rowsPerStatement {
		end := min(start+rowsPerStatement, rows)
		n, err := s.insertChunk(ctx, tx, b, args[start*width:end*width])
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
}

func (s *Store) insertChunk(ctx context.Context, tx *sql.Tx, b bulk, args []any) (int64, error) {
	_, _, width := b.statement()
	if len(args) == rowsPerStatement*width {
		return rowsAffected(tx.StmtContext(ctx, s.bulk[b]).ExecContext(ctx, args...))
	}
	return s.insertRest(ctx, tx, b, args)
}

// insertRest writes fewer than rowsPerStatement rows of b. A VALUES list
// of each length is a statement of its own, and parsing those was a third
// of a follower's CPU, which writes a few rows of each kind at a time: so
// the rows go in statements of a power of two rows each (13 = 8 + 4 + 1),
// eight texts a kind, which the writer keeps prepared (stmtCache). Until
// it has all those a write needs, the write is one statement of its own
// length, prepared once in the transaction.
func (s *Store) insertRest(ctx context.Context, tx *sql.Tx, b bulk, args []any) (int64, error) {
	_, _, width := b.statement()
	rows := len(args) / width
	ready := true
	for n := rows; n > 0; n &= n - 1 {
		ready = s.stmts.get(bulkText(b, 1<<(bits.Len(uint(n))-1))) != nil && ready
	}
	if !ready {
		st, err := s.stmts.stmt(ctx, tx, bulkSQL(b, rows), false)
		if err != nil {
			return 0, err
		}
		return rowsAffected(st.ExecContext(ctx, args...))
	}
	var total int64
	for start := 0; start < rows; {
		n := 1 << (bits.Len(uint(rows-start)) - 1)
		st, err := s.stmts.stmt(ctx, tx, bulkText(b, n), true)
		if err != nil {
			return total, err
		}
		affected, err := rowsAffected(st.ExecContext(ctx, args[start*width:(start+n)*width]...))
		if err != nil {
			return total, err
		}
		total += affected
		start += n
	}
	return total, nil
}

func rowsAffected(res sql.Result, err error) (int64, error) {
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// bulkTexts are bulkSQL(b, 1<<i), built once.
var bulkTexts = func() (t [numBulk][8]string) {
	for b := range numBulk {
		for i := range t[b] {
			t[b][i] = bulkSQL(b, 1<<i)
		}
	}
	return t
}()

// bulkText is b's statement for n rows, a power of two below 256.
func bulkText(b bulk, n int) string { return bulkTexts[b][bits.Len(uint(n))-1] }

// queryByUIDs runs query, whose "%s" stands for the list of uids in an IN
// clause, for the uids in chunks, calling scan for every row. The list
// goes as one JSON array, so that the statement's text is the same for any
// number of uids.
func queryByUIDs(ctx context.Context, tx *sql.Tx, query string, uids []string, scan func(*sql.Rows) error) error {
	for start := 0; start < len(uids); start += uidsPerQuery {
		list, args := uidList(uids[start:min(start+uidsPerQuery, len(uids))])
		if err := queryRows(ctx, tx, fmt.Sprintf(query, list), args, scan); err != nil {
			return err
		}
	}
	return nil
}

// uidList is the SQL of an IN list of uids and its arguments: one JSON
// array, or, for a uid JSON would alter (not UTF-8), placeholders.
func uidList(uids []string) (string, []any) {
	args := make([]any, len(uids))
	valid := true
	for i, u := range uids {
		args[i] = u
		valid = valid && utf8.ValidString(u)
	}
	if !valid {
		return placeholders(len(uids)), args
	}
	list, _ := json.Marshal(uids) // strings that are UTF-8 always encode
	return "SELECT value FROM json_each(?)", []any{string(list)}
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

// execByUIDs runs stmt, whose "%s" stands for the list of uids in an IN
// clause (as in queryByUIDs), for the uids in chunks; lead are arguments
// that come before the list.
func (s *Store) execByUIDs(ctx context.Context, tx *sql.Tx, stmt string, lead []any, uids []string) error {
	for start := 0; start < len(uids); start += uidsPerQuery {
		list, args := uidList(uids[start:min(start+uidsPerQuery, len(uids))])
		if _, err := s.exec(ctx, tx, fmt.Sprintf(stmt, list), append(lead[:len(lead):len(lead)], args...)...); err != nil {
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

// rawJSON is how a resource's raw JSON is stored: compacted, since the
// platform's encoder varies its whitespace and a byte-for-byte comparison
// must not see that as a change; nil (SQL NULL) when there is none.
func rawJSON(raw json.RawMessage) (any, error) {
	if len(raw) == 0 {
		return nil, nil
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return nil, fmt.Errorf("raw JSON: %w", err)
	}
	return b.String(), nil
}

// rawChanged reports whether raw (from rawJSON) differs from the stored
// value; no raw is never a change, since the write keeps the stored one.
func rawChanged(stored string, raw any) bool {
	s, ok := raw.(string)
	return ok && s != stored
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
