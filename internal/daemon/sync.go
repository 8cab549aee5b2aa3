package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/syncd-dev/syncd/internal/crawler"
)

// SyncOnce is "syncd sync --once": one sweep (every job in one: repos,
// tags, history, advisories and confirmed deletions), then every
// resulting event published. It returns the sweep's summary and how long
// publishing took.
func (a *App) SyncOnce(ctx context.Context) (crawler.Summary, time.Duration, error) {
	if a.Fence != nil {
		// No lease term: every write would be refused, after the crawl.
		return crawler.Summary{}, 0, errors.New(
			`"sync --once" does not write in cluster mode ([cluster] enabled): only the lease holder's "syncd run" writes, fenced by its lease term (docs/cluster.md, "Fencing")`,
		)
	}
	sum, err := a.Crawler.Sweep(ctx)
	if err != nil {
		return sum, 0, fmt.Errorf("crawl: %w", err)
	}
	start := time.Now()
	if err := a.Relay.Flush(ctx); err != nil {
		return sum, 0, fmt.Errorf("publish: %w", err)
	}
	n, _, err := a.Store.UnpublishedCount(ctx)
	if err != nil {
		return sum, 0, err
	}
	if n > 0 {
		return sum, 0, fmt.Errorf("publish: %d events still unpublished", n)
	}
	return sum, time.Since(start), nil
}
