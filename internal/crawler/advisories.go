package crawler

import (
	"context"
	"fmt"
	"strings"
	"unicode"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// advisories lists every advisory into the store, page by page; with sweep
// set it also records as withdrawn the ones the finished listing did not
// show and that answer 404.
func (c *Crawler) advisories(ctx context.Context, s *summary, sweep bool) error {
	// Only a sweep needs the set of every advisory listed: a set of the
	// whole organization's would grow the crawl's memory with it.
	var seen map[string]bool
	err := c.retryRestarted("advisory", func() error {
		if sweep {
			seen = make(map[string]bool) // what a restarted pass saw is not the whole
		}
		return c.listAdvisoriesOnce(ctx, s, seen)
	})
	if err != nil {
		return fmt.Errorf("list advisories: %w", err)
	}
	if !sweep {
		return nil
	}
	live, err := c.store.LiveAdvisoryUIDs(ctx)
	if err != nil {
		return err
	}
	_, err = c.recordGone(ctx, s, missing(live, seen), func(ctx context.Context, uid string) error {
		_, err := c.client.GetAdvisory(ctx, uid)
		return err
	}, c.store.MarkAdvisoriesWithdrawn)
	return err
}

// listAdvisoriesOnce makes one pass over the advisory listing into the
// store, recording each uid in seen when it is not nil.
func (c *Crawler) listAdvisoriesOnce(ctx context.Context, s *summary, seen map[string]bool) error {
	g, gctx := errgroup.WithContext(ctx)
	// Pages are applied as the next is listed: applied one after the
	// other, 200 advisories a commit kept the listing at three times its
	// requests' pace, and the baseline waits for the slower listing.
	listErr := listPipelined(gctx, g, c.client.Advisories(platform.ListQuery{}).Pages(gctx), nil,
		func(page []platform.Advisory) error {
			batch := make([]store.Advisory, len(page))
			for i, a := range page {
				batch[i] = mirrorAdvisory(a)
				if seen != nil {
					seen[a.UID] = true
				}
			}
			n, err := c.store.ApplyAdvisories(finish(gctx), batch)
			if err != nil {
				return err
			}
			s.advisories.Add(int64(len(page)))
			s.events.Add(int64(n))
			return nil
		}, nil)
	if err := g.Wait(); err != nil {
		return err
	}
	return listErr
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
		m.Events = append(
			m.Events,
			store.AdvisoryEvent{UID: e.UID, Type: stepKind(e.Kind), CreateTime: e.CreateTime, Author: e.Author,
				Reviewer: e.Reviewer, ReviewState: e.ReviewState, Issue: e.Issue, Note: e.Note, FixedVersion: e.FixedVersion,
				PatchedVersions: e.PatchedVersions, FalsePositiveType: e.FalsePositiveType, DetectionType: e.DetectionType,
				Findings: e.Findings, Details: e.Details},
		)
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
