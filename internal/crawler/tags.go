package crawler

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// A crawl lists the tags of the whole organization in one listing
// (uidp.descendants_of the group, 200 a page), not repo by repo: a repo
// with three tags would otherwise cost a request of its own. The
// incremental crawl asks only for tags updated since the newest update
// time the mirror holds, less UpdatedSinceMargin, so an idle crawl costs
// the repo listing and one tag page. Tags that listing cannot see (a
// deprecation that did not move updateTime, a tag created with an old
// time) are the sweep's to find: it lists everything.

// tagListing is one pass over the organization's tags.
type tagListing struct {
	repos map[string]store.Repo // the repos to mirror, by uid
	// seen collects, per repo uid, the tag uids the listing showed; nil
	// when nobody needs them (only the sweep does).
	seen map[string]map[string]bool
	// unknown are repos whose tags came but that the repo listing did not
	// show (created in between): they are crawled on their own after.
	unknown map[string]bool
	// read are the tags whose history this crawl read or tried, kept only
	// when track is set: an updated_since crawl, whose pending histories
	// must not be read twice. A full listing, which holds the whole
	// organization's tags, does not keep them: a set of every uid would
	// grow the crawl's memory with the organization.
	read  sync.Map
	track bool
	// spare holds, during a baseline's listing, the tags whose history
	// the places the listings leave free may read (spare.go); nil when
	// none are free.
	spare *spareQueue
}

// listAllTags lists the organization's tags (those updated at or after
// since, when since is not zero) into the store, and reads the history of
// every tag the store says changed, in the crawler's pool of history reads.
// It returns when the listing and every read it started are done.
func (c *Crawler) listAllTags(ctx context.Context, l *tagListing, q platform.ListQuery, s *summary) error {
	err := c.retryRestarted("tag", func() error { return c.listTagsOnce(ctx, l, q, s) })
	if err != nil {
		return fmt.Errorf("list tags of group %s: %w", c.cfg.Group, err)
	}
	return nil
}

func (c *Crawler) listTagsOnce(ctx context.Context, l *tagListing, q platform.ListQuery, s *summary) error {
	g, gctx := errgroup.WithContext(ctx)
	// The applier hands the histories to read to a dispatcher through a
	// queue of their own, so that reads go on starting while the applier
	// waits for the writer.
	refs := make(chan store.TagRef, 4*tagPageSize)
	g.Go(func() error {
		for ref := range refs {
			if err := c.readHistory(gctx, g, l, ref, s); err != nil {
				return err
			}
		}
		return nil
	})
	closeSpare := func() {}
	if n := c.spareReads(); s.listOnly.Load() && n > 0 {
		sq := newSpareQueue()
		l.spare, closeSpare = sq, sq.close
		g.Go(func() error { return c.readSpare(gctx, sq, n, s) })
	}
	lister := c.client.Tags(c.cfg.Families.tagQuery(q))
	listed := func(page []platform.Tag) {
		if q.ChildrenOf == "" { // the organization's listing, not one repo's
			s.tagsTotal.Store(lister.Total())
		}
		s.tags.Add(int64(len(page)))
	}
	apply := func(page []platform.Tag) error { return c.applyTagPage(gctx, l, page, refs, s) }
	listErr := listPipelined(gctx, g, lister.Pages(gctx), listed, apply, func() {
		close(refs)
		closeSpare()
	})
	// A failed history read or apply cancels gctx, which stops the listing
	// with a context error: report the cause.
	if err := g.Wait(); err != nil {
		return err
	}
	return listErr
}

// tagPageSize is how many tags a page of the listing holds.
const tagPageSize = 200

// applyTagPage applies one page of the listing, the tags of every repo it
// holds in one transaction, and queues the history reads the store asks
// for (during the baseline: to the spare reads, if any).
func (c *Crawler) applyTagPage(
	ctx context.Context,
	l *tagListing,
	page []platform.Tag,
	refs chan<- store.TagRef,
	s *summary,
) error {
	var rts []store.RepoTags
	for repoUID, tags := range byRepo(page) {
		repo, ok := l.repos[repoUID]
		if !ok {
			if !c.failed.has(repoUID) && !c.excluded(repoUID) {
				l.unknown[repoUID] = true
			}
			continue
		}
		if l.seen != nil {
			seen := l.seen[repoUID]
			if seen == nil {
				seen = make(map[string]bool)
				l.seen[repoUID] = seen
			}
			for _, t := range tags {
				seen[t.UID] = true
			}
		}
		rts = append(rts, store.RepoTags{Repo: repo, Tags: tags})
	}
	if len(rts) == 0 {
		return nil
	}
	slices.SortFunc(rts, func(a, b store.RepoTags) int { return strings.Compare(a.Repo.UID, b.Repo.UID) })
	// The page's repos in one transaction: a commit each was most of the
	// listing's time between its requests.
	need, n, err := c.store.ApplyTagPage(finish(ctx), rts)
	if err != nil {
		return err
	}
	s.events.Add(int64(n))
	if s.listOnly.Load() {
		if l.spare != nil {
			l.spare.add(need)
		}
		return nil
	}
	for _, ref := range need {
		select {
		case refs <- ref:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// readHistories starts a history read of each ref in g.
func (c *Crawler) readHistories(
	ctx context.Context,
	g *errgroup.Group,
	l *tagListing,
	refs []store.TagRef,
	s *summary,
) error {
	for _, ref := range refs {
		if err := c.readHistory(ctx, g, l, ref, s); err != nil {
			return err
		}
	}
	return nil
}

// readHistory starts a history read of ref in g once a slot of the
// crawler's pool of history reads is free.
func (c *Crawler) readHistory(
	ctx context.Context,
	g *errgroup.Group,
	l *tagListing,
	ref store.TagRef,
	s *summary,
) error {
	if l.track {
		if _, dup := l.read.LoadOrStore(ref.UID, true); dup {
			return nil
		}
	}
	return c.startHistoryRead(ctx, g, ref, s, nil, nil)
}

// startHistoryRead starts the history read of ref in g once a slot of the
// crawler's pool of history reads is free, counting it queued in s; when
// set, requested is called once its requests are done (before the commit),
// and ended with the read's outcome, returning the goroutine's. The one
// way every crawl and the backfill start a read.
func (c *Crawler) startHistoryRead(
	ctx context.Context,
	g *errgroup.Group,
	ref store.TagRef,
	s *summary,
	requested func(),
	ended func(error) error,
) error {
	s.historyQueued.Add(1)
	if err := c.histories.Acquire(ctx, 1); err != nil {
		return err
	}
	// The read's slot is given back as soon as the request is done, not
	// after its commit: the next request need not wait for the writer.
	release := sync.OnceFunc(func() {
		c.histories.Release(1)
		if requested != nil {
			requested()
		}
	})
	g.Go(func() error {
		defer release()
		err := c.syncHistory(ctx, ref, s, release)
		if ended != nil {
			return ended(err)
		}
		return err
	})
	return nil
}

// readPending reads the histories the store holds as behind their
// listing and that this crawl has not tried: after an updated_since
// listing, the ones an earlier run failed to read.
func (c *Crawler) readPending(ctx context.Context, l *tagListing, s *summary) error {
	refs, err := c.store.PendingHistories(ctx, c.cfg.Group)
	if err != nil || len(refs) == 0 {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	err = c.readHistories(gctx, g, l, refs, s)
	return errors.Join(err, g.Wait())
}

// crawlUnknown crawls, repo by repo, the repos whose tags the listing
// showed but the repo listing did not: created between the two.
func (c *Crawler) crawlUnknown(ctx context.Context, l *tagListing, s *summary) error {
	for uid := range l.unknown {
		r, err := c.getRepo(ctx, uid)
		if err != nil || r == nil || !c.wanted(r.Name) {
			if scopeFailed(ctx, readErr(err)) {
				c.log.Warn("a repo created during the crawl could not be read; the next crawl will", "repo", uid, "err", err)
				continue
			}
			return err
		}
		repo, err := c.storeRepo(ctx, *r)
		if err != nil {
			return err
		}
		n, err := c.store.ApplyRepos(finish(ctx), []store.Repo{repo})
		if err != nil {
			return err
		}
		s.events.Add(int64(n))
		if _, err := c.crawlScope(ctx, repo, s); err != nil {
			return err
		}
	}
	return nil
}

// byRepo groups a page of tags by their repo's uid: the parent of the tag's.
func byRepo(page []platform.Tag) map[string][]store.Tag {
	out := make(map[string][]store.Tag)
	for _, t := range page {
		i := strings.LastIndexByte(t.UID, '/')
		if i < 0 {
			continue
		}
		out[t.UID[:i]] = append(out[t.UID[:i]], storeTag(t))
	}
	return out
}
