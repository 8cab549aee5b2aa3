package main

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestCluster_StreamLostWhole deletes the SYNCD stream under the running
// replicas and the follower while data changes, as NATS losing it whole
// (Jepsen's analysis of NATS 2.12.1 saw damaged snapshot files do it) or
// an operator would: the leader's relay creates it again, its audit
// publishes the event log into it again, and the standby and the
// follower, their consumers gone with the stream, follow the new stream
// from its first message. Then the oracle (finish): the new stream holds
// every event of the leader's mirror exactly once, each tag's moves in
// order; the standby and the follower equal the leader and match the
// same checkpoint, the leader's first after the refill.
func TestCluster_StreamLostWhole(t *testing.T) {
	// A short duplicate window and frequent audits: the audit publishes
	// again only what is older than the window.
	pw := startPartitionWorld(t, 71, clusterTTL, func(n *node) { n.dupWindow, n.auditEvery = "5s", "2s" })
	pw.noOrderedView = "an ordered consumer reads on by sequence, and the stream created again counts from 1"
	ctx, cancel := context.WithTimeout(pw.ctx, 2*time.Minute)
	defer cancel()
	old, err := pw.js.Stream(ctx, "SYNCD")
	if err != nil {
		t.Fatal(err)
	}
	oldCreated, oldLast := old.CachedInfo().Created, old.CachedInfo().State.LastSeq
	if err := pw.js.DeleteStream(ctx, "SYNCD"); err != nil {
		t.Fatal(err)
	}
	lost := time.Now()
	// A connection of its own: pw.js carries the KV watcher's updates.
	js := testutil.JetStream(t, pw.urls)
	var created time.Time
	var lookup error
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		// Each lookup is bounded on its own: a JetStream API request the
		// cluster never answered (seen once in 30 runs, and twice in
		// session 23 on pw.js) otherwise waited out ctx's two minutes, and
		// the loop never looked again.
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		s, err := js.Stream(lctx, "SYNCD")
		cancel()
		if lookup = err; err == nil {
			if created = s.CachedInfo().Created; !created.Equal(oldCreated) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the stream was not created again within 60s: the last lookup %v, the stream created at %s "+
				"(the deleted one at %s); a's log says it created it again: %v", lookup, created, oldCreated,
				strings.Contains(pw.a.out.String(), "created it again"))
		}
	}
	recreated := time.Since(lost).Round(time.Millisecond)
	time.Sleep(3 * time.Second) // data changes on the new stream
	figures := pw.finish(pw.a, pw.b)
	for _, n := range []*node{pw.b, pw.f} {
		if got := metaOf(n.dbPath, "stream_created"); got != created.UTC().Format(time.RFC3339Nano) {
			t.Errorf("%s's mirror counts the stream created at %q, want the new one's %s", n.name, got, created)
		}
	}
	// (The standby and the follower log that they follow the new stream
	// from its first message only if they made their consumer before the
	// loss; their recorded stream above is what counts.)
	for _, line := range []string{
		"the stream was gone (lost by NATS, or deleted); created it again",
		"the stream was created again",
	} {
		if !strings.Contains(pw.a.out.String(), line) {
			t.Errorf("a's log lacks %q", line)
		}
	}
	s, err := pw.js.Stream(pw.ctx, "SYNCD")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(pw.ctx, jetstream.WithDeletedDetails(false))
	if err != nil {
		t.Fatal(err)
	}
	// A replica that read past an event the old stream lost applies it
	// late, when the refill publishes it again, over its resource's later
	// events; the refill's copies name the message before them, and it
	// applies the later ones again behind it (docs/reliability.md). Before
	// that, it found its mirror diverged at the first checkpoint after the
	// refill (3 of 4 replica runs) and repaired it from a snapshot.
	// Counted, not asserted: the oracle above holds either way.
	diverged := func(n *node) int { return strings.Count(n.out.String(), "the mirror diverged from the leader's") }
	t.Logf("stream lost whole figures: the old stream's last seq %d; created again after %s; the new one's last %d; "+
		"divergences found: standby %d, follower %d; %s",
		oldLast, recreated, info.State.LastSeq, diverged(pw.b), diverged(pw.f), figures)
}
