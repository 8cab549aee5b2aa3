package platform_test

import (
	"errors"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

// historyEnv is a simulator with one repo ("repo") holding one tag
// ("tag") whose history the test writes.
type historyEnv struct {
	*env
	tagUID, repo, tag string
	moves             int
}

func newHistoryEnv(t *testing.T, startInclusive bool) *historyEnv {
	t.Helper()
	e := newEnv(t, platformsim.Scale{Repos: 1, TagsPerRepo: 1, HistoryPerTag: 1, PublicImages: -1},
		func(o *platformsim.Options) { o.StartInclusive = startInclusive })
	tr := e.sim.Truth()
	return &historyEnv{env: e, tagUID: tr.Tags[0].UID, repo: tr.Repos[0].Name, tag: tr.Tags[0].Name}
}

// write appends records to the tag's history: each run of n records
// shares one timestamp, and runs are one millisecond apart (the API's
// resolution), so the record before a run sits exactly at the run's
// time less a millisecond.
func (h *historyEnv) write(t *testing.T, runs ...int) {
	t.Helper()
	for _, n := range runs {
		h.sim.Advance(time.Millisecond)
		for range n {
			h.moves++
			if err := h.sim.MoveTag(h.tagUID, digest(h.moves)); err != nil {
				t.Fatal(err)
			}
		}
	}
}

// ones is n runs of one record each.
func ones(n int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = 1
	}
	return out
}

func (h *historyEnv) truth(t *testing.T) []platformsim.TruthRecord {
	t.Helper()
	recs, ok := h.sim.History(h.tagUID)
	if !ok {
		t.Fatal("tag vanished")
	}
	return recs
}

func bothStartModes(t *testing.T, f func(t *testing.T, inclusive bool)) {
	t.Run("StartExclusive", func(t *testing.T) { f(t, false) })
	t.Run("StartInclusive", func(t *testing.T) { f(t, true) })
}

// fiveThousand writes a 5,000-record history (with the populated first
// record): records 850-1149 share one timestamp across the 1000-record
// boundary, and records 1150-1949 share the next millisecond, so a walker
// that reads from "just before" an inclusive start loses part of its window
// to the first run.
func fiveThousand(t *testing.T, h *historyEnv) {
	t.Helper()
	h.write(t, ones(849)...)
	h.write(t, 300, 800)
	h.write(t, ones(3050)...)
	if got := len(h.truth(t)); got != 5000 {
		t.Fatalf("built %d records, want 5000", got)
	}
}

func TestHistorySince_RunAcrossWindowBoundary(t *testing.T) {
	bothStartModes(t, func(t *testing.T, inclusive bool) {
		h := newHistoryEnv(t, inclusive)
		fiveThousand(t, h)
		c := h.client(nil)
		want := h.truth(t)
		if !want[850].UpdateTime.Equal(want[1149].UpdateTime) || want[849].UpdateTime.Equal(want[850].UpdateTime) {
			t.Fatal("the history does not have the intended run")
		}
		got, err := c.HistorySince(ctxT(t), c.PrivateImage(h.repo), h.tag, time.Time{})
		if err != nil {
			t.Fatalf("HistorySince: %v", err)
		}
		checkHistory(t, "history", got, want)
		// Five windows' worth of records; overlaps and one re-ask after
		// learning that start is inclusive may add a few, but not many.
		if n := h.requests("GET /v2/{image}/_chainguard/history/{tag}"); n < 5 || n > 9 {
			t.Errorf("%d history requests, want 5 to 9", n)
		}
	})
}

func TestHistorySince_FromBookmark(t *testing.T) {
	bothStartModes(t, func(t *testing.T, inclusive bool) {
		h := newHistoryEnv(t, inclusive)
		fiveThousand(t, h)
		c := h.client(nil)
		want := h.truth(t)
		for _, i := range []int{0, 849, 850, 1150, 1949, 3000, 4999} {
			since := want[i].UpdateTime
			first := i
			for first > 0 && want[first-1].UpdateTime.Equal(since) {
				first--
			}
			got, err := c.HistorySince(ctxT(t), c.PrivateImage(h.repo), h.tag, since)
			if err != nil {
				t.Fatalf("HistorySince(record %d): %v", i, err)
			}
			checkHistory(t, "since record "+since.Format(time.RFC3339Nano), got, want[first:])
		}
		// A bookmark after the newest record reads nothing.
		got, err := c.HistorySince(ctxT(t), c.PrivateImage(h.repo), h.tag, want[len(want)-1].UpdateTime.Add(time.Millisecond))
		if err != nil || len(got) != 0 {
			t.Fatalf("HistorySince(after the end) = %d records, %v; want none", len(got), err)
		}
	})
}

func TestHistorySince_TooManyOnOneTimestamp(t *testing.T) {
	bothStartModes(t, func(t *testing.T, inclusive bool) {
		h := newHistoryEnv(t, inclusive)
		h.write(t, ones(99)...)
		h.write(t, 1200)
		h.write(t, ones(50)...)
		want := h.truth(t)
		c := h.client(nil)
		got, err := c.HistorySince(ctxT(t), c.PrivateImage(h.repo), h.tag, time.Time{})
		var unwalkable *platform.UnwalkableError
		if !errors.As(err, &unwalkable) {
			t.Fatalf("err = %v, want an *UnwalkableError", err)
		}
		if !unwalkable.Time.Equal(want[100].UpdateTime) {
			t.Errorf("unwalkable at %s, want %s", unwalkable.Time, want[100].UpdateTime)
		}
		// What was read is kept: the 100 records before the run and the
		// 1000 of it that one request returns.
		checkHistory(t, "kept", got, want[:1100])
		if n := h.requests("GET /v2/{image}/_chainguard/history/{tag}"); n > 3 {
			t.Errorf("%d history requests; the walk should stop, not loop", n)
		}
	})
}
