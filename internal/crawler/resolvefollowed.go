package crawler

import (
	"context"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/store"
)

// ResolveFollowed readies a mirror built from the stream for crawling, when
// its replica is promoted to leader: the tags it knows only from the stream
// get the history the old leader had (see store.ResolveHistory), so that the
// first crawl announces only what is new. The reads share the crawler's
// pool of history reads; one that fails leaves its tag to be read silently.
func (c *Crawler) ResolveFollowed(ctx context.Context) error {
	refs, err := c.store.UnresolvedTags(ctx)
	if err != nil || len(refs) == 0 {
		return err
	}
	start := c.cfg.Now()
	g, gctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	resolved := 0
	for _, ref := range refs {
		if err := c.histories.Acquire(gctx, 1); err != nil {
			break // gctx is done: g.Wait says why
		}
		g.Go(func() error {
			ok, err := c.resolveHistory(gctx, ref)
			if ok {
				mu.Lock()
				resolved++
				mu.Unlock()
			}
			return err
		})
	}
	if err = g.Wait(); err == nil {
		err = ctx.Err()
	}
	c.log.Info(
		"readied the followed mirror for crawling",
		"tags",
		len(refs),
		"resolved",
		resolved,
		"took",
		c.cfg.Now().Sub(start).Round(time.Millisecond).String(),
	)
	return err
}

// resolveHistory reads one tag's whole history and resolves the tag with
// it, holding a slot of the history pool until the read is done.
func (c *Crawler) resolveHistory(ctx context.Context, ref store.TagRef) (bool, error) {
	recs, err := c.client.HistorySince(ctx, c.client.PrivateImage(ref.Path), ref.Name, time.Time{})
	c.histories.Release(1)
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		c.log.Warn(
			"read history to ready a tag for crawling; its history is read silently",
			"repo",
			ref.Path,
			"tag",
			ref.Name,
			"err",
			err,
		)
		return false, nil
	}
	out := make([]store.HistoryRecord, len(recs))
	for i, rec := range recs {
		out[i] = store.HistoryRecord{Time: rec.UpdateTimestamp, Digest: rec.Digest}
	}
	if _, err := c.store.ResolveHistory(ctx, ref, out); err != nil {
		return false, err
	}
	return true, nil
}
