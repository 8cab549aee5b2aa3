package platform

import (
	"container/list"
	"context"
	"sync"
)

// backgroundKey marks a context's requests as background work.
type backgroundKey struct{}

// InBackground returns a context whose requests are background work: when
// Config.MaxInFlight bounds the requests on the wire, they hold at most
// places of them at once, and a place that frees goes to a request that is
// not background first. A baseline's history reads made beside its
// listings use it, so that they fill the places the listings leave free
// without delaying a page or, stalled, holding every place. places < 1
// counts as 1.
func InBackground(ctx context.Context, places int) context.Context {
	return context.WithValue(ctx, backgroundKey{}, max(places, 1))
}

// backgroundPlaces returns the places ctx's requests may hold as
// background work, or 0 when they are not background.
func backgroundPlaces(ctx context.Context) int {
	n, _ := ctx.Value(backgroundKey{}).(int)
	return n
}

// places bounds the requests on the wire: a request takes a place before it
// is sent and gives it back once its answer is read. Waiting requests take
// the places that free in the order they came, those that are not
// background first; a background request only while fewer background
// requests than its bound hold a place.
type places struct {
	mu   sync.Mutex
	free int
	// background is how many places background requests hold.
	background int
	// waiting holds the requests that are not background, then
	// waitingBackground the others, each in the order they came.
	waiting, waitingBackground list.List // of *placeWaiter
}

type placeWaiter struct {
	bound int // a background request's, 0 otherwise
	ready chan struct{}
}

func newPlaces(n int) *places { return &places{free: n} }

// enter waits for a place for a request of ctx and returns the func that
// gives it back.
func (p *places) enter(ctx context.Context) (func(), error) {
	bound := backgroundPlaces(ctx)
	p.mu.Lock()
	if p.grantable(bound) && p.waiting.Len() == 0 && (bound == 0 || p.waitingBackground.Len() == 0) {
		p.take(bound)
		p.mu.Unlock()
		return p.leaver(bound), nil
	}
	w := &placeWaiter{bound: bound, ready: make(chan struct{})}
	queue := &p.waiting
	if bound > 0 {
		queue = &p.waitingBackground
	}
	e := queue.PushBack(w)
	p.mu.Unlock()
	select {
	case <-w.ready:
		return p.leaver(bound), nil
	case <-ctx.Done():
		p.mu.Lock()
		select {
		case <-w.ready:
			// Granted as the context ended: given back at once.
			p.leave(bound)
		default:
			queue.Remove(e)
			// A background request that waited may have held back the
			// ones behind it.
			p.grant()
		}
		p.mu.Unlock()
		return nil, ctx.Err()
	}
}

func (p *places) grantable(bound int) bool {
	return p.free > 0 && (bound == 0 || p.background < bound)
}

func (p *places) take(bound int) {
	p.free--
	if bound > 0 {
		p.background++
	}
}

func (p *places) leaver(bound int) func() {
	return sync.OnceFunc(func() {
		p.mu.Lock()
		p.leave(bound)
		p.mu.Unlock()
	})
}

// leave gives a place back and hands out the places free; p.mu is held.
func (p *places) leave(bound int) {
	p.free++
	if bound > 0 {
		p.background--
	}
	p.grant()
}

// grant hands the free places to the waiting requests that may take them;
// p.mu is held.
func (p *places) grant() {
	for p.free > 0 {
		e := p.waiting.Front()
		if e == nil {
			e = p.waitingBackground.Front()
			if e == nil || !p.grantable(e.Value.(*placeWaiter).bound) {
				return
			}
			p.waitingBackground.Remove(e)
		} else {
			p.waiting.Remove(e)
		}
		w := e.Value.(*placeWaiter)
		p.take(w.bound)
		close(w.ready)
	}
}
