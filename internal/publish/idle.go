package publish

import (
	"context"
	"sync"
	"time"
)

// passGate tells whether a relay pass is under way, so that background
// work beside the relay (the stream audit) can give way to it: the relay
// is what puts a change on the stream within its latency, the audit has
// minutes.
type passGate struct {
	mu      sync.Mutex
	running int
	idle    chan struct{} // closed once running is back to zero
}

func (g *passGate) begin() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running == 0 {
		g.idle = make(chan struct{})
	}
	g.running++
}

func (g *passGate) end() {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.running--; g.running == 0 {
		close(g.idle)
	}
}

// wait returns once no pass is under way, or after longest, or when ctx
// is done (its error).
func (g *passGate) wait(ctx context.Context, longest time.Duration) error {
	g.mu.Lock()
	running, idle := g.running, g.idle
	g.mu.Unlock()
	if running == 0 {
		return ctx.Err()
	}
	t := time.NewTimer(longest)
	defer t.Stop()
	select {
	case <-idle:
		return nil
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// Idle returns once the relay has no pass under way, or after longest (so
// that what waits goes on under a relay that never rests), or when ctx is
// done (its error). The audit waits on it before each read.
func (r *Relay) Idle(ctx context.Context, longest time.Duration) error {
	return r.busy.wait(ctx, longest)
}
