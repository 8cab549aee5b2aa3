package publish_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestKV_ABucketLostWholeIsMadeAgain: a KV bucket lost whole under a
// running relay (deleted here; NATS can lose a stream whole, and a bucket
// is one) is made again by the relay's next reconciliation, which writes
// it the mirror's whole state; the log says so, and the relay reports no
// failure once it is back.
func TestKV_ABucketLostWholeIsMadeAgain(t *testing.T) {
	ctx := context.Background()
	publish.SetKVRetry(t, 100*time.Millisecond, 200*time.Millisecond)
	w := startKVRelay(t)
	c, r, p, kcfg, logs := w.c, w.relay, w.p, w.kcfg, w.logs
	p.addRepos(ctx, "before", 2, 3)
	tagsIn := func(want int) func() error {
		return func() error {
			tags, err := c.JS.KeyValue(ctx, kcfg.Tags)
			if err != nil {
				return fmt.Errorf("the tags bucket: %w", err)
			}
			if n := len(tagValues(t, tags)); n != want {
				return fmt.Errorf("the tags bucket holds %d keys, want %d", n, want)
			}
			if err := r.Err(); err != nil {
				return fmt.Errorf("relay's Err: %w", err)
			}
			return nil
		}
	}
	testutil.Eventually(t, 20*time.Second, tagsIn(6))

	if err := c.JS.DeleteKeyValue(ctx, kcfg.Tags); err != nil {
		t.Fatal(err)
	}
	p.addRepos(ctx, "after", 1, 2)
	testutil.Eventually(t, 30*time.Second, tagsIn(8))
	if !strings.Contains(logs.String(), "was gone (lost by NATS, or deleted); made it again") {
		t.Errorf("the log does not say the bucket was made again:\n%s", logs.String())
	}
}

// kvRelayWorld is a relay keeping the test's buckets, running on a
// server of its own until the test ends.
type kvRelayWorld struct {
	srv   testServer
	c     *publish.Conn
	st    *store.Store
	p     *producer
	relay *publish.Relay
	kcfg  publish.KVConfig
	logs  *logBuffer
}

func startKVRelay(t *testing.T) *kvRelayWorld { return startKVRelayFenced(t, nil) }

// startKVRelayFenced is startKVRelay with the relay's writes fenced by
// the fence fence makes on its connection, when fence is not nil: the
// term is marked before the relay starts.
func startKVRelayFenced(t *testing.T, fence func(jetstream.JetStream, publish.Config) *publish.Fence) *kvRelayWorld {
	t.Helper()
	w := &kvRelayWorld{srv: startServer(t, nil), logs: &logBuffer{}, kcfg: kvTestConfig()}
	cfg := w.srv.config(w.logs.logger())
	w.c, w.st = mustConnect(t, cfg), mustOpenStore(t)
	w.p = newProducer(t, w.st)
	w.kcfg.Logger = w.logs.logger()
	k, err := publish.OpenKV(context.Background(), w.c.JS, w.kcfg, w.st)
	if err != nil {
		t.Fatal(err)
	}
	opts := []publish.RelayOption{publish.WithKV(k)}
	var f *publish.Fence
	if fence != nil {
		f = fence(w.c.JS, cfg)
		opts = append(opts, publish.WithFence(f))
	}
	w.relay = publish.NewRelay(w.c.JS, w.st, cfg, opts...)
	if f != nil {
		mark(t, f)
	}
	startRelay(t, w.relay)
	return w
}

// TestKV_ABucketItMayNotManageStaysGone: with manage_stream = false
// (CheckOnly) a lost bucket is not made again; the relay's failure says
// why, and names the bucket.
func TestKV_ABucketItMayNotManageStaysGone(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	cfg := srv.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	publish.SetKVRetry(t, 100*time.Millisecond, 200*time.Millisecond)
	mustOpenKV(t, c.JS, st) // the buckets exist, as their operator made them
	kcfg := kvTestConfig()
	kcfg.CheckOnly = true
	k, err := publish.OpenKV(ctx, c.JS, kcfg, st)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.JS.DeleteKeyValue(ctx, kcfg.Tags); err != nil {
		t.Fatal(err)
	}
	r := publish.NewRelay(c.JS, st, cfg, publish.WithKV(k))
	startRelay(t, r)
	p.addRepos(ctx, "orphan", 1, 2)
	testutil.Eventually(t, 20*time.Second, func() error {
		want := "KV bucket " + kcfg.Tags + " is gone, and nats.manage_stream = false"
		if err := r.Err(); err == nil || !strings.Contains(err.Error(), want) {
			return fmt.Errorf("relay's Err = %v, want the lost bucket named", err)
		}
		return nil
	})
	if _, err := c.JS.KeyValue(ctx, kcfg.Tags); err == nil {
		t.Error("the bucket was made again, want it left to its operator")
	}
}
