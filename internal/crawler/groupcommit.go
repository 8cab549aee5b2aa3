package crawler

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// historyCommitter writes history reads to the store in shared
// transactions. The first read to arrive commits, and goes on committing
// whatever queued up behind it meanwhile, until nothing waits; the others
// wait for their result. Reads that finish together share one commit: a
// commit per tag was most of an initial sync's cost.
//
// While other reads are still on the wire (reading), the first read waits
// for them, up to linger or until minBatch reads are queued, before it
// commits: with requests slower than commits, reads otherwise arrived one
// or two at a time, and a latency-bound sync made a commit of 1.7 tags on
// average, whose fixed cost (the bookmarks' lookup, statements parsed
// anew, the WAL frames of the pages every commit rewrites) was more than
// half of its writer's time: 2.6 s for 5,000 reads in 3,007 commits, 1.4 s
// in 530. A lone read, such as the one a push asks for, is committed at
// once.
type historyCommitter struct {
	store *store.Store
	// maxBatch bounds the tags in one transaction, so a large batch does
	// not hold the write lock for long.
	maxBatch int
	// reading, when set, counts the reads whose request has not ended;
	// linger and minBatch bound the wait for them.
	reading  *atomic.Int64
	linger   time.Duration
	minBatch int

	mu         sync.Mutex
	queue      []*historyWrite
	committing bool
	// more is signalled when a read is queued or a request ends.
	more chan struct{}
}

func newHistoryCommitter(st *store.Store, reading *atomic.Int64) *historyCommitter {
	return &historyCommitter{
		store:    st,
		maxBatch: 256,
		reading:  reading,
		linger:   commitLinger,
		minBatch: 64,
		more:     make(chan struct{}, 1),
	}
}

// commitLinger is how long the first read of a batch waits for the reads
// still on the wire: at 20 ms a request and 16 at once, about ten of them
// end in that time. The wait does not hold a place on the wire, and the
// reads waiting for their commit are bounded (Crawler.committing).
const commitLinger = 10 * time.Millisecond

type historyWrite struct {
	update store.HistoryUpdate
	done   chan struct{}
	events int
	err    error
}

// apply commits u, possibly with others, and returns the events it recorded.
func (hc *historyCommitter) apply(ctx context.Context, u store.HistoryUpdate) (int, error) {
	w := &historyWrite{update: u, done: make(chan struct{})}
	hc.mu.Lock()
	hc.queue = append(hc.queue, w)
	if hc.committing {
		hc.mu.Unlock()
		hc.signal()
		<-w.done
		return w.events, w.err
	}
	hc.committing = true
	hc.mu.Unlock()
	hc.gather(ctx)
	hc.mu.Lock()
	for len(hc.queue) > 0 {
		n := min(len(hc.queue), hc.maxBatch)
		batch := hc.queue[:n:n]
		hc.queue = hc.queue[n:]
		hc.mu.Unlock()
		hc.commit(ctx, batch)
		hc.mu.Lock()
	}
	hc.committing = false
	hc.mu.Unlock()
	<-w.done
	return w.events, w.err
}

// signal tells a gathering commit that a read was queued or a request
// ended.
func (hc *historyCommitter) signal() {
	if hc.more == nil {
		return
	}
	select {
	case hc.more <- struct{}{}:
	default:
	}
}

// gather waits, up to linger, while reads are on the wire and fewer than
// minBatch are queued.
func (hc *historyCommitter) gather(ctx context.Context) {
	if hc.reading == nil || hc.linger <= 0 {
		return
	}
	var timer *time.Timer
	for {
		hc.mu.Lock()
		queued := len(hc.queue)
		hc.mu.Unlock()
		if queued >= hc.minBatch || hc.reading.Load() <= 0 {
			break
		}
		if timer == nil {
			timer = time.NewTimer(hc.linger)
			defer timer.Stop()
		}
		select {
		case <-hc.more:
		case <-timer.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// commit writes one batch. The store reports events for the whole batch,
// so they are counted against its first read; a failed batch fails all.
func (hc *historyCommitter) commit(ctx context.Context, batch []*historyWrite) {
	ups := make([]store.HistoryUpdate, len(batch))
	for i, w := range batch {
		ups[i] = w.update
	}
	n, err := hc.store.ApplyHistories(finish(ctx), ups)
	for i, w := range batch {
		w.err = err
		if i == 0 {
			w.events = n
		}
		close(w.done)
	}
}

// maxPendingRecords is how many history records may wait, read, for their
// commit before no further read starts: about 12 MB of records, some
// twenty of the heaviest tags, where a bound by count alone let 8 ×
// concurrency heavy tags gather (0.6 MB each).
const maxPendingRecords = 100_000

// recordGate holds back new history reads while the records read and not
// yet committed reach its bound. A read that has its answer always adds it
// and goes on to its commit, which never waits for the gate, so the gate
// cannot deadlock; it bounds what waits to the bound plus the reads in
// flight.
type recordGate struct {
	mu    sync.Mutex
	held  int
	max   int
	freed chan struct{} // closed, and replaced, when records are committed
}

func newRecordGate(max int) *recordGate {
	return &recordGate{max: max, freed: make(chan struct{})}
}

// wait returns once the records held are below the bound.
func (g *recordGate) wait(ctx context.Context) error {
	for {
		g.mu.Lock()
		if g.held < g.max {
			g.mu.Unlock()
			return nil
		}
		freed := g.freed
		g.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// add counts n records read and waiting for their commit.
func (g *recordGate) add(n int) {
	g.mu.Lock()
	g.held += n
	g.mu.Unlock()
}

// done counts n records committed (or given up) and wakes the waiters.
func (g *recordGate) done(n int) {
	g.mu.Lock()
	g.held -= n
	close(g.freed)
	g.freed = make(chan struct{})
	g.mu.Unlock()
}
