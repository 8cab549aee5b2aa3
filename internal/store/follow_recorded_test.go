package store_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestApplyStream_PoisonAmongRecordedHistory: a batch whose whole attempt
// fails on an event in its middle (a history.recorded event of a tag the
// mirror does not hold) is applied again without it: the events before and
// after it are applied, their history rows written once, and the mirror's
// replica digest is the leader's, as if the failed attempt never ran.
func TestApplyStream_PoisonAmongRecordedHistory(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	repo := store.Repo{UID: "g/r1", Name: "nginx", CreateTime: clk.Now(), UpdateTime: clk.Now()}
	mustApplyRepos(t, leader, repo)
	t0 := clk.Now()
	var tags []store.Tag
	for i := range 3 {
		tags = append(tags, store.Tag{UID: fmt.Sprintf("g/r1/t%d", i), Name: fmt.Sprintf("1.%d", i), Digest: digest(i),
			CreateTime: t0, UpdateTime: t0})
	}
	for _, ref := range mustApplyTags(t, leader, repo, tags...) {
		recs := []store.HistoryRecord{{Time: t0.Add(-time.Hour), Digest: digest(9)}, {Time: t0, Digest: digest(0)}}
		if _, err := leader.ApplyHistory(ctx, ref, recs, true); err != nil {
			t.Fatal(err)
		}
	}
	evs := stream(t, leader)
	for i := range evs {
		evs[i].Seq = uint64(i + 1)
	}
	poison := store.StreamEvent{ID: "poison", Type: store.HistoryRecorded, Subject: "g/r1/nope", Seq: 100,
		Data: json.RawMessage(`{"tag":"g/r1/nope","path":"nginx","records":[{"seq":0,"time":"2026-01-01T00:00:00Z",` +
			`"digest":"sha256:00"}]}`)}
	var recorded int
	for _, e := range evs {
		if e.Type == store.HistoryRecorded {
			recorded++
		}
	}
	if recorded != len(tags) {
		t.Fatalf("the leader's stream has %d history.recorded events, want %d", recorded, len(tags))
	}
	// The poison after the first history.recorded event.
	at := len(evs) - recorded + 1
	batch := append(append(append([]store.StreamEvent{}, evs[:at]...), poison), evs[at:]...)
	follower, _ := openTemp(t, newClock(), false, store.Options{})
	res, err := follower.ApplyStream(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := res.Applied, len(evs); got != want {
		t.Errorf("applied %d events, want %d", got, want)
	}
	if len(res.Rejected) != 1 || res.Rejected[0].Event.ID != "poison" {
		t.Fatalf("rejected %+v, want the poison alone", res.Rejected)
	}
	q := `SELECT group_concat(tag_uid || ':' || seq || ':' || update_time || ':' || digest, ',') ` +
		`FROM (SELECT * FROM tag_history ORDER BY tag_uid, seq)`
	if l, f := queryString(t, leader.Reader(), q), queryString(t, follower.Reader(), q); l != f {
		t.Errorf("history:\n leader:   %s\n follower: %s", l, f)
	}
	if got, want := queryInt(t, follower.Reader(), `SELECT count(*) FROM event_log`), len(evs); got != want {
		t.Errorf("the follower logged %d events, want %d", got, want)
	}
	sameDigest(t, leader, follower)
	if seq, _, err := follower.StreamPosition(ctx); err != nil || seq != 100 {
		t.Errorf("stream position %d (%v), want 100", seq, err)
	}
}

// TestApplyStream_RecordedOutOfOrder: a tag's history.recorded events
// applied in any order, in one batch or apart, leave the same bookmark,
// history and digest: the records of a later event that came first are
// stored, and the bookmark goes over them once the earlier event comes.
func TestApplyStream_RecordedOutOfOrder(t *testing.T) {
	ctx := context.Background()
	evs := leaderWithMoves(t)
	if evs[1].Type != store.TagCreated {
		t.Fatalf("event 1 is %s, want the tag's creation", evs[1].Type)
	}
	created := evs[:2]
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	recorded := func(id string, first int, digests ...string) store.StreamEvent {
		var recs []string
		for i, dg := range digests {
			recs = append(recs, fmt.Sprintf(`{"seq":%d,"time":"2025-06-0%dT00:00:00Z","digest":%q}`, first+i, first+i+1, dg))
		}
		return store.StreamEvent{ID: id, Type: store.HistoryRecorded, Subject: "g/r1/t1", Time: newClock().Now(),
			Data: json.RawMessage(`{"tag":"g/r1/t1","path":"nginx","records":[` + strings.Join(recs, ",") + `]}`)}
	}
	a, b := recorded("rec-a", 0, d("a")), recorded("rec-b", 1, d("b"), d("c"))
	render := func(st *store.Store) string {
		return queryString(t, st.Reader(), `SELECT history_count || ':' || history_last_count || ':' ||
			history_last_time || ':' || history_last_digest || ':' || digest FROM tags WHERE uid = 'g/r1/t1'`) + " " +
			queryString(t, st.Reader(), `SELECT group_concat(seq || ':' || update_time || ':' || digest, ',')
				FROM (SELECT * FROM tag_history ORDER BY seq)`)
	}
	apply := func(batches ...[]store.StreamEvent) *store.Store {
		st, _ := openTemp(t, newClock(), false, store.Options{})
		for _, b := range batches {
			res, err := st.ApplyStream(ctx, b)
			if err != nil || len(res.Rejected) > 0 {
				t.Fatalf("apply: %+v, %v", res, err)
			}
		}
		return st
	}
	inOrder := apply(append(append([]store.StreamEvent{}, created...), a, b))
	want := render(inOrder)
	if !strings.HasPrefix(want, "3:1:2025-06-03T00:00:00.000Z:"+d("c")+":"+d("c")+" ") {
		t.Fatalf("in order, the tag is %s, want its bookmark after the three records", want)
	}
	for name, batches := range map[string][][]store.StreamEvent{
		"one batch": {append(append([]store.StreamEvent{}, created...), b, a)},
		"apart":     {created, {b}, {a}},
	} {
		st := apply(batches...)
		if got := render(st); got != want {
			t.Errorf("%s, later event first: the tag is\n %s\nwant\n %s", name, got, want)
		}
		sameDigest(t, inOrder, st)
	}
}

// sameDigest fails the test when b's replica digest differs from a's, or
// from the one computed from b's rows.
func sameDigest(t *testing.T, a, b *store.Store) {
	t.Helper()
	ctx := context.Background()
	ad, err := a.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	bd, err := b.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := bd.Diff(ad); diff != "" {
		t.Errorf("replica digests differ in %s:\n %v\n %v", diff, ad, bd)
	}
	computed, err := b.ComputeReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := bd.Diff(computed); diff != "" {
		t.Errorf("the kept digest differs from the rows' in %s:\n kept:     %v\n computed: %v", diff, bd, computed)
	}
}
