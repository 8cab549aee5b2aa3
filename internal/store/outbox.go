package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"time"
)

// Event is a row of the events table.
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
	rows, err := s.r.QueryContext(ctx, `SELECT seq, id, type, resource, action, scope, subject, time, data, created_time
		FROM events WHERE published_time IS NULL AND seq > ? ORDER BY seq LIMIT ?`, after, limit)
	if err != nil {
		return nil, fmt.Errorf("read outbox: %w", err)
	}
	defer rows.Close()
	var evs []Event
	for rows.Next() {
		var e Event
		var t, data, created string
		if err := rows.Scan(&e.Seq, &e.ID, &e.Type, &e.Resource, &e.Action, &e.Scope, &e.Subject, &t, &data, &created); err != nil {
			return nil, err
		}
		e.Time, _ = ParseTime(t)
		e.CreatedTime, _ = ParseTime(created)
		e.Data = json.RawMessage(data)
		evs = append(evs, e)
	}
	return evs, rows.Err()
}

// MarkPublished records that JetStream acknowledged the events with these seqs.
func (s *Store) MarkPublished(ctx context.Context, seqs []int64) error {
	if len(seqs) == 0 {
		return nil
	}
	now := FormatTime(s.now())
	return s.tx(ctx, func(tx *sql.Tx) error {
		for start := 0; start < len(seqs); start += 500 {
			end := min(start+500, len(seqs))
			args := []any{now}
			for _, q := range seqs[start:end] {
				args = append(args, q)
			}
			if _, err := tx.ExecContext(ctx, `UPDATE events SET published_time = ? WHERE seq IN (`+placeholders(end-start)+`)`, args...); err != nil {
				return fmt.Errorf("mark events published: %w", err)
			}
		}
		return nil
	})
}

// UnpublishedCount returns how many events wait for JetStream and the time
// the oldest of them was recorded (zero when none).
func (s *Store) UnpublishedCount(ctx context.Context) (int, time.Time, error) {
	var n int
	var oldest sql.NullString
	err := s.r.QueryRowContext(ctx, `SELECT COUNT(*), MIN(created_time) FROM events WHERE published_time IS NULL`).Scan(&n, &oldest)
	if err != nil {
		return 0, time.Time{}, err
	}
	t, _ := ParseTime(oldest.String)
	return n, t, nil
}

// PruneEvents deletes published events recorded before cutoff. Unpublished
// events are never pruned.
func (s *Store) PruneEvents(ctx context.Context, cutoff time.Time) (int64, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM events WHERE published_time IS NOT NULL AND created_time < ?`, FormatTime(cutoff))
	if err != nil {
		return 0, fmt.Errorf("prune events: %w", err)
	}
	return res.RowsAffected()
}

// Run is one crawl job's row in crawl_runs.
type Run struct {
	ID       int64
	Job      string
	Requests int64
	Changes  int
}

// StartRun records the start of a crawl job.
func (s *Store) StartRun(ctx context.Context, job string) (*Run, error) {
	res, err := s.w.ExecContext(ctx, `INSERT INTO crawl_runs (job, started_time) VALUES (?, ?)`, job, FormatTime(s.now()))
	if err != nil {
		return nil, fmt.Errorf("record crawl start: %w", err)
	}
	id, _ := res.LastInsertId()
	return &Run{ID: id, Job: job}, nil
}

// FinishRun records the end of a crawl job with its outcome.
func (s *Store) FinishRun(ctx context.Context, r *Run, runErr error) error {
	outcome, msg := "ok", sql.NullString{}
	if runErr != nil {
		outcome, msg = "failed", sql.NullString{String: runErr.Error(), Valid: true}
		if ctx.Err() != nil {
			outcome = "canceled"
		}
	}
	// The run's context may be canceled already; the record must still land.
	_, err := s.w.ExecContext(context.WithoutCancel(ctx), `UPDATE crawl_runs SET finished_time = ?, outcome = ?, requests = ?, changes = ?, error = ? WHERE id = ?`,
		FormatTime(s.now()), outcome, r.Requests, r.Changes, msg, r.ID)
	return err
}

// Age is how long ago the event was committed to the outbox (zero when
// unknown).
func (e Event) Age() time.Duration {
	if e.CreatedTime.IsZero() {
		return 0
	}
	return time.Since(e.CreatedTime)
}
