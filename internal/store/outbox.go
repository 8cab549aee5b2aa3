package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Event is a row of the events view (event_log).
type Event struct {
	Seq      int64
	ID       string
	Type     string // <resource>.<action>
	Resource string
	Action   string
	Scope    string
	Subject  string
	Time     time.Time
	Data     json.RawMessage
	// CreatedTime is when syncd committed the event.
	CreatedTime time.Time
}

// Unpublished returns up to limit events not yet acknowledged by JetStream,
// in commit order, starting after seq after.
func (s *Store) Unpublished(ctx context.Context, after int64, limit int) ([]Event, error) {
	// The read pool, not the writer: the relay reads ahead while the
	// writer marks what was acknowledged, on another core.
	rows, err := s.r.QueryContext(ctx, `SELECT `+outboxColumns+`
		FROM outbox o JOIN event_log l ON l.seq = o.seq WHERE o.seq > ? ORDER BY o.seq LIMIT ?`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	defer rows.Close()
	evs := make([]Event, 0, min(limit, 1024))
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, err
		}
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

// Limits of one ReadUnpublished statement; see there.
const (
	outboxStatementRows = 1 << 16
	outboxStatementTime = 5 * time.Second
)

// ReadUnpublished calls fn with the events not yet acknowledged by
// JetStream that follow seq after, in commit order, in batches of up to
// batch events, until the outbox ends, fn returns an error (which it
// returns), or ctx is done. fn owns each batch it is given.
//
// It reads with one statement for up to 64Ki events or five seconds,
// however long fn takes. Reading batch by batch with a query each, as
// Unpublished does, begins a read transaction per batch, and a read
// transaction that begins after a commit (the relay marking what was
// acknowledged) discards the connection's page cache: half of the relay's
// reading went to freeing and reading again pages. The bounds keep the one
// statement from holding back WAL checkpoints for long.
func (s *Store) ReadUnpublished(ctx context.Context, after int64, batch int, fn func([]Event) error) error {
	batch = max(batch, 1)
	for {
		n, last, err := s.readUnpublished(ctx, after, batch, fn)
		if err != nil || n < outboxStatementRows {
			return err
		}
		after = last
	}
}

// readUnpublished is one statement of ReadUnpublished: it returns how many
// events it read and the seq of the last.
func (s *Store) readUnpublished(
	ctx context.Context,
	after int64,
	batch int,
	fn func([]Event) error,
) (n int, last int64, err error) {
	rows, err := s.r.QueryContext(ctx, `SELECT `+outboxColumns+`
		FROM outbox o JOIN event_log l ON l.seq = o.seq WHERE o.seq > ? ORDER BY o.seq LIMIT ?`, after, outboxStatementRows)
	if err != nil {
		return 0, after, fmt.Errorf("read outbox after seq %d: %w", after, err)
	}
	defer rows.Close()
	deadline := time.Now().Add(outboxStatementTime)

	evs := make([]Event, 0, batch)
	flush := func() error {
		if len(evs) == 0 {
			return nil
		}
		err := fn(evs)
		evs = make([]Event, 0, batch)
		return err
	}
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return n, last, fmt.Errorf("read outbox after seq %d: %w", last, err)
		}
		evs = append(evs, e)
		n, last = n+1, e.Seq
		if len(evs) == batch {
			if err := flush(); err != nil {
				return n, last, err
			}
			if time.Now().After(deadline) {
				// Pretend the statement was full: the caller goes on with a
				// new one.
				return outboxStatementRows, last, nil
			}
		}
	}
	if err := rows.Err(); err != nil {
		return n, last, fmt.Errorf("read outbox after seq %d: %w", last, err)
	}
	return n, last, flush()
}

// outboxColumns are what scanEvent reads of event_log l. The id, type and
// the two times, which never contain a space (hex, <resource>.<action>,
// ISO 8601), come joined into one text: every column costs the driver a
// few calls into SQLite and an allocation, and reading the outbox is most
// of what the store costs the relay.
const outboxColumns = `l.seq, l.id || ' ' || l.type || ' ' || l.time || ' ' || l.created_time, l.scope, l.subject, l.data`

// scanEvent scans a row of outboxColumns.
func scanEvent(rows *sql.Rows) (Event, error) {
	var e Event
	var head, data string
	if err := rows.Scan(&e.Seq, &head, &e.Scope, &e.Subject, &data); err != nil {
		return e, err
	}
	id, rest, ok1 := strings.Cut(head, " ")
	typ, rest, ok2 := strings.Cut(rest, " ")
	t, created, ok3 := strings.Cut(rest, " ")
	if !ok1 || !ok2 || !ok3 {
		return e, fmt.Errorf("event %d: malformed row %q", e.Seq, head)
	}
	e.ID, e.Type = id, typ
	// type is <resource>.<action>, as the rows' own columns have it.
	e.Resource, e.Action, _ = strings.Cut(typ, ".")
	e.Time, _ = ParseTime(t)
	e.CreatedTime, _ = ParseTime(created)
	e.Data = json.RawMessage(data)
	return e, nil
}

// MarkPublished records that JetStream acknowledged the events with these
// seqs. Seqs no longer in the outbox (marked before) are ignored.
func (s *Store) MarkPublished(ctx context.Context, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	return s.tx(ctx, func(tx *sql.Tx) error { return markPublished(ctx, tx, seqs, FormatTime(s.now())) })
}

// markPublished takes seqs out of the outbox and records their publication
// time in event_publishes, one row per run of consecutive seqs, which is
// what keeps marking cheap: the relay acknowledges in commit order, so a
// transaction's seqs are a few long runs, each one ranged DELETE and one
// INSERT.
func markPublished(ctx context.Context, tx *sql.Tx, seqs []int64, now string) error {
	seqs = slices.Clone(seqs)
	slices.Sort(seqs)
	seqs = slices.Compact(seqs)
	for i := 0; i < len(seqs); {
		j := i + 1
		for j < len(seqs) && seqs[j] == seqs[j-1]+1 {
			j++
		}
		if err := markRun(ctx, tx, seqs[i], seqs[j-1], now); err != nil {
			return fmt.Errorf("mark events %d..%d published: %w", seqs[i], seqs[j-1], err)
		}
		i = j
	}
	return nil
}

// markRun marks the events first..last published. When some of them are
// not in the outbox (marked before, or no such event), it marks the others
// one by one, so that the runs in event_publishes never overlap and never
// cover an event not yet recorded.
func markRun(ctx context.Context, tx *sql.Tx, first, last int64, now string) error {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT mark_run`); err != nil {
		return err
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM outbox WHERE seq BETWEEN ? AND ?`, first, last)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n != last-first+1 {
		if _, err := tx.ExecContext(ctx, `ROLLBACK TO mark_run`); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `RELEASE mark_run`); err != nil {
			return err
		}
		return markEach(ctx, tx, first, last, now)
	}
	if _, err := tx.ExecContext(
		ctx,
		`INSERT INTO event_publishes (first_seq, last_seq, published_time) VALUES (?, ?, ?)`,
		first,
		last,
		now,
	); err != nil {
		return err
	}
	_, err = tx.ExecContext(ctx, `RELEASE mark_run`)
	return err
}

// markEach marks, one by one, those of the events first..last that are in
// the outbox.
func markEach(ctx context.Context, tx *sql.Tx, first, last int64, now string) error {
	var run []int64
	flush := func() error {
		if len(run) == 0 {
			return nil
		}
		_, err := tx.ExecContext(
			ctx,
			`INSERT INTO event_publishes (first_seq, last_seq, published_time) VALUES (?, ?, ?)`,
			run[0],
			run[len(run)-1],
			now,
		)
		run = run[:0]
		return err
	}
	for q := first; q <= last; q++ {
		res, err := tx.ExecContext(ctx, `DELETE FROM outbox WHERE seq = ?`, q)
		if err != nil {
			return err
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n == 0 {
			if err := flush(); err != nil {
				return err
			}
			continue
		}
		run = append(run, q)
	}
	return flush()
}

// UnpublishedCount returns how many events wait for JetStream and the time
// the oldest of them was recorded (zero when none).
func (s *Store) UnpublishedCount(ctx context.Context) (int, time.Time, error) {
	var n int
	var oldest sql.NullString
	err := s.r.QueryRowContext(ctx, `SELECT (SELECT COUNT(*) FROM outbox),
		(SELECT l.created_time FROM outbox o JOIN event_log l ON l.seq = o.seq ORDER BY o.seq LIMIT 1)`).Scan(&n, &oldest)
	if err != nil {
		return 0, time.Time{}, err
	}
	t, _ := ParseTime(oldest.String)
	return n, t, nil
}

// DropUnpublished empties the outbox and returns how many events it held
// and the seqs of the first and last. A cluster replica that recorded
// events while it led and lost the lease before publishing them calls it
// once another replica leads: the stream, not this mirror, is the
// cluster's history from then on, and the new leader records those
// changes again from its own crawl. The events stay in event_log, never
// published, until the mirror is repaired from a snapshot.
func (s *Store) DropUnpublished(ctx context.Context) (n int, first, last int64, err error) {
	err = s.tx(ctx, func(tx *sql.Tx) error {
		var lo, hi sql.NullInt64
		if err := tx.QueryRowContext(ctx, `SELECT COUNT(*), MIN(seq), MAX(seq) FROM outbox`).Scan(&n, &lo, &hi); err != nil {
			return err
		}
		first, last = lo.Int64, hi.Int64
		_, err := tx.ExecContext(ctx, `DELETE FROM outbox`)
		return err
	})
	if err != nil {
		return 0, 0, 0, fmt.Errorf("drop unpublished events: %w", err)
	}
	return n, first, last, nil
}

// PruneEvents deletes published events recorded before cutoff, and the
// publication records of the seqs that are gone. Unpublished events are
// never pruned.
func (s *Store) PruneEvents(ctx context.Context, cutoff time.Time) (int64, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(
			ctx,
			`DELETE FROM event_log WHERE created_time < ? AND seq NOT IN (SELECT seq FROM outbox)`,
			FormatTime(cutoff),
		)
		if err != nil {
			return err
		}
		n, _ = res.RowsAffected()
		_, err = tx.ExecContext(ctx, `DELETE FROM event_publishes
			WHERE NOT EXISTS (SELECT 1 FROM event_log l WHERE l.seq BETWEEN first_seq AND last_seq)`)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	return n, nil
}

// Age is how long ago the event was committed to the outbox (zero when
// unknown).
func (e Event) Age() time.Duration {
	if e.CreatedTime.IsZero() {
		return 0
	}
	return time.Since(e.CreatedTime)
}

// UnpublishedThrough counts the events up to event sequence seq that the
// mirror has not published yet.
func (s *Store) UnpublishedThrough(ctx context.Context, seq int64) (int, error) {
	var n int
	if err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM outbox WHERE seq <= ?`, seq).Scan(&n); err != nil {
		return 0, fmt.Errorf("read outbox: %w", err)
	}
	return n, nil
}

// OutboxHighest is the highest event sequence the outbox of the database
// at path (a Backup's copy) holds; 0 when it holds none.
func OutboxHighest(ctx context.Context, path string) (int64, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=query_only(1)")
	if err != nil {
		return 0, fmt.Errorf("open %s: %w", path, err)
	}
	defer db.Close()
	var seq int64
	if err := db.QueryRowContext(ctx, `SELECT COALESCE(max(seq), 0) FROM outbox`).Scan(&seq); err != nil {
		return 0, fmt.Errorf("read the outbox of %s: %w", path, err)
	}
	return seq, nil
}
