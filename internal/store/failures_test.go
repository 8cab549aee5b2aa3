package store_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// doubling is a backoff of 1m, 2m, 4m, …
func doubling(attempts int) time.Duration { return time.Minute << (attempts - 1) }

func TestFailures(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	t0 := clk.Now()
	repoFail := store.Failure{
		Kind:   store.FailureRepo,
		UID:    "g1/g2/r4",
		Path:   "charts/cert-manager",
		Status: 404,
		Error:  "history: 404 Not Found",
	}
	tagFail := store.Failure{
		Kind:    store.FailureTag,
		UID:     "g1/r1/t1",
		RepoUID: "g1/r1",
		Path:    "nginx",
		Tag:     "latest",
		Status:  403,
		Error:   "history: 403 Forbidden",
	}

	t.Run("RecordCountsAttemptsAndBacksOff", func(t *testing.T) {
		f, err := st.RecordFailure(ctx, repoFail, doubling)
		if err != nil {
			t.Fatal(err)
		}
		if f.Attempts != 1 || !f.FirstFailed.Equal(t0) || !f.LastFailed.Equal(t0) ||
			!f.NextAttempt.Equal(t0.Add(time.Minute)) ||
			f.RepoUID != repoFail.UID {
			t.Fatalf("first failure=%+v", f)
		}
		clk.Advance(5 * time.Minute)
		again := repoFail
		again.Status, again.Error = 0, "dial tcp: connection refused"
		f, err = st.RecordFailure(ctx, again, doubling)
		if err != nil {
			t.Fatal(err)
		}
		t1 := clk.Now()
		if f.Attempts != 2 || !f.FirstFailed.Equal(t0) || !f.LastFailed.Equal(t1) ||
			!f.NextAttempt.Equal(t1.Add(2*time.Minute)) ||
			f.Status != 0 ||
			f.Error != again.Error {
			t.Fatalf("second failure=%+v", f)
		}
		if _, err := st.RecordFailure(ctx, tagFail, nil); err != nil {
			t.Fatal(err)
		}
		fs, err := st.Failures(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(fs) != 2 || fs[0].UID != repoFail.UID || fs[1].UID != tagFail.UID {
			t.Fatalf("failures=%+v, want the repo's and the tag's, by path", fs)
		}
		if got := fs[0]; got != f {
			t.Fatalf("stored failure=%+v, want %+v as RecordFailure returned it", got, f)
		}
		if got := fs[1]; got.Tag != "latest" || got.Status != 403 || got.Attempts != 1 || !got.NextAttempt.Equal(t1) {
			t.Fatalf("tag failure=%+v, want due at once with no backoff", got)
		}
	})
	t.Run("DueSaysWhatToSkip", func(t *testing.T) {
		m, err := st.FailuresByUID(ctx)
		if err != nil {
			t.Fatal(err)
		}
		now := clk.Now()
		if f, ok := m[repoFail.UID]; !ok || f.Due(now) || !f.Due(now.Add(2*time.Minute)) {
			t.Fatalf("repo failure %+v: want it due in two minutes, not now", f)
		}
		if f, ok := m[tagFail.UID]; !ok || !f.Due(now) {
			t.Fatalf("tag failure %+v: want it due now", f)
		}
		if _, ok := m["g1/r1"]; ok {
			t.Fatal("a scope that never failed is in the map")
		}
	})
	t.Run("Clear", func(t *testing.T) {
		if ok, err := st.ClearFailure(ctx, tagFail.UID); err != nil || !ok {
			t.Fatalf("ClearFailure=%v, %v; want true", ok, err)
		}
		if ok, err := st.ClearFailure(ctx, tagFail.UID); err != nil || ok {
			t.Fatalf("ClearFailure again=%v, %v; want false", ok, err)
		}
		fs, err := st.Failures(ctx)
		if err != nil || len(fs) != 1 || fs[0].UID != repoFail.UID {
			t.Fatalf("failures=%+v err=%v, want the repo's alone", fs, err)
		}
		// A scope that fails again after it recovered starts over.
		f, err := st.RecordFailure(ctx, tagFail, doubling)
		if err != nil || f.Attempts != 1 || !f.FirstFailed.Equal(clk.Now()) {
			t.Fatalf("failure after recovery=%+v err=%v, want attempt 1 from now", f, err)
		}
	})
	t.Run("Invalid", func(t *testing.T) {
		if _, err := st.RecordFailure(ctx, store.Failure{Kind: "group", UID: "g1"}, nil); err == nil {
			t.Fatal("a failure of kind group was recorded")
		}
		if _, err := st.RecordFailure(ctx, store.Failure{Kind: store.FailureRepo}, nil); err == nil {
			t.Fatal("a failure without a uid was recorded")
		}
		// A tag's repo is its uid's parent when not given.
		if f, err := st.RecordFailure(
			ctx,
			store.Failure{Kind: store.FailureTag, UID: "g1/g2/r4/t9", Error: "x"},
			nil,
		); err != nil ||
			f.RepoUID != "g1/g2/r4" {
			t.Fatalf("repo of a tag failure=%q err=%v, want g1/g2/r4", f.RepoUID, err)
		}
		long := tagFail
		long.Error = strings.Repeat("é", 5000)
		f, err := st.RecordFailure(ctx, long, nil)
		if err != nil || len(f.Error) > 2000 || !strings.HasPrefix(long.Error, f.Error) {
			t.Fatalf("long error kept as %d bytes (err=%v), want at most 2000 whole characters", len(f.Error), err)
		}
	})
}

func TestRuns(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	finish := func(job string, failures int, err error) time.Time {
		t.Helper()
		r, serr := st.StartRun(ctx, job)
		if serr != nil {
			t.Fatal(serr)
		}
		clk.Advance(time.Minute)
		r.Failures = failures
		if ferr := st.FinishRun(ctx, r, err); ferr != nil {
			t.Fatal(ferr)
		}
		return clk.Now()
	}
	last := func() string {
		return queryString(
			t,
			st.Reader(),
			`SELECT outcome || '/' || failures || '/' || COALESCE(error, '') FROM crawl_runs ORDER BY id DESC LIMIT 1`,
		)
	}
	okAt := finish("crawl", 0, nil)
	if got, want := last(), "ok/0/"; got != want {
		t.Fatalf("run=%s, want %s", got, want)
	}
	partialAt := finish("crawl", 2, nil)
	if got, want := last(), "partial/2/"; got != want {
		t.Fatalf("run with failed scopes=%s, want %s", got, want)
	}
	finish("crawl", 1, errors.New("list repos: 500"))
	if got, want := last(), "failed/1/list repos: 500"; got != want {
		t.Fatalf("failed run=%s, want %s", got, want)
	}
	finish("advisories", 0, nil)
	if _, err := st.StartRun(ctx, "advisories"); err != nil {
		t.Fatal(err)
	}

	runs, err := st.LastRuns(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(runs) != 2 || runs[0].Job != "advisories" || runs[1].Job != "crawl" {
		t.Fatalf("last runs=%+v, want advisories and crawl", runs)
	}
	adv, crawl := runs[0], runs[1]
	if adv.Outcome != store.OutcomeRunning || !adv.Finished.IsZero() || adv.LastCompleted.IsZero() {
		t.Fatalf("advisories=%+v, want running, with an earlier completed run", adv)
	}
	// A partial run completed: freshness counts from it, not from the
	// failed run after it, nor from the ok run before.
	if crawl.Outcome != store.OutcomeFailed || crawl.Failures != 1 || crawl.Error == "" ||
		!crawl.LastCompleted.Equal(partialAt) ||
		okAt.Equal(partialAt) {
		t.Fatalf("crawl=%+v, want failed and last completed at %v", crawl, partialAt)
	}
	for outcome, want := range map[string]bool{
		store.OutcomeOK:       true,
		store.OutcomePartial:  true,
		store.OutcomeFailed:   false,
		store.OutcomeCanceled: false,
		store.OutcomeRunning:  false,
	} {
		if got := store.RunCompleted(outcome); got != want {
			t.Errorf("RunCompleted(%s)=%v, want %v", outcome, got, want)
		}
	}
}
