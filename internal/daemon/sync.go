package daemon

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/publish"
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
	flushErr := a.Relay.Flush(ctx)
	if flushErr != nil && !errors.Is(flushErr, publish.ErrKV) {
		return sum, 0, fmt.Errorf("publish: %w", flushErr)
	}
	n, _, err := a.Store.UnpublishedCount(ctx)
	if err != nil {
		return sum, 0, err
	}
	if n > 0 {
		return sum, 0, fmt.Errorf("publish: %d events still unpublished", n)
	}
	if flushErr != nil {
		return sum, time.Since(start), fmt.Errorf("every event is published, but the KV buckets are behind "+
			"(the next start reconciles them): %w", flushErr)
	}
	return sum, time.Since(start), nil
}
