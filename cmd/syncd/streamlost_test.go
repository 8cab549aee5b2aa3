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
	var created time.Time
	testutil.WaitFor(t, 60*time.Second, "the leader to create the stream again", func() bool {
		s, err := pw.js.Stream(ctx, "SYNCD")
		if err != nil {
			return false
		}
		created = s.CachedInfo().Created
		return !created.Equal(oldCreated)
	})
	recreated := time.Since(lost).Round(time.Millisecond)
	time.Sleep(3 * time.Second) // data changes on the new stream
	figures := pw.finish(pw.a, pw.b)
	for _, n := range []*node{pw.b, pw.f} {
		if got := metaOf(n.dbPath, "stream_created"); got != created.UTC().Format(time.RFC3339Nano) {
			t.Errorf("%s's mirror counts the stream created at %q, want the new one's %s", n.name, got, created)
		}
	}
	for _, want := range []struct {
		n    *node
		line string
	}{
		{pw.a, "the stream was gone (lost by NATS, or deleted); created it again"},
		{pw.a, "the stream was created again"},
		{pw.b, "following it from its first message"},
		{pw.f, "following it from its first message"},
	} {
		if !strings.Contains(want.n.out.String(), want.line) {
			t.Errorf("%s's log lacks %q", want.n.name, want.line)
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
	t.Logf("stream lost whole figures: the old stream's last seq %d; created again after %s; the new one's last %d; %s",
		oldLast, recreated, info.State.LastSeq, figures)
}
