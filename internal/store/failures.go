package store

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"
)

// One failing repo fails nothing else: a repo or tag whose reads fail is
// recorded in crawl_failures with its error and the time of its next
// attempt, the crawl goes on without it, and a later crawl retries it when
// it is due. Nothing in a failed scope is deleted, since its listing is not
// known to be complete.

// Kinds of Failure.
const (
	FailureRepo = "repo" // the repo's tag listing or its reads failed
	FailureTag  = "tag"  // one tag's reads (its history) failed
)

// Failure is a repo or tag whose reads failed, as crawl_failures keeps it.
type Failure struct {
	Kind    string `json:"kind"`    // FailureRepo or FailureTag
	UID     string `json:"uid"`     // the repo's or the tag's uid
	RepoUID string `json:"repoUid"` // the repo's uid; by default, derived from UID
	Path    string `json:"path"`    // the repo's registry path
	Tag     string `json:"tag,omitempty"`
	// Status is the HTTP status of the failed request, 0 when there was
	// none (a network error, a timeout).
	Status   int    `json:"status,omitempty"`
	Error    string `json:"error"`
	Attempts int    `json:"attempts"` // failures in a row
	// FirstFailed is when the current run of failures began.
	FirstFailed time.Time `json:"firstFailed"`
	LastFailed  time.Time `json:"lastFailed"`
	// NextAttempt is when a crawl should try the scope again.
	NextAttempt time.Time `json:"nextAttempt"`
}

// Due reports whether the scope should be tried again at now.
func (f Failure) Due(now time.Time) bool { return !now.Before(f.NextAttempt) }

// maxFailureError bounds the error text kept per failure: an error can
// quote a whole response body.
const maxFailureError = 2000

// RecordFailure records that f's scope failed once more: a new failure
// starts at one attempt, a known one counts one more, and either is next
// due backoff(attempts) from now (at once if backoff is nil). f's Kind,
// UID, Error and the rest describe this failure; its times and Attempts
// are ignored. It returns the failure as recorded.
func (s *Store) RecordFailure(
	ctx context.Context,
	f Failure,
	backoff func(attempts int) time.Duration,
) (Failure, error) {
	if f.Kind != FailureRepo && f.Kind != FailureTag {
		return f, fmt.Errorf("record failure of %s: kind %q is not %q or %q", f.UID, f.Kind, FailureRepo, FailureTag)
	}
	if f.UID == "" {
		return f, errors.New("record failure: no uid")
	}
	if f.RepoUID == "" {
		// uids are hierarchical: a tag's repo is its uid's parent.
		f.RepoUID = f.UID
		if i := strings.LastIndexByte(f.UID, '/'); f.Kind == FailureTag && i > 0 {
			f.RepoUID = f.UID[:i]
		}
	}
	f.Error = truncateUTF8(f.Error, maxFailureError)
	// The caller's time of the failure wins over the store's clock, so that
	// the caller's schedule and the next attempt are on one clock.
	now := cmp.Or(f.LastFailed, s.now()).UTC().Truncate(time.Millisecond)
	_, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		var first string
		err := tx.QueryRowContext(ctx, `SELECT attempts, first_failed_time FROM crawl_failures WHERE uid = ?`, f.UID).
			Scan(&f.Attempts, &first)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			f.Attempts, f.FirstFailed = 0, now
		case err != nil:
			return 0, err
		default:
			if f.FirstFailed, err = ParseTime(first); err != nil {
				return 0, err
			}
		}
		f.Attempts++
		f.LastFailed, f.NextAttempt = now, now
		if backoff != nil {
			f.NextAttempt = now.Add(backoff(f.Attempts)).Truncate(time.Millisecond)
		}
		if _, err := tx.ExecContext(ctx, upsertFailureSQL, failureArgs(f)...); err != nil {
			return 0, err
		}
		return s.appendEvents(ctx, tx, []change{failedChange(f)})
	})
	if err != nil {
		return f, fmt.Errorf("record failure of %s %s: %w", f.Kind, f.UID, err)
	}
	return f, nil
}

// ClearFailure forgets the failure of the scope uid, once its reads all
// succeeded, and reports whether there was one. Clearing a repo's failure
// also ends a baseline the repo had pending (see EndBaseline): its tags
// have now been listed, and what changes in it from now on is news.
func (s *Store) ClearFailure(ctx context.Context, uid string) (bool, error) {
	var found bool
	_, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		var r recovered
		var first string
		err := tx.QueryRowContext(ctx, `DELETE FROM crawl_failures WHERE uid = ?
			RETURNING kind, uid, repo_uid, path, tag, first_failed_time`, uid).
			Scan(&r.Kind, &r.UID, &r.RepoUID, &r.Path, &r.Tag, &first)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, nil
		}
		if err != nil {
			return 0, err
		}
		if r.FirstFailed, err = ParseTime(first); err != nil {
			return 0, err
		}
		found = true
		if r.Kind == FailureRepo {
			if _, err := tx.ExecContext(ctx, `UPDATE repos SET baseline_pending = 0 WHERE uid = ? AND baseline_pending = 1`,
				r.RepoUID); err != nil {
				return 0, err
			}
		}
		return s.appendEvents(ctx, tx, []change{recoveredChange(r, s.now())})
	})
	if err != nil {
		return false, fmt.Errorf("clear failure of %s: %w", uid, err)
	}
	return found, nil
}

// upsertFailureSQL writes a failure, the values in failureArgs' order.
const upsertFailureSQL = `INSERT INTO crawl_failures (uid, kind, repo_uid, path, tag, status, error, attempts,
		first_failed_time, last_failed_time, next_attempt_time) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT(uid) DO UPDATE SET kind=excluded.kind, repo_uid=excluded.repo_uid, path=excluded.path, tag=excluded.tag,
		status=excluded.status, error=excluded.error, attempts=excluded.attempts,
		first_failed_time=excluded.first_failed_time, last_failed_time=excluded.last_failed_time,
		next_attempt_time=excluded.next_attempt_time`

func failureArgs(f Failure) []any {
	return []any{f.UID, f.Kind, f.RepoUID, f.Path, f.Tag, f.Status, f.Error, f.Attempts,
		FormatTime(f.FirstFailed), FormatTime(f.LastFailed), FormatTime(f.NextAttempt)}
}

// Failures returns every recorded failure, by path, tag and uid.
func (s *Store) Failures(ctx context.Context) ([]Failure, error) {
	var out []Failure
	err := s.readFailures(ctx, func(f Failure) { out = append(out, f) })
	return out, err
}

// FailuresByUID returns every recorded failure keyed by its scope's uid,
// for a crawl to skip the scopes not yet Due and to clear those that
// succeed.
func (s *Store) FailuresByUID(ctx context.Context) (map[string]Failure, error) {
	out := map[string]Failure{}
	err := s.readFailures(ctx, func(f Failure) { out[f.UID] = f })
	return out, err
}

// readFailures calls fn with every failure, by path, tag and uid.
func (s *Store) readFailures(ctx context.Context, fn func(Failure)) error {
	err := queryRows(
		ctx,
		s.r,
		`SELECT kind, uid, repo_uid, path, tag, status, error, attempts, first_failed_time, last_failed_time,
			next_attempt_time
		FROM crawl_failures ORDER BY path, tag, uid`,
		nil,
		func(rows *sql.Rows) error {
			var f Failure
			var first, last, next string
			if err := rows.Scan(
				&f.Kind,
				&f.UID,
				&f.RepoUID,
				&f.Path,
				&f.Tag,
				&f.Status,
				&f.Error,
				&f.Attempts,
				&first,
				&last,
				&next,
			); err != nil {
				return err
			}
			var err error
			if f.FirstFailed, err = ParseTime(first); err != nil {
				return err
			}
			if f.LastFailed, err = ParseTime(last); err != nil {
				return err
			}
			if f.NextAttempt, err = ParseTime(next); err != nil {
				return err
			}
			fn(f)
			return nil
		},
	)
	if err != nil {
		return fmt.Errorf("read crawl failures: %w", err)
	}
	return nil
}

// truncateUTF8 cuts s to at most n bytes without splitting a character.
func truncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}
