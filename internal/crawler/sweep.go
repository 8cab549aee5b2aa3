package crawler

import (
	"context"
	"fmt"
	"strings"
	"unicode"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// confirmGone keeps the candidates for which get answers 404: an
// unconfirmed deletion is never recorded. A candidate whose Get fails
// otherwise (403, 5xx) stays as it is until a later sweep; any other error
// (the network, a credential) stops the sweep.
func (c *Crawler) confirmGone(ctx context.Context, candidates []string, get func(context.Context, string) error) ([]string, error) {
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
	gone, err := c.confirmGone(ctx, missing(live, seen), func(ctx context.Context, uid string) error {
		r, err := c.client.GetRepo(ctx, uid)
		if err == nil && !c.wanted(r.Name) {
			// Still there, but now excluded: not a deletion.
			return nil
		}
		return err
	})
	if err != nil || len(gone) == 0 {
		return err
	}
	n, err := c.store.MarkReposDeleted(finish(ctx), gone)
	if err != nil {
		return err
	}
	c.failed.forget(gone)
	s.deleted.Add(int64(len(gone)))
	s.events.Add(int64(n))
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
	gone, err := c.confirmGone(ctx, missing(live, seen), func(ctx context.Context, uid string) error {
		_, err := c.client.GetTag(ctx, uid)
		return err
	})
	if err != nil || len(gone) == 0 {
		return err
	}
	n, err := c.store.MarkTagsDeleted(finish(ctx), gone)
	if err != nil {
		return err
	}
	c.failed.forget(gone)
	s.deleted.Add(int64(len(gone)))
	s.events.Add(int64(n))
	c.log.Info("recorded deleted tags", "repo", repo.Path, "count", len(gone))
	return nil
}

// advisories lists every advisory into the store, page by page; with sweep
// set it also records as withdrawn the ones the finished listing did not
// show and that answer 404.
func (c *Crawler) advisories(ctx context.Context, s *summary, sweep bool) error {
	// Only a sweep needs the set of every advisory listed: a set of the
	// whole organization's would grow the crawl's memory with it.
	var seen map[string]bool
	if sweep {
		seen = make(map[string]bool)
	}
	for page, err := range c.client.Advisories(platform.ListQuery{}).Pages(ctx) {
		if err != nil {
			return fmt.Errorf("list advisories: %w", err)
		}
		batch := make([]store.Advisory, len(page))
		for i, a := range page {
			batch[i] = mirrorAdvisory(a)
			if sweep {
				seen[a.UID] = true
			}
		}
		n, err := c.store.ApplyAdvisories(finish(ctx), batch)
		if err != nil {
			return err
		}
		s.advisories.Add(int64(len(page)))
		s.events.Add(int64(n))
	}
	if !sweep {
		return nil
	}
	live, err := c.store.LiveAdvisoryUIDs(ctx)
	if err != nil {
		return err
	}
	gone, err := c.confirmGone(ctx, missing(live, seen), func(ctx context.Context, uid string) error {
		_, err := c.client.GetAdvisory(ctx, uid)
		return err
	})
	if err != nil || len(gone) == 0 {
		return err
	}
	n, err := c.store.MarkAdvisoriesWithdrawn(finish(ctx), gone)
	if err != nil {
		return err
	}
	s.deleted.Add(int64(len(gone)))
	s.events.Add(int64(n))
	return nil
}

// mirrorAdvisory is a as the mirror keeps it.
func mirrorAdvisory(a platform.Advisory) store.Advisory {
	m := store.Advisory{UID: a.UID, AdvisoryID: a.AdvisoryID, ArtifactName: a.ArtifactName, CreateTime: a.CreateTime,
		UpdateTime: a.UpdateTime, DeleteTime: a.DeleteTime, Author: a.Author, ArtifactType: a.ArtifactType,
		ArtifactArchitecture: a.ArtifactArchitecture, ComponentName: a.ComponentName, ComponentLocation: a.ComponentLocation,
		ComponentType: a.ComponentType, LegacyAdvisoryID: a.LegacyAdvisoryID, Aliases: a.Aliases, Raw: a.Raw}
	for _, s := range a.Severities {
		m.Severities = append(m.Severities, store.AdvisorySeverity{Type: s.Type, Score: s.Score})
	}
	for _, e := range a.Events {
		m.Events = append(m.Events, store.AdvisoryEvent{UID: e.UID, Type: stepKind(e.Kind), CreateTime: e.CreateTime, Author: e.Author,
			Reviewer: e.Reviewer, ReviewState: e.ReviewState, Issue: e.Issue, Note: e.Note, FixedVersion: e.FixedVersion,
			PatchedVersions: e.PatchedVersions, FalsePositiveType: e.FalsePositiveType, DetectionType: e.DetectionType,
			Findings: e.Findings, Details: e.Details})
	}
	return m
}

// stepKinds names the platform's kinds of advisory event as syncd's event
// types do.
var stepKinds = map[string]string{
	platform.KindDetection:                  store.StepDetected,
	platform.KindTruePositiveDetermination:  store.StepTruePositive,
	platform.KindFalsePositiveDetermination: store.StepFalsePositive,
	platform.KindPendingUpstreamFix:         store.StepPendingUpstreamFix,
	platform.KindFixNotPlanned:              store.StepFixNotPlanned,
	platform.KindAnalysisNotPlanned:         store.StepAnalysisNotPlanned,
	platform.KindPatched:                    store.StepPatched,
	platform.KindFixed:                      store.StepFixed,
}

// stepKind is the step kind of a platform event kind; a kind added
// upstream keeps its name in snake case ("reopened", "risk_accepted"; any
// byte but a letter or digit an underscore, as the kind ends up in NATS
// subjects), and an event of none is "unknown".
func stepKind(kind string) string {
	if k, ok := stepKinds[kind]; ok {
		return k
	}
	if kind == "" {
		return "unknown"
	}
	var b strings.Builder
	for i, r := range kind {
		switch {
		case r >= 'A' && r <= 'Z':
			if i > 0 {
				b.WriteByte('_')
			}
			b.WriteRune(unicode.ToLower(r))
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			b.WriteRune(r)
		default:
			b.WriteByte('_')
		}
	}
	return b.String()
}
