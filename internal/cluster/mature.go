package cluster

import (
	"context"
	"log/slog"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// MaturityStore is what the maturity duty needs of the mirror.
type MaturityStore interface {
	// Mature brings the matured digests up to now and says when the next
	// record matures.
	Mature(ctx context.Context, ages []time.Duration) (store.MatureResult, error)
	// HistoryWritten signals a write of history, which can bring the next
	// maturation nearer.
	HistoryWritten() <-chan struct{}
}

// Clock is the maturity duty's time.
type Clock interface {
	Now() time.Time
	// After receives once d has passed on this clock.
	After(d time.Duration) <-chan time.Time
}

type realClock struct{}

func (realClock) Now() time.Time                         { return time.Now() }
func (realClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// maturityRetry is how long the duty waits after a failed run (the mirror
// could not be written) before it tries again.
const maturityRetry = 10 * time.Second

// Maturity is the leader's duty of tags that mature ([maturity] after):
// it runs store.Mature when the next record matures, on a timer armed at
// that instant, and when history is written; it never polls the tags.
// The store's clock and Clock must agree (both the real time, or a test's).
type Maturity struct {
	Store  MaturityStore
	Ages   []time.Duration
	Clock  Clock // nil: the real time
	Logger *slog.Logger
}

// Run keeps the matured digests until ctx is done. A failed run is logged
// and tried again after maturityRetry, or at the next history write.
func (m *Maturity) Run(ctx context.Context) error {
	clk, log := m.Clock, m.Logger
	if clk == nil {
		clk = realClock{}
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	for {
		res, err := m.Store.Mature(ctx, m.Ages)
		var timer <-chan time.Time
		switch {
		case ctx.Err() != nil:
			return nil
		case err != nil:
			log.Error("maturity: could not update the matured digests; trying again", "in", maturityRetry.String(), "err", err)
			timer = clk.After(maturityRetry)
		case !res.Next.IsZero():
			timer = clk.After(res.Next.Sub(clk.Now()))
		}
		if res.Events > 0 {
			log.Debug("maturity: matured digests changed", "events", res.Events)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-timer:
		case <-m.Store.HistoryWritten():
		}
	}
}
