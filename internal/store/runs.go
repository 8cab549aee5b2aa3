package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Outcomes of a crawl job, as crawl_runs records them.
const (
	OutcomeRunning  = "running"  // started, not finished (or syncd stopped mid-run)
	OutcomeOK       = "ok"       // everything was read
	OutcomePartial  = "partial"  // finished, but some repos or tags failed (crawl_failures)
	OutcomeFailed   = "failed"   // the run as a whole failed
	OutcomeCanceled = "canceled" // stopped by shutdown or a lost lease
)

// RunCompleted reports whether a run with this outcome finished its work:
// ok, or partial, whose failed scopes are retried on their own while
// everything else is current. Freshness counts from a completed run.
func RunCompleted(outcome string) bool { return outcome == OutcomeOK || outcome == OutcomePartial }

// Run is one crawl job's row in crawl_runs.
type Run struct {
	ID       int64
	Job      string
	Requests int64
	Changes  int
	// Failures is how many repos and tags failed in the run; a run that
	// ends without an error but with failures is partial.
	Failures int
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

// FinishRun records the end of a crawl job with its outcome: failed (or
// canceled, when ctx is done) with runErr, else partial when r.Failures is
// above zero, else ok.
func (s *Store) FinishRun(ctx context.Context, r *Run, runErr error) error {
	outcome, msg := OutcomeOK, sql.NullString{}
	switch {
	case runErr != nil:
		outcome, msg = OutcomeFailed, sql.NullString{String: runErr.Error(), Valid: true}
		if ctx.Err() != nil {
			outcome = OutcomeCanceled
		}
	case r.Failures > 0:
		outcome = OutcomePartial
	}
	// The run's context may be canceled already; the record must still land.
	_, err := s.w.ExecContext(
		context.WithoutCancel(ctx),
		`UPDATE crawl_runs SET finished_time = ?, outcome = ?, requests = ?, changes = ?,
		failures = ?, error = ? WHERE id = ?`,
		FormatTime(s.now()),
		outcome,
		r.Requests,
		r.Changes,
		r.Failures,
		msg,
		r.ID,
	)
	if err != nil {
		return fmt.Errorf("record end of crawl run %d: %w", r.ID, err)
	}
	return nil
}

// JobRun is the latest run of one job, as status reports and freshness
// checks read it.
type JobRun struct {
	Job      string
	Started  time.Time
	Finished time.Time // zero while it runs
	Outcome  string
	Requests int64
	Changes  int
	Failures int
	Error    string
	// LastCompleted is when the job's latest completed run (see
	// RunCompleted) finished; zero if none has.
	LastCompleted time.Time
}

// LastRuns returns the latest run of each job, by job name.
func (s *Store) LastRuns(ctx context.Context) ([]JobRun, error) {
	var out []JobRun
	err := queryRows(
		ctx,
		s.r,
		`SELECT r.job, r.started_time, COALESCE(r.finished_time,''), r.outcome, r.requests, r.changes, r.failures,
			COALESCE(r.error,''),
			COALESCE((SELECT MAX(c.finished_time) FROM crawl_runs c WHERE c.job = r.job AND c.outcome IN (?, ?)), '')
		FROM crawl_runs r WHERE r.id IN (SELECT MAX(id) FROM crawl_runs GROUP BY job) ORDER BY r.job`,
		[]any{OutcomeOK, OutcomePartial},
		func(rows *sql.Rows) error {
			var j JobRun
			var started, finished, completed string
			if err := rows.Scan(
				&j.Job,
				&started,
				&finished,
				&j.Outcome,
				&j.Requests,
				&j.Changes,
				&j.Failures,
				&j.Error,
				&completed,
			); err != nil {
				return err
			}
			var err error
			if j.Started, err = ParseTime(started); err != nil {
				return err
			}
			if j.Finished, err = ParseTime(finished); err != nil {
				return err
			}
			j.LastCompleted, err = ParseTime(completed)
			out = append(out, j)
			return err
		},
	)
	if err != nil {
		return nil, fmt.Errorf("read last crawl runs: %w", err)
	}
	return out, nil
}
