package crawler

import (
	"context"
	"sync"

	"github.com/syncd-dev/syncd/internal/store"
)

// historyCommitter writes history reads to the store in shared
// transactions. The first read to arrive commits, and goes on committing
// whatever queued up behind it meanwhile, until nothing waits; the others
// wait for their result. A lone read is committed at once, and reads that
// finish together share one commit: a commit per tag was most of an
// initial sync's cost.
type historyCommitter struct {
	store *store.Store
	// maxBatch bounds the tags in one transaction, so a large batch does
	// not hold the write lock for long.
	maxBatch int

	mu         sync.Mutex
	queue      []*historyWrite
	committing bool
}

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
		<-w.done
		return w.events, w.err
	}
	hc.committing = true
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
