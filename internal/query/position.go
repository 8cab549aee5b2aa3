package query

import (
	"context"
	"sync"
	"time"
)

// Position is the stream sequence a replica's mirror has applied: every
// syncd event at or below it is in the mirror. It only grows, since a
// mirror never loses what it applied. A follower advances it after each
// batch it commits, a leader for each event JetStream acknowledged (the
// leader commits an event before publishing it).
type Position struct {
	mu      sync.Mutex
	seq     uint64
	changed chan struct{} // closed, and replaced, whenever seq grows
}

// NewPosition returns a position at 0: nothing known yet.
func NewPosition() *Position { return &Position{changed: make(chan struct{})} }

// Advance moves the position to seq, if that is further.
func (p *Position) Advance(seq uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if seq <= p.seq {
		return
	}
	p.seq = seq
	close(p.changed)
	p.changed = make(chan struct{})
}

// Seq is the position.
func (p *Position) Seq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

func (p *Position) watch() (uint64, <-chan struct{}) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq, p.changed
}

// Wait waits until the position reaches seq, for at most within; it
// reports whether it did.
func (p *Position) Wait(ctx context.Context, seq uint64, within time.Duration) bool {
	t := time.NewTimer(within)
	defer t.Stop()
	for {
		cur, changed := p.watch()
		if cur >= seq {
			return true
		}
		select {
		case <-changed:
		case <-t.C:
			return false
		case <-ctx.Done():
			return false
		}
	}
}
