package crawler

import "context"

// CrawlOnly runs the scheduled crawl's job without its backfill, as Run's
// crawl job does: the backfill's tests start it on their own.
func CrawlOnly(c *Crawler, ctx context.Context) (Summary, error) { return c.sync(ctx) }
