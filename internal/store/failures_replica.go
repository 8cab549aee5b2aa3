package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// The leader's crawl_failures reach the replicas as replication records on
// the stream, each written in the transaction of the failure or recovery it
// records: crawl.failed (the failure as recorded, its attempts and next
// attempt included) and crawl.recovered. A standby that takes over then
// holds back what the old leader held back, until the same next attempt,
// rather than trying every failing scope at once.

// MaxFailureBackoff bounds how long a failure a follower takes from the
// stream holds its scope back, counted from the failure (or from now, when
// the failure claims a later time): the crawler waits an hour at most
// between attempts, and a record that says more (a clock far ahead, a
// forgery) must not hold a repo back for longer.
const MaxFailureBackoff = time.Hour

// Bounds of a failure taken from the stream: of its uid, path and tag, and
// of its attempts.
const (
	maxFailureField    = 1024
	maxFailureAttempts = 1 << 20
)

// recovered is a crawl.recovered record's data: the scope whose failures
// ended, and when they began.
type recovered struct {
	Kind        string    `json:"kind"`
	UID         string    `json:"uid"`
	RepoUID     string    `json:"repoUid"`
	Path        string    `json:"path"`
	Tag         string    `json:"tag,omitempty"`
	FirstFailed time.Time `json:"firstFailed"`
}

// failedChange is the crawl.failed record of f, as recorded: one per
// attempt.
func failedChange(f Failure) change {
	return change{typ: CrawlFailed, scope: cmp.Or(f.Path, f.RepoUID), subject: f.UID, time: f.LastFailed, data: f,
		disc: strconv.Itoa(f.Attempts) + "/" + FormatTime(f.LastFailed)}
}

// recoveredChange is the crawl.recovered record of r at now: one per run
// of failures, so that two leaders that see the same recovery record it
// under one id.
func recoveredChange(r recovered, now time.Time) change {
	return change{typ: CrawlRecovered, scope: cmp.Or(r.Path, r.RepoUID), subject: r.UID, time: now, data: r,
		disc: FormatTime(r.FirstFailed)}
}

// applyCrawl applies a crawl.failed or crawl.recovered record to the
// mirror's crawl_failures. A failure older than the one the mirror holds
// for its scope (a record the audit published again, late) changes
// nothing, and a recovery ends only the failures that began before it.
func (b *followBatch) applyCrawl(ctx context.Context, e StreamEvent) (string, error) {
	switch e.Type {
	case CrawlFailed:
		var f Failure
		if err := json.Unmarshal(e.Data, &f); err != nil {
			return "", fmt.Errorf("decode data: %w", err)
		}
		if err := followedFailure(&f, e.Subject, b.s.now()); err != nil {
			return "", err
		}
		_, err := b.exec(ctx, upsertFailureSQL+`
			WHERE excluded.last_failed_time >= crawl_failures.last_failed_time`, failureArgs(f)...)
		return f.Path, err
	case CrawlRecovered:
		var r recovered
		if err := json.Unmarshal(e.Data, &r); err != nil {
			return "", fmt.Errorf("decode data: %w", err)
		}
		if r.UID == "" || r.UID != e.Subject || r.FirstFailed.IsZero() {
			return "", errors.New("a recovery names no scope, another than its subject, or no first failure")
		}
		_, err := b.exec(ctx, `DELETE FROM crawl_failures WHERE uid = ? AND first_failed_time <= ?`,
			r.UID, FormatTime(r.FirstFailed))
		return r.Path, err
	}
	return "", fmt.Errorf("unknown type %q", e.Type)
}

// followedFailure checks a failure taken from the stream, whose subject is
// the failing scope's uid, and bounds it at now: its error's length as the
// leader bounds it, and its next attempt to MaxFailureBackoff.
func followedFailure(f *Failure, subject string, now time.Time) error {
	switch {
	case f.Kind != FailureRepo && f.Kind != FailureTag:
		return fmt.Errorf("failure of kind %q", f.Kind)
	case f.UID == "" || f.UID != subject || f.RepoUID == "":
		return errors.New("a failure names no scope, or another than its subject")
	case len(f.UID) > maxFailureField || len(f.RepoUID) > maxFailureField || len(f.Path) > maxFailureField ||
		len(f.Tag) > maxFailureField:
		return fmt.Errorf("a failure's uid, path or tag is over %d bytes", maxFailureField)
	case f.Attempts < 1 || f.Attempts > maxFailureAttempts:
		return fmt.Errorf("a failure of %d attempts", f.Attempts)
	case f.Status < 0 || f.Status > 999:
		return fmt.Errorf("a failure with HTTP status %d", f.Status)
	case f.FirstFailed.IsZero() || f.LastFailed.IsZero() || f.NextAttempt.IsZero() ||
		f.LastFailed.Before(f.FirstFailed):
		return errors.New("a failure without its times, or that failed last before it failed first")
	}
	f.Error = truncateUTF8(f.Error, maxFailureError)
	if limit := minTime(f.LastFailed, now).Add(MaxFailureBackoff); f.NextAttempt.After(limit) {
		f.NextAttempt = limit
	}
	return nil
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
