package cluster_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// maturedOnStream returns the tag.matured CloudEvents on the stream, in
// order.
func maturedOnStream(t *testing.T, js jetstream.JetStream) []publish.CloudEvent {
	t.Helper()
	ctx := context.Background()
	cons, err := js.OrderedConsumer(
		ctx,
		"EV",
		jetstream.OrderedConsumerConfig{FilterSubjects: []string{"ev.tag.matured.>"}},
	)
	if err != nil {
		t.Fatal(err)
	}
	var out []publish.CloudEvent
	for {
		batch, err := cons.FetchNoWait(100)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if m.Subject() != "ev.tag.matured.nginx" {
				t.Fatalf("tag.matured on %s, want ev.tag.matured.nginx", m.Subject())
			}
			var ce publish.CloudEvent
			if err := json.Unmarshal(m.Data(), &ce); err != nil {
				t.Fatal(err)
			}
			out = append(out, ce)
		}
		if n < 100 {
			return out
		}
	}
}

// TestMaturity_LeaderAnnouncesEachAtItsInstant moves a tag through several
// digests under an age of 5s on a clock the test moves: the leader's duty
// arms its timer at each next maturation (no polling), each tag.matured
// reaches the stream once, at its instant (a digest replaced within the
// age too: the matured digest is the one the tag pointed to an age ago),
// the matured bucket agrees, and a follower applying the stream holds the
// same tag_matured rows.
func TestMaturity_LeaderAnnouncesEachAtItsInstant(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	const age = 5 * time.Second
	t0 := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	clk := testutil.NewClock(t0)
	js := mustJetStream(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	if err := publish.EnsureStream(ctx, js, pcfg); err != nil {
		t.Fatal(err)
	}
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "leader.db"), store.Options{Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	repo := store.Repo{UID: "g/r1", Name: "nginx", CreateTime: t0, UpdateTime: t0}
	if _, err := st.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	need, _, err := st.ApplyTags(
		ctx,
		repo,
		[]store.Tag{{UID: "g/r1/t1", Name: "1.27", Digest: "sha256:x", CreateTime: t0, UpdateTime: t0}},
	)
	if err != nil || len(need) != 1 {
		t.Fatalf("apply tag: %v, %d to read", err, len(need))
	}
	kv, err := publish.OpenKV(
		ctx,
		js,
		publish.KVConfig{Tags: "t", Repos: "r", Advisories: "a", Matured: "m", History: 1},
		st,
	)
	if err != nil {
		t.Fatal(err)
	}
	relay := publish.NewRelay(js, st, pcfg, publish.WithKV(kv))
	duty := &cluster.Maturity{Store: st, Ages: []time.Duration{age}, Clock: clk}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone, dutyDone := make(chan error, 1), make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	go func() { dutyDone <- duty.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-relayDone; <-dutyDone })
	_, fst, _ := runFollower(t, js)

	var records []store.HistoryRecord
	move := func(d time.Duration, digest string) {
		t.Helper()
		clk.Advance(t0.Add(d).Sub(clk.Now()))
		records = append(records, store.HistoryRecord{Time: clk.Now(), Digest: digest})
		if _, err := st.ApplyHistory(ctx, need[0], records, true); err != nil {
			t.Fatal(err)
		}
	}
	armed := func(d time.Duration) {
		t.Helper()
		testutil.WaitFor(
			t,
			10*time.Second,
			"the duty to arm its timer at t0+"+d.String(),
			func() bool { return clk.Waiting(t0.Add(d)) },
		)
	}
	matured := func(want int) []publish.CloudEvent {
		t.Helper()
		var got []publish.CloudEvent
		testutil.WaitFor(t, 10*time.Second, "tag.matured on the stream", func() bool {
			got = maturedOnStream(t, js)
			return len(got) >= want
		})
		return got
	}
	data := func(ce publish.CloudEvent) store.MaturedTag {
		var d store.MaturedTag
		if err := json.Unmarshal(ce.Data, &d); err != nil {
			t.Fatal(err)
		}
		return d
	}

	move(0, "sha256:x")
	armed(age)
	clk.Advance(age - time.Millisecond)
	if got := maturedOnStream(t, js); len(got) != 0 {
		t.Fatalf("a millisecond before the age: %+v", got)
	}
	clk.Advance(time.Millisecond)
	evs := matured(1)
	if d := data(evs[0]); evs[0].Type != "dev.syncd.tag.matured" || d.Digest != "sha256:x" ||
		evs[0].Time != "2026-03-01T12:00:05.000Z" ||
		d.Previous != nil {
		t.Fatalf("first tag.matured: %+v %+v", evs[0], d)
	}

	move(6*time.Second, "sha256:y") // replaced after 2s
	move(8*time.Second, "sha256:z")
	armed(11 * time.Second)
	clk.Advance(3 * time.Second) // t0+11s: y, the digest 5s ago, matures
	evs = matured(2)
	if d := data(evs[1]); d.Digest != "sha256:y" || evs[1].Time != "2026-03-01T12:00:11.000Z" || d.Previous == nil ||
		d.Previous.Digest != "sha256:x" {
		t.Fatalf("second tag.matured: %+v %+v", evs[1], d)
	}
	armed(13 * time.Second)
	clk.Advance(2 * time.Second) // t0+13s: z matures
	evs = matured(3)
	if d := data(evs[2]); d.Digest != "sha256:z" || evs[2].Time != "2026-03-01T12:00:13.000Z" || d.Previous == nil ||
		d.Previous.Digest != "sha256:y" {
		t.Fatalf("third tag.matured: %+v %+v", evs[2], d)
	}

	// The bucket agrees, and a reconciliation finds nothing to change.
	key := publish.MaturedKey("nginx", "1.27", "5s")
	testutil.WaitFor(t, 10*time.Second, "the matured bucket to hold z", func() bool {
		e, err := kv.Bucket("matured").Get(ctx, key)
		if err != nil {
			return false
		}
		var v publish.MaturedValue
		return json.Unmarshal(e.Value(), &v) == nil && v.Digest == "sha256:z" && v.EventID == evs[2].ID
	})
	// Reconciling is the relay's, between its passes: stop it first.
	stopRelay()
	<-relayDone
	relayDone <- nil
	if rs, err := kv.Reconcile(ctx); err != nil || rs.Put != 0 {
		t.Fatalf("reconcile after the writes: %+v, %v; want nothing to put", rs, err)
	}

	// Every change once; the follower holds the same rows.
	clk.Advance(time.Minute)
	if got := maturedOnStream(t, js); len(got) != 3 || got[0].ID == got[1].ID || got[1].ID == got[2].ID {
		t.Fatalf("tag.matured on the stream: %+v, want x, y, then z, once each", got)
	}
	rows := func(s *store.Store) string {
		var out string
		s.Reader().
			QueryRow(
				`SELECT COALESCE(group_concat(tag_uid||' '||age||' '||seq||' '||digest||' '||event_id, ';'), '') FROM tag_matured`,
			).
			Scan(&out)
		return out
	}
	want := rows(st)
	testutil.WaitFor(
		t,
		10*time.Second,
		"the follower's tag_matured to be the leader's "+want,
		func() bool { return rows(fst) == want },
	)
}
