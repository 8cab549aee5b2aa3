package crawler

import (
	"container/heap"
	"context"
	"errors"
	"sync"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// Spare reads. The baseline lists the current state before any history is
// read (the backfill's), but its listings are pages one after another: the
// tag listing and the advisories' keep two requests on the wire, and the
// client's other places stay empty until they end, 6 of a 77 s
// latency-bound first sync of 50,000 tags. When no request rate bounds the
// client, those places read the histories of the tags listed so far, the
// newest update first, and what they read is out of the backfill. With a
// rate, the listings take every request it allows, and nothing is read
// before they end.
//
// The reads are the client's background work (platform.InBackground): a
// place that frees goes to a listing's next page first, and the reads hold
// all the places but listingPlaces, which the listings keep for when every
// read is stalled.

// listingPlaces are the places on the wire no spare read takes.
const listingPlaces = 1

// spareCap bounds the tags waiting for a spare read: the newest ones are
// kept; those dropped are the backfill's.
const spareCap = 4096

// spareReads is how many history reads may go on during a baseline's
// listings: the places of the client's bound on the wire (MaxInFlight)
// the listings leave, when no request rate bounds it; else none. A client
// without a bound has no count of its places to spare.
func (c *Crawler) spareReads() int {
	if c.client.RequestsPerSecond() > 0 {
		return 0
	}
	return max(0, c.client.MaxInFlight()-listingPlaces)
}

// spareQueue holds the tags listed so far whose history a spare read may
// read: the spareCap newest, handed out newest first.
type spareQueue struct {
	mu   sync.Mutex
	refs oldestFirst
	// out are the tags handed out whose read has not ended: a tag the
	// listing shows again meanwhile (it moved between two pages) is not
	// read twice at once. Once its read is committed, the store asks for
	// it again only if a later listing moved it. (A set of every tag read
	// grew with the organization: 10 MB of a 200,000-tag first sync.)
	out       map[string]bool
	more      chan struct{} // a tag was added
	done      chan struct{} // closed by close
	closeOnce sync.Once
}

func newSpareQueue() *spareQueue {
	return &spareQueue{out: map[string]bool{}, more: make(chan struct{}, 1), done: make(chan struct{})}
}

// add queues refs, dropping the oldest past spareCap.
func (q *spareQueue) add(refs []store.TagRef) {
	if len(refs) == 0 {
		return
	}
	q.mu.Lock()
	for _, r := range refs {
		// A read stops at the time its listing showed: without one, the
		// tag is the backfill's.
		if q.out[r.UID] || r.UpdateTime.IsZero() {
			continue
		}
		heap.Push(&q.refs, r)
		if q.refs.Len() > spareCap {
			heap.Pop(&q.refs)
		}
	}
	q.mu.Unlock()
	select {
	case q.more <- struct{}{}:
	default:
	}
}

// close ends the queue: the listing is over, and what it holds is the
// backfill's.
func (q *spareQueue) close() { q.closeOnce.Do(func() { close(q.done) }) }

// ended forgets that the read of uid is under way.
func (q *spareQueue) ended(uid string) {
	q.mu.Lock()
	delete(q.out, uid)
	q.mu.Unlock()
}

// isClosed reports whether close was called.
func (q *spareQueue) isClosed() bool {
	select {
	case <-q.done:
		return true
	default:
		return false
	}
}

// next returns the newest tag queued, waiting for one; false once the
// queue is closed or ctx done.
func (q *spareQueue) next(ctx context.Context) (store.TagRef, bool) {
	for {
		if q.isClosed() {
			return store.TagRef{}, false
		}
		q.mu.Lock()
		for q.refs.Len() > 0 {
			newest := 0
			for i := 1; i < q.refs.Len(); i++ {
				if q.refs[i].UpdateTime.After(q.refs[newest].UpdateTime) {
					newest = i
				}
			}
			r := heap.Remove(&q.refs, newest).(store.TagRef)
			if q.out[r.UID] {
				continue
			}
			q.out[r.UID] = true
			q.mu.Unlock()
			return r, true
		}
		q.mu.Unlock()
		select {
		case <-q.more:
		case <-q.done:
		case <-ctx.Done():
			return store.TagRef{}, false
		}
	}
}

// oldestFirst is a heap of tags by update time, the oldest on top: the one
// dropped when the queue is full.
type oldestFirst []store.TagRef

func (h oldestFirst) Len() int           { return len(h) }
func (h oldestFirst) Less(i, j int) bool { return h[i].UpdateTime.Before(h[j].UpdateTime) }
func (h oldestFirst) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *oldestFirst) Push(x any)        { *h = append(*h, x.(store.TagRef)) }
func (h *oldestFirst) Pop() any {
	old := *h
	r := old[len(old)-1]
	old[len(old)-1] = store.TagRef{}
	*h = old[:len(old)-1]
	return r
}

// readSpare reads the histories q hands out, at most places at a time on
// the wire, until q is closed: the listings are over, and so are the reads
// still under way, whose tags stay the backfill's. The end of the listings
// never waits for a history read (one whose repo does not answer is
// retried for minutes).
func (c *Crawler) readSpare(ctx context.Context, q *spareQueue, places int, s *summary) error {
	base, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(base)
	go func() {
		select {
		case <-q.done:
			cancel()
		case <-gctx.Done():
		}
	}()
	// Twice as many reads go as they have places, as in the backfill
	// (Crawler.histories): the one waiting for a place takes it the moment
	// a request ends, where one started then left the place empty while
	// it was dispatched (the places 13 of 16 busy during the listings).
	slots := semaphore.NewWeighted(int64(2 * places))
	bg := platform.InBackground(gctx, places)
	for {
		ref, ok := q.next(gctx)
		if !ok || slots.Acquire(gctx, 1) != nil {
			break
		}
		// The read's place goes back when its request ends, not its commit.
		if c.startHistoryRead(bg, g, ref, s, func() { slots.Release(1) }, func(err error) error {
			q.ended(ref.UID)
			// A read cut short by the end of the listings did not fail;
			// any other error is the crawl's.
			if errors.Is(err, context.Canceled) && ctx.Err() == nil && q.isClosed() {
				return nil
			}
			return err
		}) != nil {
			break
		}
	}
	return g.Wait()
}
