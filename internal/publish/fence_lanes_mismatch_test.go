package publish_test

import (
	"context"
	"testing"

	"github.com/syncd-dev/syncd/internal/publish"
)

// TestFence_NewerTermWithFewerLanesFencesEveryLane: the lanes of a term
// are each replica's own reckoning (publish.LanesFor of the stream's
// replicas as it found them at start, and of its own [kv] replicas). A
// replica that reckons one lane (the stream scaled down to one replica
// since the other started, a [kv] replicas that differs, a rolling
// upgrade from a release without lanes) lays only lane 0's marker; the
// deposed leader, which writes on lanes 1 to 31, must still be refused.
func TestFence_NewerTermWithFewerLanesFencesEveryLane(t *testing.T) {
	ctx := context.Background()
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	a := newLanedNode(c.JS, cfg, "a", publish.ReplicatedLanes)
	b := newLanedNode(c.JS, cfg, "b", 1)
	guardBuckets(b.fence)
	k := mustOpenKV(t, c.JS, st)
	r := publish.NewRelay(c.JS, st, cfg, publish.WithKV(k), publish.WithFence(a.fence))
	mark(t, a.fence)
	p.addRepos(ctx, "app", 2, 2)
	if err := r.Flush(ctx); err != nil {
		t.Fatalf("flush within the term: %v", err)
	}
	tags := k.Bucket("tag")
	want := withoutMarker(t, bucketContents(t, tags))
	before, _ := streamState(t, c.JS)
	mark(t, b.fence)

	p.moveAll(ctx, 1)
	if err := r.Flush(ctx); err == nil {
		t.Error("the deposed leader's flush succeeded")
	}
	assertOnlyMarkersSince(t, c.JS, before, 0, publish.ReplicatedLanes)
	if diff := sameValues(want, withoutMarker(t, bucketContents(t, tags))); diff != "" {
		t.Errorf("tags bucket changed after the newer term began: %s", diff)
	}
}
