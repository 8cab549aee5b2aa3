package publish_test

import (
	"context"
	"fmt"
	"os"
	"runtime"
	"sort"
	"strconv"
	"sync"
	"syscall"
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

func benchmarkRelay(b *testing.B, inMemory bool) {
	ctx := context.Background()
	tags := max(int(5000*benchScale(b)), 100)
	const tagsPerRepo = 100
	srv := startServer(b, nil)
	cfg := srv.config(nil)
	conn := mustConnect(b, cfg)
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
		start, cpu := time.Now(), cpuTime()
		publishPlain(b, plainJS, plain)
		plainTime += time.Since(start)
		plainCPU += cpuTime() - cpu
		b.StopTimer()
		plain = nil
		runtime.GC()
		b.StartTimer()

		start, cpu = time.Now(), cpuTime()
		if err := relay.Flush(ctx); err != nil {
			b.Fatalf("relay: %v", err)
		}
		relayTime += time.Since(start)
		relayCPU += cpuTime() - cpu
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
	relayRate := float64(events) / relayTime.Seconds()
	plainRate := float64(events) / plainTime.Seconds()
	b.ReportMetric(relayRate, "events/s")
	b.ReportMetric(plainRate, "plain-msgs/s")
	b.ReportMetric(relayRate/plainRate, "ratio")
	// CPU of the process (relay or loop, client and server) per event: on
	// a machine whose cores the server saturates, this is what the rates
	// come down to.
	b.ReportMetric(float64(relayCPU.Microseconds())/float64(events), "relay-cpu-us/event")
	b.ReportMetric(float64(plainCPU.Microseconds())/float64(events), "plain-cpu-us/event")
}

// cpuTime is the CPU time the process has used, user and system.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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
