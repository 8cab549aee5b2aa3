package crawler

import (
	"context"
)

// ResolveFollowed readies a mirror built from the stream for crawling, when
// its replica is promoted to leader, so that the first crawl costs no more
// requests than the old leader's next one would have:
//
//   - the failures the old leader recorded (crawl_failures, from its
//     crawl.failed records) are loaded again, so that the scopes it held
//     back stay held back until the same next attempt;
//   - the tags it knows only from the stream, whose history the old leader
//     had not read yet, go into the backfill (store.BackfillFollowed),
//     which reads each once behind the first crawl, as the old leader's
//     backfill would have.
//
// Nothing is read from the platform here: the leader's duties start at
// once.
func (c *Crawler) ResolveFollowed(ctx context.Context) error {
	if err := c.failed.reload(ctx); err != nil {
		return err
	}
	n, err := c.store.BackfillFollowed(ctx)
	if err != nil {
		return err
	}
	c.log.Info("readied the followed mirror for crawling", "backfill_queued", n, "failures", c.failed.count())
	return nil
}
