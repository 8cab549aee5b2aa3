package crawler

import (
	"context"
	"fmt"
	"strings"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// The Refresh jobs are what pushed events ask for. They run beside the
// scheduled crawl rather than after it, so a push reaches NATS in seconds;
// the store's transactions make overlapping reads of the same tag harmless
// (ApplyHistory drops what it already has).
//
// A push during the baseline waits for its end (afterBaseline): the
// baseline's listings are its starting point, and a change after a tag's
// listing is news, which a refresh made then would take in silently, with
// its history read up to the move, so that no event announced it (not even
// with initial_events = "snapshot", where the tag's created event carried
// its state before the move).

// afterBaseline waits until the mirror is past its baseline.
func (c *Crawler) afterBaseline(ctx context.Context, what string) error {
	in, err := c.store.InBaseline(ctx)
	if err != nil || !in {
		return err
	}
	c.log.Debug("a push waits for the end of the baseline's listings", "refresh", what)
	c.waitingForBaseline.Add(1)
	defer c.waitingForBaseline.Add(-1)
	return c.store.WaitBaselineOver(ctx)
}

// RefreshRepos re-reads the repo list.
func (c *Crawler) RefreshRepos(ctx context.Context) error {
	if err := c.afterBaseline(ctx, "repos"); err != nil {
		return err
	}
	_, err := c.listRepos(ctx, &summary{})
	return err
}

// RefreshRepo re-reads one repo and its tags, and the history of the tags
// that changed.
func (c *Crawler) RefreshRepo(ctx context.Context, repoUID string) error {
	if err := c.afterBaseline(ctx, "repo "+repoUID); err != nil {
		return err
	}
	r, err := c.client.GetRepo(ctx, repoUID)
	if err != nil {
		if platform.IsNotFound(err) {
			// Gone upstream: the full sweep records deletions once it has
			// confirmed them; a push alone is not proof enough.
			return nil
		}
		return fmt.Errorf("refresh repo %s: %w", repoUID, err)
	}
	if !c.inScope(r.UID, r.Name) {
		return nil
	}
	repo, err := c.storeRepo(ctx, r)
	if err != nil {
		return err
	}
	if _, err := c.store.ApplyRepos(finish(ctx), []store.Repo{repo}); err != nil {
		return err
	}
	_, err = c.crawlRepo(ctx, repo, &summary{})
	return err
}

// RefreshTag re-reads one tag and its history. repo is the repo's uid, or
// its registry path (with or without the organization in front) when the
// event carried that. A tag of a family syncd does not mirror is ignored.
func (c *Crawler) RefreshTag(ctx context.Context, repo, tag string) error {
	if !c.cfg.Families.Includes(tag) {
		c.log.Debug("push for a tag of a family not mirrored", "repo", repo, "tag", tag)
		return nil
	}
	if err := c.afterBaseline(ctx, "tag "+repo+":"+tag); err != nil {
		return err
	}
	r, err := c.resolveRepo(ctx, repo)
	if err != nil || r == nil {
		return err
	}
	if !c.inScope(r.UID, r.Name) {
		return nil
	}
	sr, err := c.storeRepo(ctx, *r)
	if err != nil {
		return err
	}
	if _, err := c.store.ApplyRepos(finish(ctx), []store.Repo{sr}); err != nil {
		return err
	}
	var tags []store.Tag
	err = c.retryRestarted("tag", func() error {
		tags = tags[:0]
		q := c.cfg.Families.tagQuery(platform.ListQuery{ChildrenOf: r.UID, Name: tag})
		for t, err := range c.client.Tags(q).All(ctx) {
			if err != nil {
				return err
			}
			if t.Name == tag {
				tags = append(tags, storeTag(t))
			}
		}
		return nil
	}, "repo", sr.Path, "tag", tag)
	if err != nil {
		return fmt.Errorf("refresh tag %s:%s: %w", sr.Path, tag, err)
	}
	need, _, err := c.store.ApplyTags(finish(ctx), sr, tags)
	if err != nil {
		return err
	}
	// A pushed tag the backfill has yet to read is read now: the push says
	// it moved, and its moves are news waiting on the read.
	uids := make([]string, len(tags))
	for i, t := range tags {
		uids[i] = t.UID
	}
	pending, err := c.store.BackfillRefs(ctx, uids)
	if err != nil {
		return err
	}
	need = append(need, pending...)
	s := &summary{}
	for _, ref := range need {
		if err := c.syncHistory(ctx, ref, s, func() {}); err != nil {
			return err
		}
	}
	c.log.Debug(
		"refreshed tag",
		"repo",
		sr.Path,
		"tag",
		tag,
		"history_reads",
		s.historyReads.Load(),
		"events",
		s.events.Load(),
	)
	return nil
}

// resolveRepo finds a repo by uid (below the configured group) or by
// registry path, which a push may carry with the organization in front
// ("acme/charts/cert-manager"); nil when it does not exist.
func (c *Crawler) resolveRepo(ctx context.Context, ref string) (*platform.Repo, error) {
	if c.cfg.Group != "" && strings.HasPrefix(ref, c.cfg.Group+"/") {
		return c.getRepo(ctx, ref)
	}
	p := strings.TrimPrefix(ref, c.client.Organization()+"/")
	if known, ok, err := c.store.RepoByPath(ctx, p); err != nil {
		return nil, err
	} else if ok {
		return c.getRepo(ctx, known.UID)
	}
	// Not mirrored yet: the repos of that name, one of which has the path.
	name := p[strings.LastIndexByte(p, '/')+1:]
	var found *platform.Repo
	err := c.retryRestarted("repo", func() error {
		for r, err := range c.client.Repos(platform.ListQuery{DescendantsOf: c.cfg.Group, Name: name}).All(ctx) {
			if err != nil {
				return fmt.Errorf("find repo %q: %w", ref, err)
			}
			if r.Name != name {
				continue
			}
			if rp, err := c.paths.of(ctx, r.UID, r.Name); err != nil {
				return err
			} else if rp == p {
				found = &r
				return nil
			}
		}
		return nil
	}, "name", name)
	return found, err
}

// getRepo gets one repo; nil when it does not exist.
func (c *Crawler) getRepo(ctx context.Context, uid string) (*platform.Repo, error) {
	r, err := c.client.GetRepo(ctx, uid)
	if platform.IsNotFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("get repo %s: %w", uid, err)
	}
	return &r, nil
}

// inScope reports whether a repo belongs to what this syncd mirrors: below
// the configured group and wanted by the include and exclude patterns.
func (c *Crawler) inScope(uid, name string) bool {
	return (c.cfg.Group == "" || strings.HasPrefix(uid, c.cfg.Group+"/")) && c.wanted(name)
}
