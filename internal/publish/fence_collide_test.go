package publish_test

import (
	"context"
	"testing"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// TestFence_RefusalNamingAnotherStreamsMarkerSeqStillSteps: the server
// refuses a deposed leader's KV write naming the newer term's marker in
// that bucket. That sequence is a number of the bucket's own stream; when
// it happens to equal this term's marker sequence on another stream (the
// event stream here), the refusal is still a newer term's: the deposed
// leader must end its term, warn and step down, not take it for a write
// sent before its own markers were laid again.
func TestFence_RefusalNamingAnotherStreamsMarkerSeqStillSteps(t *testing.T) {
	ctx := context.Background()
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	a, b := newFencedNode(c.JS, cfg, "a"), newFencedNode(c.JS, cfg, "b")
	guardBuckets(b.fence)
	k := mustOpenKV(t, c.JS, st)
	r := publish.NewRelay(c.JS, st, cfg, publish.WithKV(k), publish.WithFence(a.fence))
	// The tags bucket will hold a's marker (1), the 2 tags' puts (2, 3),
	// then b's marker (4): have a's marker on the event stream be 4 too.
	for last, _ := streamLast(t, c); last < 3; last, _ = streamLast(t, c) {
		if _, err := c.JS.Publish(ctx, testPrefix+".other.filler", []byte("{}")); err != nil {
			t.Fatal(err)
		}
	}
	mark(t, a.fence)
	if last, _ := streamLast(t, c); last != 4 {
		t.Fatalf("a's event stream marker at %d, want 4", last)
	}
	p.addRepos(ctx, "app", 1, 2)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	publish.SetBeforeKVApply(k, func([]store.Event) error {
		mark(t, b.fence)
		return nil
	})
	p.moveAll(ctx, 1)
	if err := r.Flush(ctx); err == nil {
		t.Fatal("the deposed leader's KV writes succeeded")
	}
	e, err := k.Bucket("tag").Get(ctx, publish.TermKey)
	if err != nil || e.Revision() != 4 {
		t.Fatalf("b's marker in the tags bucket: %v, %v; want revision 4", e, err)
	}
	assertFenced(t, a)
}

func streamLast(t *testing.T, c *publish.Conn) (uint64, string) {
	t.Helper()
	s, err := c.JS.Stream(context.Background(), testStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq, ""
}
