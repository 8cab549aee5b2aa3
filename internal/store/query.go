package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
)

// MirrorRead is one read transaction on the read-only pool: the queries of
// one answer of the query service see one state of the mirror, whatever
// commits meanwhile. Every value a caller gives reaches SQL as a bound
// parameter.
type MirrorRead struct {
	tx *sql.Tx
	q  *Queries // nil: statements are parsed at each use
	// missed are the statements q had not prepared yet, to prepare once
	// the transaction has given its connection back.
	missed []string
}

// ReadMirror runs fn in a read transaction on the read-only pool; it never
// waits for the writer (WAL), and it sees the mirror as of its first query.
func (s *Store) ReadMirror(ctx context.Context, fn func(*MirrorRead) error) error {
	return s.readMirror(ctx, nil, fn)
}

func (s *Store) readMirror(ctx context.Context, q *Queries, fn func(*MirrorRead) error) error {
	tx, err := s.r.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin read: %w", err)
	}
	r := &MirrorRead{tx: tx, q: q}
	err = fn(r)
	tx.Rollback()
	if len(r.missed) > 0 {
		q.prepare(ctx, r.missed)
	}
	return err
}

// Queries reads the mirror as ReadMirror does, with each statement
// prepared once per reader connection rather than parsed at every use
// (parsing was a quarter of an answer's CPU).
//
// A statement is prepared on the pool only when the transaction that
// first needed it has given its connection back: preparing takes a
// connection, and a reader waiting for one while holding another could
// wait forever once every reader did so.
type Queries struct {
	s     *Store
	mu    sync.Mutex
	stmts map[string]*sql.Stmt
}

// Queries returns a reader with prepared statements. Its statements are
// closed with the store, or by Close.
func (s *Store) Queries() *Queries { return &Queries{s: s, stmts: map[string]*sql.Stmt{}} }

// ReadMirror runs fn in a read transaction, as Store.ReadMirror.
func (q *Queries) ReadMirror(ctx context.Context, fn func(*MirrorRead) error) error {
	return q.s.readMirror(ctx, q, fn)
}

// Close closes the prepared statements.
func (q *Queries) Close() error {
	q.mu.Lock()
	defer q.mu.Unlock()
	var errs []error
	for k, st := range q.stmts {
		errs = append(errs, st.Close())
		delete(q.stmts, k)
	}
	return errors.Join(errs...)
}

func (q *Queries) lookup(query string) *sql.Stmt {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.stmts[query]
}

// prepare prepares queries on the pool; one that fails is parsed again at
// its next use, and prepared after it.
func (q *Queries) prepare(ctx context.Context, queries []string) {
	for _, query := range queries {
		if q.lookup(query) != nil {
			continue
		}
		st, err := q.s.r.PrepareContext(ctx, query)
		if err != nil {
			continue
		}
		q.mu.Lock()
		if q.stmts[query] == nil {
			q.stmts[query], st = st, nil
		}
		q.mu.Unlock()
		if st != nil {
			st.Close() // another reader prepared it meanwhile
		}
	}
}

// QueryContext runs query in the transaction, as a prepared statement once
// one is.
func (r *MirrorRead) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if r.q != nil {
		if st := r.q.lookup(query); st != nil {
			return r.tx.StmtContext(ctx, st).QueryContext(ctx, args...)
		}
		r.missed = append(r.missed, query)
	}
	return r.tx.QueryContext(ctx, query, args...)
}

// row is a single-row query; Scan reports sql.ErrNoRows as *sql.Row does.
type row struct {
	rows *sql.Rows
	err  error
}

func (w row) Scan(dest ...any) error {
	if w.err != nil {
		return w.err
	}
	defer w.rows.Close()
	if !w.rows.Next() {
		if err := w.rows.Err(); err != nil {
			return err
		}
		return sql.ErrNoRows
	}
	if err := w.rows.Scan(dest...); err != nil {
		return err
	}
	return w.rows.Close()
}

func (r *MirrorRead) queryRow(ctx context.Context, query string, args ...any) row {
	rows, err := r.QueryContext(ctx, query, args...)
	return row{rows, err}
}

// Ready reports whether the mirror has its first complete state: a
// leader's first crawl ended, or a follower applied or restored one
// (meta.baseline_time is set).
func (r *MirrorRead) Ready(ctx context.Context) (bool, error) {
	var n int
	err := r.queryRow(ctx, `SELECT COUNT(*) FROM meta WHERE key = 'baseline_time'`).Scan(&n)
	return n > 0, err
}

// RepoRow is a repo as the query service names it.
type RepoRow struct {
	UID, Name, Path string
	Deleted         time.Time // zero while it exists
}

// Repo finds the repo at registry path (a repo directly under the root
// group: its name), or failing that the repo named so: a live one before
// a deleted one, the most recently deleted first.
func (r *MirrorRead) Repo(ctx context.Context, path string) (RepoRow, bool, error) {
	for _, col := range []string{"path", "name"} {
		var repo RepoRow
		var deleted sql.NullString
		err := r.queryRow(ctx, `SELECT uid, name, path, deleted_time FROM repos WHERE `+col+` = ?
			ORDER BY deleted_time IS NOT NULL, deleted_time DESC, uid LIMIT 1`, path).Scan(
			&repo.UID,
			&repo.Name,
			&repo.Path,
			&deleted,
		)
		if errors.Is(err, sql.ErrNoRows) {
			continue
		}
		if err != nil {
			return RepoRow{}, false, fmt.Errorf("find repo %q: %w", path, err)
		}
		repo.Deleted = parseStored(deleted.String)
		return repo, true, nil
	}
	return RepoRow{}, false, nil
}

// TagRow is a tag as the query service shows it.
type TagRow struct {
	UID, Name, Digest string
	Deprecated        bool
	Updated           time.Time // upstream updateTime; zero when unknown
	Deleted           time.Time // zero while it exists
	// FirstSeen is when this mirror first recorded the tag; HistoryCount
	// how many history records it holds of it.
	FirstSeen    time.Time
	HistoryCount int64
}

const tagRowSelect = `SELECT uid, name, digest, deprecated, update_time, deleted_time, first_seen_time, history_count FROM tags`

func scanTagRow(sc interface{ Scan(...any) error }) (TagRow, error) {
	var t TagRow
	var updated, deleted sql.NullString
	var firstSeen string
	if err := sc.Scan(
		&t.UID,
		&t.Name,
		&t.Digest,
		&t.Deprecated,
		&updated,
		&deleted,
		&firstSeen,
		&t.HistoryCount,
	); err != nil {
		return TagRow{}, err
	}
	t.Updated, t.Deleted, t.FirstSeen = parseStored(updated.String), parseStored(deleted.String), parseStored(firstSeen)
	return t, nil
}

// Tag finds the tag name of the repo repoUID: a live one before a deleted
// one, the most recently deleted first.
func (r *MirrorRead) Tag(ctx context.Context, repoUID, name string) (TagRow, bool, error) {
	t, err := scanTagRow(r.queryRow(ctx, tagRowSelect+` WHERE repo_uid = ? AND name = ?
		ORDER BY deleted_time IS NOT NULL, deleted_time DESC, uid LIMIT 1`, repoUID, name))
	if errors.Is(err, sql.ErrNoRows) {
		return TagRow{}, false, nil
	}
	if err != nil {
		return TagRow{}, false, fmt.Errorf("find tag %q: %w", name, err)
	}
	return t, true, nil
}

// RepoTags returns the live tags of the repo repoUID whose names sort
// after after, by name, at most limit of them.
func (r *MirrorRead) RepoTags(ctx context.Context, repoUID, after string, limit int) ([]TagRow, error) {
	var out []TagRow
	err := queryRows(
		ctx,
		r,
		tagRowSelect+` WHERE repo_uid = ? AND deleted_time IS NULL AND name > ? ORDER BY name LIMIT ?`,
		[]any{repoUID, after, limit},
		func(rows *sql.Rows) error {
			t, err := scanTagRow(rows)
			out = append(out, t)
			return err
		},
	)
	if err != nil {
		return nil, fmt.Errorf("list tags of repo %s: %w", repoUID, err)
	}
	return out, nil
}

// Record is one record of a tag's history: from Time on, the tag pointed
// at Digest. Seq is its position in the tag's history, 0 for the oldest.
type Record struct {
	Seq    int64
	Time   time.Time
	Digest string
}

// RecordAt returns the tag's newest history record at or before at.
func (r *MirrorRead) RecordAt(ctx context.Context, tagUID string, at time.Time) (Record, bool, error) {
	return r.record(ctx, `WHERE tag_uid = ? AND update_time <= ? ORDER BY seq DESC`, tagUID, FormatTime(at))
}

// NextRecord returns the record after the one at seq in the tag's history.
func (r *MirrorRead) NextRecord(ctx context.Context, tagUID string, seq int64) (Record, bool, error) {
	return r.record(ctx, `WHERE tag_uid = ? AND seq > ? ORDER BY seq`, tagUID, seq)
}

// FirstRecord returns the oldest record of the tag's history the mirror
// holds; a follower's history may begin after the tag's own (Seq > 0).
func (r *MirrorRead) FirstRecord(ctx context.Context, tagUID string) (Record, bool, error) {
	return r.record(ctx, `WHERE tag_uid = ? ORDER BY seq`, tagUID)
}

func (r *MirrorRead) record(ctx context.Context, where string, args ...any) (Record, bool, error) {
	var rec Record
	var t string
	err := r.queryRow(ctx, `SELECT seq, update_time, digest FROM tag_history `+where+` LIMIT 1`, args...).
		Scan(&rec.Seq, &t, &rec.Digest)
	if errors.Is(err, sql.ErrNoRows) {
		return Record{}, false, nil
	}
	if err != nil {
		return Record{}, false, fmt.Errorf("read history of tag %v: %w", args[0], err)
	}
	rec.Time = parseStored(t)
	return rec, true, nil
}

// History returns the tag's records after position afterSeq (-1: from the
// first) whose time lies in [from, to) (a zero bound is open), oldest
// first, at most limit of them.
func (r *MirrorRead) History(
	ctx context.Context,
	tagUID string,
	from, to time.Time,
	afterSeq int64,
	limit int,
) ([]Record, error) {
	q, args := `SELECT seq, update_time, digest FROM tag_history WHERE tag_uid = ? AND seq > ?`, []any{tagUID, afterSeq}
	if !from.IsZero() {
		q, args = q+` AND update_time >= ?`, append(args, FormatTime(from))
	}
	if !to.IsZero() {
		q, args = q+` AND update_time < ?`, append(args, FormatTime(to))
	}
	var out []Record
	err := queryRows(ctx, r, q+` ORDER BY seq LIMIT ?`, append(args, limit), func(rows *sql.Rows) error {
		var rec Record
		var t string
		err := rows.Scan(&rec.Seq, &t, &rec.Digest)
		rec.Time = parseStored(t)
		out = append(out, rec)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("read history of tag %s: %w", tagUID, err)
	}
	return out, nil
}

// DigestsWithPrefix returns up to n distinct digests that begin with
// prefix, in the tags' history or as a tag's current digest, sorted.
func (r *MirrorRead) DigestsWithPrefix(ctx context.Context, prefix string, n int) ([]string, error) {
	// A range rather than LIKE, so that the digest indexes answer it.
	hi := prefix + "\U0010FFFF"
	var out []string
	err := queryRows(ctx, r, `SELECT digest FROM (
			SELECT DISTINCT digest FROM tag_history WHERE digest >= ?1 AND digest < ?2
			UNION SELECT DISTINCT digest FROM tags WHERE digest >= ?1 AND digest < ?2)
		ORDER BY digest LIMIT ?3`, []any{prefix, hi, n}, func(rows *sql.Rows) error {
		var d string
		err := rows.Scan(&d)
		out = append(out, d)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("find digests beginning %q: %w", prefix, err)
	}
	return out, nil
}

// Interval is a span of time during which a tag pointed at a digest.
type Interval struct {
	Path, Repo, Tag, TagUID string
	// Seq is the position of the record that began it; -1 when the tag's
	// history in this mirror has no record of it (a follower that knows
	// the tag only from its current state).
	Seq int64
	// From is when it began; zero when unknown (Seq -1). Until is when the
	// next record replaced it, or the tag or its repo was deleted; zero
	// while it lasts.
	From, Until time.Time
	Deprecated  bool
}

// DigestIntervals returns every interval in which a tag pointed at digest,
// by repo path, tag and time, at most limit of them: one per record of
// digest in a tag's history, and one for a live tag that points at it
// with no such record in the mirror.
func (r *MirrorRead) DigestIntervals(ctx context.Context, digest string, limit int) ([]Interval, error) {
	var out []Interval
	err := queryRows(ctx, r, `SELECT path, repo, tag, tag_uid, seq, from_time, until_time, deprecated FROM (
			SELECT r.path, r.name AS repo, t.name AS tag, t.uid AS tag_uid, h.seq, h.update_time AS from_time,
			       COALESCE((SELECT n.update_time FROM tag_history n
			                 WHERE n.tag_uid = h.tag_uid AND n.seq > h.seq ORDER BY n.seq LIMIT 1),
			                t.deleted_time, r.deleted_time) AS until_time,
			       t.deprecated
			FROM tag_history h JOIN tags t ON t.uid = h.tag_uid JOIN repos r ON r.uid = t.repo_uid
			WHERE h.digest = ?1
			UNION ALL
			SELECT r.path, r.name, t.name, t.uid, -1, NULL, NULL, t.deprecated
			FROM tags t JOIN repos r ON r.uid = t.repo_uid
			WHERE t.digest = ?1 AND t.deleted_time IS NULL AND r.deleted_time IS NULL
			  AND NOT EXISTS (SELECT 1 FROM tag_history h WHERE h.tag_uid = t.uid AND h.digest = ?1))
		ORDER BY path, tag, seq LIMIT ?2`, []any{digest, limit}, func(rows *sql.Rows) error {
		var iv Interval
		var from, until sql.NullString
		err := rows.Scan(&iv.Path, &iv.Repo, &iv.Tag, &iv.TagUID, &iv.Seq, &from, &until, &iv.Deprecated)
		iv.From, iv.Until = parseStored(from.String), parseStored(until.String)
		out = append(out, iv)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("find where digest %s has been: %w", digest, err)
	}
	return out, nil
}

// AdvisoryState is an advisory with its lifecycle state, as the
// advisory_states view gives it.
type AdvisoryState struct {
	UID, AdvisoryID, Artifact, ArtifactType, Architecture, Component string
	Aliases                                                          []string
	// State is the kind of its latest step that counts ("" when none
	// does), since StateTime; FixedVersion is set in state "fixed".
	State        string
	StateTime    time.Time
	FixedVersion string
	Withdrawn    time.Time // zero while it stands
}

// AdvisoryKey is what advisories are looked up by.
type AdvisoryKey int

// The keys of AdvisoriesBy.
const (
	ByArtifact AdvisoryKey = iota
	ByAlias
	ByComponent
)

// advisoryWhere is each key's condition; the value is always bound.
var advisoryWhere = map[AdvisoryKey]string{
	ByArtifact:  `artifact_name = ?`,
	ByAlias:     `uid IN (SELECT advisory_uid FROM advisory_aliases WHERE alias = ?)`,
	ByComponent: `component_name = ?`,
}

// AdvisoriesBy returns the advisories whose key is value, standing ones
// only unless withdrawn, by artifact and advisory id, at most limit.
func (r *MirrorRead) AdvisoriesBy(
	ctx context.Context,
	key AdvisoryKey,
	value string,
	withdrawn bool,
	limit int,
) ([]AdvisoryState, error) {
	where, ok := advisoryWhere[key]
	if !ok {
		return nil, fmt.Errorf("unknown advisory key %d", key)
	}
	if !withdrawn {
		where += ` AND deleted_time IS NULL`
	}
	var out []AdvisoryState
	err := queryRows(
		ctx,
		r,
		`SELECT uid, advisory_id, artifact_name, COALESCE(artifact_type, ''), COALESCE(artifact_architecture, ''),
			COALESCE(component_name, ''), COALESCE(aliases, ''), COALESCE(state, ''), state_time, COALESCE(fixed_version, ''),
				deleted_time
		FROM advisory_states WHERE `+where+` ORDER BY artifact_name, advisory_id, uid LIMIT ?`,
		[]any{value, limit},
		func(rows *sql.Rows) error {
			var a AdvisoryState
			var aliases string
			var stateTime, deleted sql.NullString
			err := rows.Scan(&a.UID, &a.AdvisoryID, &a.Artifact, &a.ArtifactType, &a.Architecture, &a.Component, &aliases,
				&a.State, &stateTime, &a.FixedVersion, &deleted)
			a.Aliases = strings.Fields(aliases)
			a.StateTime, a.Withdrawn = parseStored(stateTime.String), parseStored(deleted.String)
			out = append(out, a)
			return err
		},
	)
	if err != nil {
		return nil, fmt.Errorf("find advisories: %w", err)
	}
	return out, nil
}

// parseStored reads a timestamp the mirror stored; "" or an unreadable
// one is the zero time (the mirror writes only FormatTime's).
func parseStored(s string) time.Time {
	t, _ := ParseTime(s)
	return t
}
