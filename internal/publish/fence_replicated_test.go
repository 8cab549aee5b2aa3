package publish_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// replicatedWorld is a three-node JetStream cluster with the test's stream
// and KV buckets at three replicas, and a store with its producer.
type replicatedWorld struct {
	cfg publish.Config
	c   *publish.Conn
	st  *store.Store
	p   *producer
	k   *publish.KV
}

func startReplicated(t *testing.T) *replicatedWorld { return startReplicatedTB(t) }

// startReplicatedTB is startReplicated for a test or a benchmark.
func startReplicatedTB(t testing.TB) *replicatedWorld {
	t.Helper()
	cluster := testutil.NATSClusterOf(t, 3)
	cluster.WaitJetStream(t, 20*time.Second)
	cfg := configFor(cluster.URLs(), nil)
	cfg.Replicas = 3
	w := &replicatedWorld{cfg: cfg, c: mustConnect(t, cfg), st: mustOpenStore(t)}
	w.p = newProducer(t, w.st)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	kc := kvTestConfig()
	kc.Replicas = 3
	k, err := publish.OpenKV(ctx, w.c.JS, kc, w.st)
	if err != nil {
		t.Fatalf("open KV: %v", err)
	}
	w.k = k
	// Every stream has elected its leader before the test writes.
	for _, name := range []string{testStream, "KV_" + kc.Tags, "KV_" + kc.Repos, "KV_" + kc.Advisories} {
		testutil.WaitFor(t, 20*time.Second, "stream "+name+" to elect its leader", func() bool {
			s, err := w.c.JS.Stream(context.Background(), name)
			return err == nil && s.CachedInfo().Cluster != nil && s.CachedInfo().Cluster.Leader != ""
		})
	}
	return w
}

// TestFence_ReplicatedStreamPipelinesWithinLanes: on streams and buckets
// of three replicas, a term of ReplicatedLanes lanes publishes a baseline
// of a thousand events, and writes their states to the buckets, without one
// write refused: no two writes in flight are conditional on one lane's
// marker (with one lane, JetStream refuses all but one at a time, 10164).
// After another replica's term began, nothing of the older term lands, on
// the stream or in the buckets, and the older term's replica steps down.
func TestFence_ReplicatedStreamPipelinesWithinLanes(t *testing.T) {
	ctx := context.Background()
	w := startReplicated(t)
	a := newLanedNode(w.c.JS, w.cfg, "a", publish.ReplicatedLanes)
	b := newLanedNode(w.c.JS, w.cfg, "b", publish.ReplicatedLanes)
	guardBuckets(b.fence)
	r := publish.NewRelay(w.c.JS, w.st, w.cfg, publish.WithKV(w.k), publish.WithFence(a.fence))
	mark(t, a.fence)
	w.p.addRepos(ctx, "app", 20, 50)
	if err := r.Flush(ctx); err != nil {
		t.Fatalf("flush within the term: %v", err)
	}
	if n, _, _ := w.st.UnpublishedCount(ctx); n != 0 {
		t.Fatalf("%d events unpublished after the flush", n)
	}
	tags := w.k.Bucket("tag")
	want := withoutMarker(t, bucketContents(t, tags))
	if len(want) != 1000 {
		t.Fatalf("tags bucket holds %d tags, want 1000", len(want))
	}
	if a.fence.Refused() != 0 {
		t.Fatalf("%d writes refused within the term", a.fence.Refused())
	}

	before, _ := streamState(t, w.c.JS)
	publish.SetBeforeKVApply(w.k, func([]store.Event) error {
		mark(t, b.fence) // the newer term begins between the publishing and the KV writes
		return nil
	})
	w.p.moveAll(ctx, 1)
	moves, _, _ := w.st.UnpublishedCount(ctx)
	if err := r.Flush(ctx); err == nil {
		t.Fatal("the deposed leader's KV writes succeeded")
	}
	assertOnlyMarkersSince(t, w.c.JS, before, int(moves), publish.ReplicatedLanes)
	if diff := sameValues(want, withoutMarker(t, bucketContents(t, tags))); diff != "" {
		t.Errorf("tags bucket changed after the newer term began: %s", diff)
	}
	assertFenced(t, a)

	publish.SetBeforeKVApply(w.k, nil)
	w.p.updateAll(ctx)
	if err := r.Flush(ctx); !errors.Is(err, publish.ErrFenced) {
		t.Errorf("a flush after the step-down: %v, want ErrFenced before anything is sent", err)
	}
}

// assertOnlyMarkersSince checks that, after the events ahead of it
// (moves published before the newer term began), the stream gained only
// the newer term's lane markers since seq before.
func assertOnlyMarkersSince(t *testing.T, js jetstream.JetStream, before uint64, events, lanes int) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	markers, others := 0, 0
	for seq, last := before+1, lastSeq(t, s); seq <= last; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(m.Subject, publish.TermSubject(testPrefix)) {
			markers++
			continue
		}
		if markers > 0 {
			t.Errorf("seq %d (%s) after the newer term's marker: the deposed leader's write landed", seq, m.Subject)
		}
		others++
	}
	if markers != lanes || others != events {
		t.Errorf("since seq %d: %d markers (want %d) and %d events (want %d)", before, markers, lanes, others, events)
	}
}

// BenchmarkRelay_ReplicatedFenceLanes: the relay with the KV buckets on
// streams of three replicas publishes the same 10,100 events (100 repos of
// 100 tags) unfenced and fenced with ReplicatedLanes lanes, in the same
// run; it reports both rates and their ratio (go test -run '^$' -bench
// ReplicatedFenceLanes ./internal/publish/).
func BenchmarkRelay_ReplicatedFenceLanes(b *testing.B) {
	rate := func(b *testing.B, lanes int) float64 {
		w := startReplicatedTB(b)
		ctx := context.Background()
		opts := []publish.RelayOption{publish.WithKV(w.k)}
		var fence *publish.Fence
		if lanes > 0 {
			fence = publish.NewFence(w.c.JS, publish.FenceConfig{Node: "a", Format: w.cfg.Format(), Lanes: lanes})
			opts = append(opts, publish.WithFence(fence))
		}
		r := publish.NewRelay(w.c.JS, w.st, w.cfg, opts...)
		if fence != nil {
			if err := fence.Mark(ctx); err != nil {
				b.Fatal(err)
			}
		}
		w.p.addRepos(ctx, "app", 100, 100)
		n, _, _ := w.st.UnpublishedCount(ctx)
		start := time.Now()
		if err := r.Flush(ctx); err != nil {
			b.Fatal(err)
		}
		return float64(n) / time.Since(start).Seconds()
	}
	for range b.N {
		unfenced := rate(b, 0)
		fenced := rate(b, publish.ReplicatedLanes)
		b.ReportMetric(unfenced, "unfenced_events/s")
		b.ReportMetric(fenced, "fenced_events/s")
		b.ReportMetric(fenced/unfenced, "fenced/unfenced")
	}
}
