package crawler

import "context"

// CrawlOnly runs the scheduled crawl's job without its backfill, as Run's
// crawl job does: the backfill's tests start it on their own.
func CrawlOnly(c *Crawler, ctx context.Context) (Summary, error) { return c.sync(ctx) }

// SetBeforeSkip runs f each time the backfill asks whether to leave a tag
// of the store's answer out, with a report of the reads under way.
func SetBeforeSkip(c *Crawler, f func(uid string, underWay func(uid string) bool)) { c.beforeSkip = f }

// WaitingForBaseline is how many pushes' refreshes wait for the end of the
// baseline.
func WaitingForBaseline(c *Crawler) int64 { return c.waitingForBaseline.Load() }
