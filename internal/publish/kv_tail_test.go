package publish_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestKV_ABucketThatLostItsTailIsReconciled: the server restarts without
// the tags bucket's last writes (a crash before it synced them, as Jepsen
// found of NATS 2.12.1), so that three tags' keys hold their state before
// their last move again, and nothing tells a reader so. The relay's next
// write to the bucket is acknowledged at a sequence the bucket had
// acknowledged before: the relay reconciles the buckets, and every key
// holds its tag's state again, without waiting for the periodic
// reconciliation (off here). A fenced relay also marks its term again
// (the bucket's marker may be gone, or another term's at its sequence),
// once the lease is confirmed, and goes on.
func TestKV_ABucketThatLostItsTailIsReconciled(t *testing.T) {
	for _, fenced := range []bool{false, true} {
		name := "unfenced"
		if fenced {
			name = "fenced"
		}
		t.Run(name, func(t *testing.T) { kvLostTail(t, fenced) })
	}
}

func kvLostTail(t *testing.T, fenced bool) {
	ctx := context.Background()
	var remarks atomic.Int32
	var fence func(jetstream.JetStream, publish.Config) *publish.Fence
	if fenced {
		fence = func(js jetstream.JetStream, cfg publish.Config) *publish.Fence {
			f := newFencedNode(js, cfg, "a").fence
			f.SetRemark(func(ctx context.Context, lay func(context.Context) error) error {
				remarks.Add(1)
				return lay(ctx)
			})
			return f
		}
	}
	w := startKVRelayFenced(t, fence)
	srv, c, p, kcfg, logs := w.srv, w.c, w.p, w.kcfg, w.logs
	p.addRepos(ctx, "before", 2, 3)
	p.moveAll(ctx, 1)
	digests := func() (map[string]string, error) {
		tags, err := c.JS.KeyValue(ctx, kcfg.Tags)
		if err != nil {
			return nil, err
		}
		out := map[string]string{}
		for key, v := range tagValues(t, tags) {
			if publish.IsTermKey(key) {
				continue // the fence's marker
			}
			out[key] = v.Digest
		}
		return out, nil
	}
	// holds: the bucket holds n keys, want's of want's digests.
	holds := func(want map[string]string, n int) func() error {
		return func() error {
			got, err := digests()
			if err != nil {
				return err
			}
			var wrong []string
			for key, d := range want {
				if got[key] != d {
					wrong = append(wrong, key)
				}
			}
			if len(wrong) > 0 || len(got) != n {
				return fmt.Errorf("the tags bucket holds %d keys, want %d; of another digest: %v", len(got), n, wrong)
			}
			return nil
		}
	}
	var want map[string]string
	testutil.Eventually(t, 20*time.Second, func() error {
		got, err := digests()
		if err != nil {
			return err
		}
		for key, d := range got {
			if d != digest(1) {
				return fmt.Errorf("tag %s is at %s, not yet moved", key, d)
			}
		}
		if len(got) != 6 {
			return fmt.Errorf("the tags bucket holds %d keys, want 6", len(got))
		}
		want = got
		return nil
	})

	srv.Stop()
	srv.LoseTail("KV_"+kcfg.Tags, 3)
	srv.Start()
	testutil.Eventually(t, 10*time.Second, func() error {
		_, err := digests()
		return err
	})
	if err := holds(want, 6)(); err == nil {
		t.Fatal("the tags bucket holds every tag's state after it lost its last writes")
	} else {
		t.Logf("after the loss: %v", err)
	}

	p.addRepos(ctx, "after", 1, 1)
	testutil.Eventually(t, 20*time.Second, func() error {
		if err := holds(want, 7)(); err != nil {
			return fmt.Errorf("%w; log:\n%s", err, logs)
		}
		return nil
	})
	if !strings.Contains(logs.String(), "a KV bucket's stream lost its last writes") {
		t.Errorf("the log does not say the bucket lost its last writes:\n%s", logs.String())
	}
	if got := remarks.Load(); fenced && got == 0 {
		t.Error("the fenced relay did not mark its term again")
	}
}
