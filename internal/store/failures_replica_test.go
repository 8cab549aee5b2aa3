package store_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// crawlRecords returns st's crawl.failed and crawl.recovered records as a
// follower receives them.
func crawlRecords(tb testing.TB, st *store.Store) []store.StreamEvent {
	tb.Helper()
	var out []store.StreamEvent
	for _, e := range stream(tb, st) {
		if strings.HasPrefix(e.Type, "crawl.") {
			out = append(out, e)
		}
	}
	return out
}

// TestFailures_Replicated: every failure the leader records and every
// recovery goes on the stream in the transaction that records it, and a
// follower's crawl_failures equal the leader's after applying them, the
// attempts and the next attempt included; a record that comes again, or
// late (after a newer one), changes nothing.
func TestFailures_Replicated(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	follower, _ := openTemp(t, clk, false, store.Options{})
	tagFail := store.Failure{Kind: store.FailureTag, UID: "g1/r1/t1", RepoUID: "g1/r1", Path: "nginx", Tag: "latest",
		Status: 403, Error: "history: 403 Forbidden"}
	repoFail := store.Failure{Kind: store.FailureRepo, UID: "g1/r2", Path: "redis", Status: 404, Error: "404"}
	for range 3 {
		if _, err := leader.RecordFailure(ctx, tagFail, doubling); err != nil {
			t.Fatal(err)
		}
		clk.Advance(time.Second)
	}
	if _, err := leader.RecordFailure(ctx, repoFail, doubling); err != nil {
		t.Fatal(err)
	}
	if ok, err := leader.ClearFailure(ctx, repoFail.UID); err != nil || !ok {
		t.Fatalf("ClearFailure = %v, %v", ok, err)
	}
	records := crawlRecords(t, leader)
	if got, want := types(eventsOf(records)), []string{store.CrawlFailed, store.CrawlFailed, store.CrawlFailed,
		store.CrawlFailed, store.CrawlRecovered}; !slices.Equal(got, want) {
		t.Fatalf("records = %v, want %v", got, want)
	}
	// Applied twice, and the tag's first failure once more after its
	// third, under another id (another leader's): the follower ends where
	// the leader is.
	late := records[0]
	late.ID = "late"
	again := append(append(slices.Clone(records), records...), late)
	res, err := follower.ApplyStream(ctx, again)
	if err != nil || len(res.Rejected) > 0 {
		t.Fatalf("ApplyStream: %+v, %v", res.Rejected, err)
	}
	want, err := leader.Failures(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got, err := follower.Failures(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(want) != 1 || !slices.EqualFunc(got, want, sameFailure) {
		t.Fatalf("follower's failures %+v, want the leader's %+v", got, want)
	}
	if got[0].Attempts != 3 {
		t.Errorf("attempts = %d, want 3", got[0].Attempts)
	}
	// A recovery on the leader reaches the follower too.
	if _, err := leader.ClearFailure(ctx, tagFail.UID); err != nil {
		t.Fatal(err)
	}
	records = crawlRecords(t, leader)
	if _, err := follower.ApplyStream(ctx, records[len(records)-1:]); err != nil {
		t.Fatal(err)
	}
	if got, err := follower.Failures(ctx); err != nil || len(got) != 0 {
		t.Errorf("follower's failures after the recovery: %+v, %v", got, err)
	}
}

func eventsOf(evs []store.StreamEvent) []store.Event {
	out := make([]store.Event, len(evs))
	for i, e := range evs {
		out[i] = store.Event{Type: e.Type}
	}
	return out
}

func sameFailure(a, b store.Failure) bool {
	return a.Kind == b.Kind && a.UID == b.UID && a.RepoUID == b.RepoUID && a.Path == b.Path && a.Tag == b.Tag &&
		a.Status == b.Status && a.Error == b.Error && a.Attempts == b.Attempts &&
		a.FirstFailed.Equal(b.FirstFailed) && a.LastFailed.Equal(b.LastFailed) && a.NextAttempt.Equal(b.NextAttempt)
}

// TestFailures_ReplicatedRecordsValidated: a crawl.* record that is not a
// failure syncd could have written is set aside, without stopping the
// rest of its batch, and one that holds its scope back longer than the
// crawler ever does is cut to MaxFailureBackoff.
func TestFailures_ReplicatedRecordsValidated(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	follower, _ := openTemp(t, clk, false, store.Options{})
	now := clk.Now()
	good := store.Failure{Kind: store.FailureTag, UID: "g1/r1/t1", RepoUID: "g1/r1", Path: "nginx", Tag: "latest",
		Status: 403, Error: "denied", Attempts: 3, FirstFailed: now.Add(-time.Minute), LastFailed: now,
		NextAttempt: now.Add(time.Minute)}
	record := func(id string, f store.Failure, mutate func(map[string]any)) store.StreamEvent {
		b, err := json.Marshal(f)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		if mutate != nil {
			mutate(m)
		}
		data, _ := json.Marshal(m)
		return store.StreamEvent{ID: id, Type: store.CrawlFailed, Subject: f.UID, Time: now, Data: data}
	}
	set := func(k string, v any) func(map[string]any) { return func(m map[string]any) { m[k] = v } }
	bad := []store.StreamEvent{
		record("kind", good, set("kind", "group")),
		record("subject", good, set("uid", "g1/r9/t9")),
		record("attempts", good, set("attempts", 0)),
		record("status", good, set("status", 99999)),
		record("times", good, set("firstFailed", "0001-01-01T00:00:00Z")),
		record("order", good, set("firstFailed", now.Add(time.Hour).Format(time.RFC3339Nano))),
		record("long", good, set("tag", strings.Repeat("x", 5000))),
		{ID: "shape", Type: store.CrawlFailed, Subject: good.UID, Time: now, Data: json.RawMessage(`[1,2]`)},
		{ID: "recovered", Type: store.CrawlRecovered, Subject: good.UID, Time: now, Data: json.RawMessage(`{}`)},
	}
	far := good
	far.UID, far.NextAttempt = "g1/r1/t2", now.AddDate(70, 0, 0)
	batch := append(bad, record("good", good, nil), record("far", far, nil))
	res, err := follower.ApplyStream(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	var rejected []string
	for _, r := range res.Rejected {
		rejected = append(rejected, r.Event.ID)
	}
	if len(rejected) != len(bad) {
		t.Errorf("rejected %v, want the %d bad records", rejected, len(bad))
	}
	got, err := follower.FailuresByUID(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !sameFailure(got[good.UID], good) {
		t.Fatalf("failures %+v, want the good one as it came and the far one", got)
	}
	if next, want := got[far.UID].NextAttempt, now.Add(store.MaxFailureBackoff); !next.Equal(want) {
		t.Errorf("a next attempt 70 years ahead became %s, want %s", next, want)
	}
}
