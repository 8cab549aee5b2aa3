package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"
)

// A follower's batch of events is written the way the crawler writes a
// page: a statement parsed anew for every event was a third of a
// follower's time, and single-row statements the rest of it. So the
// upserts of creations and updates, which read nothing back, gather into
// multi-row statements, and the few statements the other events need are
// prepared once per transaction.

// followBatch writes the state of a transaction's followed events. An
// event that reads or changes what an earlier upsert wrote (a move, a
// deletion, a withdrawal, a lifecycle step), or a second upsert of the same
// resource, first flushes what is pending, so every event sees the writes
// of the events before it, as if each were applied on its own.
type followBatch struct {
	s   *Store
	tx  *sql.Tx
	now string

	repos, placeholders, tags, advisories []any
	// details are the pending advisories whose aliases, severities and
	// lifecycle are written with them; detailsKeep those of withdrawals,
	// which keep the lifecycle steps after theirs.
	details, detailsKeep []Advisory
	// pending holds the resources with a pending row, by table and uid.
	pending map[followKey]bool
	// records are the pending tag_history rows, as bulkHistory's values;
	// history holds those the batch inserted, for the replica digest.
	records, history []any
}

type followKey struct{ table, uid string }

func newFollowBatch(s *Store, tx *sql.Tx, now string) *followBatch {
	return &followBatch{s: s, tx: tx, now: now, pending: map[followKey]bool{}}
}

// stmt returns query prepared for the transaction, which stmtCache keeps
// for the rest of it.
func (b *followBatch) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	return b.s.stmts.stmt(ctx, b.tx, query, true)
}

// exec runs query, prepared once per transaction.
func (b *followBatch) exec(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := b.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// queryRow runs query, prepared once per transaction.
func (b *followBatch) queryRow(ctx context.Context, query string, args ...any) (*sql.Row, error) {
	st, err := b.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	return st.QueryRowContext(ctx, args...), nil
}

// add queues row for table's uid, flushing first when uid is pending.
func (b *followBatch) add(ctx context.Context, table, uid string, row []any) error {
	k := followKey{table, uid}
	if b.pending[k] {
		if err := b.flush(ctx); err != nil {
			return err
		}
	}
	b.pending[k] = true
	switch table {
	case "repos":
		b.repos = append(b.repos, row...)
	case "tags":
		b.tags = append(b.tags, row...)
	case "advisories":
		b.advisories = append(b.advisories, row...)
	}
	return nil
}

// upsertRepo queues r as live, with its path (its name, from a leader that
// did not know paths); it revives a tombstone, keeping its count of
// deletions, which the ids of later deletions depend on. Events carry no
// raw JSON, so a raw the row has is kept.
func (b *followBatch) upsertRepo(ctx context.Context, r Repo) error {
	return b.add(ctx, "repos", r.UID, repoRow(r, nil, b.now))
}

// upsertTag queues t as live. The stream has no order across resources, so
// a tag may arrive before its repo: a placeholder row named as the tag says
// keeps the foreign key, and the repo's own event fills it in.
//
// A tag new to the mirror is marked baseline with no history read: the
// stream does not say how many history records the leader holds for it (a
// snapshot carries the tag, not its history), which ResolveHistory settles
// if this replica becomes the leader.
func (b *followBatch) upsertTag(ctx context.Context, t Tag) error {
	if k := (followKey{"placeholders", t.RepoUID}); !b.pending[k] && !b.pending[followKey{"repos", t.RepoUID}] {
		b.pending[k] = true
		b.placeholders = append(b.placeholders, t.RepoUID, t.Repo, scopeOf(t.Path, t.Repo), b.now)
	}
	row := []any{
		t.UID,
		t.RepoUID,
		t.Name,
		t.Digest,
		t.Deprecated,
		jsonList(t.Bundles),
		nullTime(t.CreateTime),
		nullTime(t.UpdateTime),
		b.now,
		true,
		nil,
	}
	return b.add(ctx, "tags", t.UID, row)
}

// upsertAdvisory queues a as live, reviving a tombstone, with its details
// when complete; withdrawal keeps the lifecycle steps after a's.
func (b *followBatch) upsertAdvisory(ctx context.Context, a Advisory, complete, withdrawal bool) error {
	a.DeleteTime = time.Time{} // a withdrawal is the event's, applied after
	if err := b.add(ctx, "advisories", a.UID, advisoryRow(a, nil, b.now, complete)); err != nil {
		return err
	}
	switch {
	case complete && withdrawal:
		b.detailsKeep = append(b.detailsKeep, a)
	case complete:
		b.details = append(b.details, a)
	}
	return nil
}

// recordHistory queues a tag_history row the mirror does not hold, which
// the replica digest then counts; a later event that reads the tag's
// history flushes it first.
func (b *followBatch) recordHistory(tag string, seq int, at, digest string) {
	b.pending[followKey{"history", tag}] = true
	b.records = append(b.records, tag, seq, at, digest)
	b.history = append(b.history, tag, seq, at, digest)
}

// insert writes rows as Store.insertRows does.
func (b *followBatch) insert(ctx context.Context, bk bulk, args []any) (int64, error) {
	return b.s.insertRows(ctx, b.tx, bk, args)
}

// placeholderColumns is how many values a placeholder repo row takes.
const placeholderColumns = 4

// flush writes what is pending: repos before the placeholders and tags
// that refer to them.
func (b *followBatch) flush(ctx context.Context) error {
	if len(b.pending) == 0 {
		return nil
	}
	if _, err := b.insert(ctx, bulkRepos, b.repos); err != nil {
		return fmt.Errorf("upsert repos: %w", err)
	}
	for start := 0; start < len(b.placeholders); start += placeholderColumns * rowsPerStatement {
		end := min(start+placeholderColumns*rowsPerStatement, len(b.placeholders))
		n := (end - start) / placeholderColumns
		q := `INSERT INTO repos (uid, name, path, first_seen_time) VALUES ` +
			strings.TrimSuffix(strings.Repeat("(?, ?, ?, ?),", n), ",") + ` ON CONFLICT(uid) DO NOTHING`
		if _, err := b.exec(ctx, q, b.placeholders[start:end]...); err != nil {
			return fmt.Errorf("placeholder repos: %w", err)
		}
	}
	if _, err := b.insert(ctx, bulkTags, b.tags); err != nil {
		return fmt.Errorf("upsert tags: %w", err)
	}
	if _, err := b.insert(ctx, bulkAdvisories, b.advisories); err != nil {
		return fmt.Errorf("upsert advisories: %w", err)
	}
	if _, err := b.insert(ctx, bulkHistory, b.records); err != nil {
		return fmt.Errorf("insert history: %w", err)
	}
	if err := b.s.writeAdvisoryDetails(ctx, b.tx, b.details, false); err != nil {
		return fmt.Errorf("upsert advisories: %w", err)
	}
	if err := b.s.writeAdvisoryDetails(ctx, b.tx, b.detailsKeep, true); err != nil {
		return fmt.Errorf("upsert advisories: %w", err)
	}
	b.repos, b.placeholders, b.tags, b.advisories = b.repos[:0], b.placeholders[:0], b.tags[:0], b.advisories[:0]
	b.records = b.records[:0]
	b.details, b.detailsKeep = b.details[:0], b.detailsKeep[:0]
	clear(b.pending)
	return nil
}
