package publish_test

import (
	"context"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/publish"
)

// TestFence_MaturedBucketWritableInTerm: in cluster mode with [maturity],
// the leader keeps the matured bucket too. Its writes are fenced like the
// other buckets', so a healthy leader, within its own term, must be able
// to write (here: delete a stray key in a reconciliation) and its
// reconciliation must succeed.
func TestFence_MaturedBucketWritableInTerm(t *testing.T) {
	ctx := context.Background()
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	kc := kvTestConfig()
	kc.Matured = "test_matured"
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	k, err := publish.OpenKV(octx, c.JS, kc, st)
	if err != nil {
		t.Fatal(err)
	}
	a := newFencedNode(c.JS, cfg, "a")
	r := publish.NewRelay(c.JS, st, cfg, publish.WithKV(k), publish.WithFence(a.fence))
	mark(t, a.fence)
	p.addRepos(ctx, "app", 1, 1)
	if err := r.Flush(ctx); err != nil {
		t.Fatalf("flush within the term: %v", err)
	}
	matured := k.Bucket("matured")
	if _, err := matured.Put(ctx, "stray.key.P1D", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Reconcile(ctx); err != nil {
		t.Errorf("the leader's reconciliation in its own term failed: %v", err)
	}
	if _, err := matured.Get(ctx, "stray.key.P1D"); err == nil {
		t.Error("the stray key of the matured bucket is still there: the leader could not write the bucket")
	}
	// Another replica's term fences this bucket's writes too.
	b := newFencedNode(c.JS, cfg, "b")
	guardBuckets(b.fence)
	b.fence.Guard("$KV."+kc.Matured+"."+publish.TermKey, "$KV."+kc.Matured+"."+publish.TermKey, "KV_"+kc.Matured)
	mark(t, b.fence)
	if _, err := matured.Put(ctx, "stray.key.P2D", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Reconcile(ctx); err == nil {
		t.Error("the deposed leader's reconciliation succeeded")
	}
	if _, err := matured.Get(ctx, "stray.key.P2D"); err != nil {
		t.Errorf("the deposed leader deleted a key of the matured bucket: %v", err)
	}
}
