package crawler

import (
	"context"
	"errors"
	"fmt"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// publicTags are the tags of a public image that anonymous tokens may read.
var publicTags = [...]string{"latest", "latest-dev"}

// publicImages follows the history of the configured public images'
// latest and latest-dev tags, with anonymous registry tokens: no account
// is needed. Each image is mirrored as a repo named <public_org>/<image>,
// outside the organization's group, so sweeps never touch it.
func (c *Crawler) publicImages(ctx context.Context, s *summary) error {
	for _, img := range c.cfg.PublicImages {
		name := c.cfg.PublicOrg + "/" + img
		repo := store.Repo{UID: name, Name: name}
		if _, err := c.store.ApplyRepos(finish(ctx), []store.Repo{repo}); err != nil {
			return err
		}
		for _, tag := range publicTags {
			err := c.publicTag(ctx, repo, img, tag, s)
			if !scopeFailed(ctx, err) {
				if err != nil {
					return err
				}
				if _, err := c.failed.clear(finish(ctx), repo.UID+"/"+tag); err != nil {
					return err
				}
				continue
			}
			// One public image failing fails only itself.
			s.fail(err)
			f, rerr := c.failed.record(
				finish(ctx),
				store.Failure{Kind: "tag", UID: repo.UID + "/" + tag, RepoUID: repo.UID, Path: repo.Name, Tag: tag},
				err,
			)
			if rerr != nil {
				return rerr
			}
			c.log.Warn(
				"public image failed; the rest of the crawl goes on",
				"image",
				repo.Name,
				"tag",
				tag,
				"attempts",
				f.Attempts,
				"err",
				err,
			)
		}
	}
	return nil
}

func (c *Crawler) publicTag(ctx context.Context, repo store.Repo, img, tag string, s *summary) error {
	uid := repo.UID + "/" + tag
	b, err := c.store.TagBookmark(ctx, uid)
	if err != nil {
		return err
	}
	// The history is the only source of a public tag's digest: read it
	// from the bookmark, as for any tag.
	recs, err := c.client.HistorySince(ctx, c.client.PublicImage(img), tag, b.LastTime)
	var unwalkable *platform.UnwalkableError
	switch {
	case platform.IsNotFound(err):
		c.log.Debug("public image has no such tag", "image", repo.Name, "tag", tag)
		return nil
	case errors.As(err, &unwalkable):
		c.log.Warn("tag history cannot be read whole; keeping what was read", "repo", repo.Name, "tag", tag, "err", err)
	case err != nil:
		return readErr(fmt.Errorf("public image %s:%s: %w", repo.Name, tag, err))
	}
	s.historyReads.Add(1)
	if len(recs) == 0 {
		return nil
	}
	last := recs[len(recs)-1]
	t := store.Tag{UID: uid, Name: tag, Digest: last.Digest, UpdateTime: last.UpdateTimestamp}
	need, n, err := c.store.ApplyTags(finish(ctx), repo, []store.Tag{t})
	if err != nil {
		return err
	}
	s.events.Add(int64(n))
	s.tags.Add(1)
	for _, ref := range need {
		out := make([]store.HistoryRecord, len(recs))
		for i, r := range recs {
			out[i] = store.HistoryRecord{Time: r.UpdateTimestamp, Digest: r.Digest}
		}
		n, err := c.store.ApplyHistory(finish(ctx), ref, out, unwalkable == nil)
		if err != nil {
			return err
		}
		s.historyRecords.Add(int64(len(recs)))
		s.events.Add(int64(n))
	}
	return nil
}

// SyncPublicImages follows the configured public images once.
func (c *Crawler) SyncPublicImages(ctx context.Context) error {
	return c.publicImages(ctx, &summary{})
}
