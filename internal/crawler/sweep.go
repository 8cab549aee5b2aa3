package crawler

import (
	"context"
	"fmt"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// confirmGone keeps the candidates for which get answers 404: an
// unconfirmed deletion is never recorded. A candidate whose Get fails
// otherwise (403, 5xx) stays as it is until a later sweep; any other error
// (the network, a credential) stops the sweep.
func (c *Crawler) confirmGone(
	ctx context.Context,
	candidates []string,
	get func(context.Context, string) error,
) ([]string, error) {
	var gone []string
	for _, uid := range candidates {
		err := get(ctx, uid)
		switch {
		case platform.IsNotFound(err):
			gone = append(gone, uid)
		case scopeFailed(ctx, readErr(err)):
			c.log.Warn("could not confirm a deletion; the next sweep asks again", "uid", uid, "err", err)
		case err != nil:
			return nil, fmt.Errorf("confirm deletion of %s: %w", uid, err)
		}
	}
	return gone, nil
}

// recordGone records as deleted (with mark) the candidates confirmGone
// confirms are gone, and counts them and their events. It returns the uids
// it recorded.
func (c *Crawler) recordGone(
	ctx context.Context,
	s *summary,
	candidates []string,
	get func(context.Context, string) error,
	mark func(context.Context, []string) (int, error),
) ([]string, error) {
	gone, err := c.confirmGone(ctx, candidates, get)
	if err != nil || len(gone) == 0 {
		return nil, err
	}
	n, err := mark(finish(ctx), gone)
	if err != nil {
		return nil, err
	}
	s.deleted.Add(int64(len(gone)))
	s.events.Add(int64(n))
	return gone, nil
}

// missing returns the live uids not in seen.
func missing(live []string, seen map[string]bool) []string {
	var out []string
	for _, uid := range live {
		if !seen[uid] {
			out = append(out, uid)
		}
	}
	return out
}

// sweepRepos records the deletion of repos the mirror holds that the
// finished listing did not show and that answer 404.
func (c *Crawler) sweepRepos(ctx context.Context, listed []store.Repo, s *summary) error {
	seen := make(map[string]bool, len(listed))
	for _, r := range listed {
		seen[r.UID] = true
	}
	live, err := c.store.LiveRepoUIDs(ctx, c.cfg.Group)
	if err != nil {
		return err
	}
	gone, err := c.recordGone(ctx, s, missing(live, seen), func(ctx context.Context, uid string) error {
		r, err := c.client.GetRepo(ctx, uid)
		if err == nil && !c.wanted(r.Name) {
			// Still there, but now excluded: not a deletion.
			return nil
		}
		return err
	}, c.store.MarkReposDeleted)
	if err != nil || len(gone) == 0 {
		return err
	}
	c.failed.forget(gone)
	c.log.Info("recorded deleted repos", "count", len(gone))
	return nil
}

// sweepTags records the deletion of a repo's tags that its finished listing
// did not show and that answer 404.
func (c *Crawler) sweepTags(ctx context.Context, repo store.Repo, seen map[string]bool, s *summary) error {
	live, err := c.store.LiveTagUIDs(ctx, repo.UID)
	if err != nil {
		return err
	}
	// A tag of a family the listing was not asked to show (the families
	// were narrowed) is still there: its Get answers, and it is kept.
	gone, err := c.recordGone(ctx, s, missing(live, seen), func(ctx context.Context, uid string) error {
		_, err := c.client.GetTag(ctx, uid)
		return err
	}, c.store.MarkTagsDeleted)
	if err != nil || len(gone) == 0 {
		return err
	}
	c.failed.forget(gone)
	c.log.Info("recorded deleted tags", "repo", repo.Path, "count", len(gone))
	return nil
}
