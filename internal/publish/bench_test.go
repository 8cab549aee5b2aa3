package publish_test

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// benchScale reads BENCH_SCALE (default 1), as `make bench-quick` sets it.
func benchScale(b *testing.B) float64 {
	s := os.Getenv("BENCH_SCALE")
	if s == "" {
		return 1
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || v <= 0 {
		b.Fatalf("BENCH_SCALE=%q: want a positive number", s)
	}
	return v
}

// BenchmarkRelay measures the relay's events/s against the ceiling of the
// same server in the same run: a plain loop that publishes messages of the
// same sizes with PublishMsgAsync and Msg-Id headers and waits for every
// acknowledgement. The relay publishes 20,000 events over 5,000 tags, four
// per tag in commit order, so per-resource ordering is exercised. The ratio
// metric is relay rate / plain rate.
//
// Store is the real thing: the relay reads the events from SQLite and marks
// them published there. MemoryOutbox relays the same events from memory,
// which isolates the relay's own pipeline from the store's costs.
func BenchmarkRelay(b *testing.B) {
	b.Run("Store", func(b *testing.B) { benchmarkRelay(b, false) })
	b.Run("MemoryOutbox", func(b *testing.B) { benchmarkRelay(b, true) })
}

// relayBench is the setup of a relay benchmark: how many tags to relay
// events of (5,000 at BENCH_SCALE 1), and a JetStream server to relay to.
func relayBench(b *testing.B) (tags int, cfg publish.Config, conn *publish.Conn) {
	srv := startServer(b, nil)
	cfg = srv.config(nil)
	return max(int(5000*benchScale(b)), 100), cfg, mustConnect(b, cfg)
}

const tagsPerRepo = 100

func benchmarkRelay(b *testing.B, inMemory bool) {
	ctx := context.Background()
	tags, cfg, conn := relayBench(b)
	// The plain loop gets a JetStream context of its own, with the library's
	// defaults, so that the relay's settings do not bound the ceiling.
	plainJS, err := jetstream.New(conn.NC)
	if err != nil {
		b.Fatal(err)
	}

	var plainTime, relayTime, plainCPU, relayCPU time.Duration
	var events int
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		st := mustOpenStore(b)
		p := newProducer(b, st)
		// Unique names per iteration, so that JetStream's duplicate window
		// does not turn this iteration's publishes into cheap duplicates.
		p.addRepos(ctx, fmt.Sprintf("bench%d", i), tags/tagsPerRepo, tagsPerRepo)
		p.moveAll(ctx, 3)
		evs, err := st.Unpublished(ctx, 0, 1<<30)
		if err != nil {
			b.Fatal(err)
		}
		var outbox publish.Outbox = st
		var mem *memOutbox
		if inMemory {
			mem = &memOutbox{events: evs}
			outbox = mem
		}
		relay := publish.NewRelay(conn.JS, outbox, cfg)
		plain := make([]*nats.Msg, len(evs))
		for j, e := range evs {
			m := relay.Message(e)
			// Same subject, size and headers as the relay's message; only the
			// id differs, so that JetStream stores both.
			m.Header.Set(jetstream.MsgIDHeader, fmt.Sprintf("plain-%d-%s", i, e.ID))
			plain[j] = m
		}
		n := len(evs)
		evs = nil
		// Each side starts with the setup's garbage collected, and holds
		// only what it needs: the plain loop its messages, the relay its
		// outbox.
		runtime.GC()
		b.StartTimer()
		start, cpu := time.Now(), publish.CPUTime()
		publishPlain(b, plainJS, plain)
		plainTime += time.Since(start)
		plainCPU += publish.CPUTime() - cpu
		b.StopTimer()
		plain = nil
		runtime.GC()
		b.StartTimer()

		start, cpu = time.Now(), publish.CPUTime()
		if err := relay.Flush(ctx); err != nil {
			b.Fatalf("relay: %v", err)
		}
		relayTime += time.Since(start)
		relayCPU += publish.CPUTime() - cpu
		events += n

		b.StopTimer()
		left, _, err := st.UnpublishedCount(ctx)
		if inMemory {
			left, err = n-mem.published, nil
		}
		if err != nil || left != 0 {
			b.Fatalf("after Flush: %d unpublished (%v)", left, err)
		}
		b.StartTimer()
	}
	reportVersus(b, events, side{"events/s", "relay-cpu-us/event", relayTime, relayCPU},
		side{"plain-msgs/s", "plain-cpu-us/event", plainTime, plainCPU})
}

// side is one side of a benchmark's comparison: the names of its rate
// and CPU metrics, and the wall and CPU time it took.
type side struct {
	rate, cpu  string
	wall, used time.Duration
}

// reportVersus reports the rates of both sides over events, measured's
// over plain's as the ratio, and the CPU of the process (client and
// server) per event: on a machine whose cores the server saturates, this
// is what the rates come down to.
func reportVersus(b *testing.B, events int, measured, plain side) {
	for _, s := range []side{measured, plain} {
		b.ReportMetric(float64(events)/s.wall.Seconds(), s.rate)
		b.ReportMetric(float64(s.used.Microseconds())/float64(events), s.cpu)
	}
	b.ReportMetric(plain.wall.Seconds()/measured.wall.Seconds(), "ratio")
}

// publishPlain is the ceiling: async publishes as fast as the library takes
// them, then a wait for every acknowledgement.
func publishPlain(b *testing.B, js jetstream.JetStream, msgs []*nats.Msg) {
	futs := make([]jetstream.PubAckFuture, len(msgs))
	for i, m := range msgs {
		// Stalls at the library's pending limit are its flow control, not
		// failures, on a machine busy with other work.
		f, err := js.PublishMsgAsync(m, jetstream.WithStallWait(time.Minute))
		if err != nil {
			b.Fatalf("plain publish: %v", err)
		}
		futs[i] = f
	}
	select {
	case <-js.PublishAsyncComplete():
	case <-time.After(time.Minute):
		b.Fatal("plain publishes not acknowledged within a minute")
	}
	for _, f := range futs {
		select {
		case <-f.Ok():
		case err := <-f.Err():
			b.Fatalf("plain publish: %v", err)
		}
	}
}

// memOutbox is an Outbox in memory, with events in seq order.
type memOutbox struct {
	events    []store.Event
	mu        sync.Mutex
	done      map[int64]bool
	published int
}

func (m *memOutbox) ReadUnpublished(_ context.Context, after int64, batch int, fn func([]store.Event) error) error {
	m.mu.Lock()
	var evs []store.Event
	for i := sort.Search(len(m.events), func(i int) bool { return m.events[i].Seq > after }); i < len(m.events); i++ {
		if !m.done[m.events[i].Seq] {
			evs = append(evs, m.events[i])
		}
	}
	m.mu.Unlock()
	for len(evs) > 0 {
		n := min(batch, len(evs))
		if err := fn(evs[:n:n]); err != nil {
			return err
		}
		evs = evs[n:]
	}
	return nil
}

func (m *memOutbox) MarkPublished(_ context.Context, seqs []int64) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.done == nil {
		m.done = make(map[int64]bool)
	}
	for _, s := range seqs {
		if !m.done[s] {
			m.done[s] = true
			m.published++
		}
	}
	return nil
}

func (m *memOutbox) Notify() <-chan struct{} { return nil }

// BenchmarkRelayKV measures the relay's cost of keeping the KV buckets:
// every iteration relays the same kind of outbox twice, to the stream
// alone and with the buckets kept (Flush returns once the buckets hold
// every state too), alternating which goes first so that a machine whose
// load drifts does not favour one side. The ratio metric is the rate with
// the buckets over the rate without.
//
// BENCH_KVMOVES sets the moves per tag (default 3; 0 gives one event per
// resource, as a full sync's outbox), BENCH_KVQUEUE the writer's queue
// (a small one stands for a relay much faster than the writer, as on a
// quiet machine), and BENCH_KVLOG=1 logs the relay keeping the buckets to
// stderr (dropped writes, reconciliations).
func BenchmarkRelayKV(b *testing.B) {
	ctx := context.Background()
	tags, cfg, conn := relayBench(b)
	kcfg := publish.KVConfig{Tags: "bench_tags", Repos: "bench_repos", Advisories: "bench_advisories", History: 1}

	var plainTime, kvTime, plainCPU, kvCPU time.Duration
	var events int
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		moves := 3
		if v := os.Getenv("BENCH_KVMOVES"); v != "" {
			moves, _ = strconv.Atoi(v)
		}
		sts := twoOutboxes(ctx, b, i, tags, moves)
		n, _, err := sts[0].UnpublishedCount(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if v := os.Getenv("BENCH_KVQUEUE"); v != "" {
			kcfg.Queue, _ = strconv.Atoi(v)
		}
		kv, err := publish.OpenKV(ctx, conn.JS, kcfg, sts[1])
		if err != nil {
			b.Fatal(err)
		}
		if _, err := kv.Reconcile(ctx); err != nil {
			b.Fatal(err)
		}
		runs := []func(){
			func() {
				start, cpu := time.Now(), publish.CPUTime()
				if err := publish.NewRelay(conn.JS, sts[0], cfg).Flush(ctx); err != nil {
					b.Fatalf("relay: %v", err)
				}
				plainTime += time.Since(start)
				plainCPU += publish.CPUTime() - cpu
			},
			func() {
				start, cpu := time.Now(), publish.CPUTime()
				kc := cfg
				if os.Getenv("BENCH_KVLOG") != "" {
					kc.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
				}
				if err := publish.NewRelay(conn.JS, sts[1], kc, publish.WithKV(kv)).Flush(ctx); err != nil {
					b.Fatalf("relay keeping KV: %v", err)
				}
				kvTime += time.Since(start)
				kvCPU += publish.CPUTime() - cpu
			},
		}
		if i%2 == 1 {
			runs[0], runs[1] = runs[1], runs[0]
		}
		for _, run := range runs {
			runtime.GC()
			b.StartTimer()
			run()
			b.StopTimer()
		}
		events += n
	}
	reportVersus(b, events, side{"kv-events/s", "kv-cpu-us/event", kvTime, kvCPU},
		side{"plain-events/s", "plain-cpu-us/event", plainTime, plainCPU})
}

// BenchmarkRelaySync measures what the embedded server's sync_interval
// costs the relay: every iteration relays the same kind of outbox to an
// embedded server with JetStream's lazy default (a background fsync every
// 2 minutes) and to one with BENCH_SYNC (default "always": every message
// on disk before its acknowledgement; "1s" is syncd's default), both
// storing on the same disk, alternating which goes first. The ratio metric
// is the rate with BENCH_SYNC over the rate with the lazy default.
func BenchmarkRelaySync(b *testing.B) {
	ctx := context.Background()
	tags := max(int(5000*benchScale(b)), 100)
	setting := cmp.Or(os.Getenv("BENCH_SYNC"), "always")
	measured, err := publish.ParseSync(setting)
	if err != nil {
		b.Fatalf("BENCH_SYNC: %v", err)
	}
	conns := make([]*publish.Conn, 2)
	for j, sync := range []publish.EmbeddedSync{{Interval: 2 * time.Minute}, measured} {
		cfg := publish.Config{DataDir: b.TempDir(), SubjectPrefix: testPrefix, Stream: testStream, MaxAge: time.Hour,
			DuplicateWindow: 10 * time.Minute, Source: testSource, Sync: sync}
		conns[j] = mustConnect(b, cfg)
	}
	cfg := publish.Config{SubjectPrefix: testPrefix, Stream: testStream, Source: testSource}

	var times, cpus [2]time.Duration
	var events int
	for i := 0; i < b.N; i++ {
		b.StopTimer()
		sts := twoOutboxes(ctx, b, i, tags, 3)
		n, _, err := sts[0].UnpublishedCount(ctx)
		if err != nil {
			b.Fatal(err)
		}
		order := []int{0, 1}
		if i%2 == 1 {
			order = []int{1, 0}
		}
		for _, j := range order {
			runtime.GC()
			b.StartTimer()
			start, cpu := time.Now(), publish.CPUTime()
			if err := publish.NewRelay(conns[j].JS, sts[j], cfg).Flush(ctx); err != nil {
				b.Fatalf("relay (side %d): %v", j, err)
			}
			times[j] += time.Since(start)
			cpus[j] += publish.CPUTime() - cpu
			b.StopTimer()
		}
		events += n
	}
	reportVersus(b, events, side{"sync-events/s", "sync-cpu-us/event", times[1], cpus[1]},
		side{"lazy-events/s", "lazy-cpu-us/event", times[0], cpus[0]})
}

// twoOutboxes opens two stores whose outboxes hold the same kind of
// events, under names of their own (iteration i), so that JetStream's
// duplicate window drops none: tags tags, each created and moved moves
// times.
func twoOutboxes(ctx context.Context, b *testing.B, i, tags, moves int) [2]*store.Store {
	var sts [2]*store.Store
	for j := range sts {
		sts[j] = mustOpenStore(b)
		p := newProducer(b, sts[j])
		p.addRepos(ctx, fmt.Sprintf("bench%d-%d", i, j), tags/tagsPerRepo, tagsPerRepo)
		p.moveAll(ctx, moves)
	}
	return sts
}
