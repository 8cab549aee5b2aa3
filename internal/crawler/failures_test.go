package crawler_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestCrawl_FailingReposFailAlone breaks one repo's history (404) and
// another's (403): the crawl finishes every other repo, ends its baseline,
// records their changes, and is partial; the failing tags are recorded,
// read again on the next runs, held back with backoff once they keep
// failing, and recovered once they answer, with nothing deleted and their
// history taken as the baseline it is.
func TestCrawl_FailingReposFailAlone(t *testing.T) {
	clock := testutil.NewClock(time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC))
	h := newHarnessWith(
		t,
		platformsim.Scale{Repos: 5, TagsPerRepo: 3, HistoryPerTag: 4, Advisories: 2},
		func(c *crawler.Config) { c.Now = clock.Now },
	)
	ctx := context.Background()
	truth := h.sim.Truth()
	gone, denied, healthy := truth.Repos[0], truth.Repos[1], truth.Repos[2]
	h.sim.AddFaults(
		platformsim.Fault{Name: "broken", Image: "acme/" + gone.Path, Status: 404},
		platformsim.Fault{Name: "broken", Image: "acme/" + denied.Path, Status: 403},
	)
	runs := func(outcome string) int {
		return h.count(t, `SELECT count(*) FROM crawl_runs WHERE job = 'crawl' AND outcome = ?`, outcome)
	}
	failures := func() map[string]store.Failure {
		fs, err := h.store.Failures(ctx)
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]store.Failure{}
		for _, f := range fs {
			m[f.UID] = f
		}
		return m
	}

	sum, err := h.crawler.Sync(ctx)
	if err != nil {
		t.Fatalf("a crawl with two failing repos failed as a whole: %v", err)
	}
	if got, want := sum.Failures, int64(6); got != want {
		t.Errorf("failures=%d, want %d (the 3 tags of each failing repo)", got, want)
	}
	if runs("partial") != 1 {
		t.Errorf("the crawl is not recorded as partial")
	}
	if n := h.count(t, `SELECT count(*) FROM meta WHERE key = 'baseline_time'`); n != 1 {
		t.Errorf("the baseline did not end")
	}
	fs := failures()
	if len(fs) != 6 {
		t.Fatalf("crawl_failures has %d rows, want 6: %v", len(fs), fs)
	}
	for _, f := range fs {
		want := map[string]int{gone.UID: 404, denied.UID: 403}[f.RepoUID]
		if f.Kind != "tag" || f.Status != want || f.Attempts != 1 || f.Path == "" || f.Error == "" {
			t.Errorf("failure %+v: want a tag failure with status %d, attempt 1, path and error", f, want)
		}
	}
	// Every other repo's history is mirrored.
	if n := h.count(t, `SELECT count(*) FROM tags WHERE repo_uid NOT IN (?, ?) AND history_count = 0`, gone.UID,
		denied.UID); n != 0 {
		t.Errorf("%d tags of healthy repos have no history", n)
	}

	// A move in a healthy repo is news while the others still fail.
	var moving string
	for _, tg := range truth.Tags {
		if tg.RepoUID == healthy.UID {
			moving = tg.UID
			break
		}
	}
	if err := h.sim.MoveTag(moving, fmt.Sprintf("sha256:%064x", 0xfeed)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE type = 'tag.moved' AND subject = ?`, moving); n != 1 {
		t.Errorf("tag.moved events for the healthy repo's tag = %d, want 1", n)
	}
	if _, err := h.crawler.Sync(ctx); err != nil { // the third failure in a row
		t.Fatal(err)
	}
	for uid, f := range failures() {
		if f.Attempts != 3 || !f.NextAttempt.After(clock.Now()) {
			t.Errorf(
				"failure of %s after three runs: attempts %d, next attempt %s; want 3 and held back",
				uid,
				f.Attempts,
				f.NextAttempt,
			)
		}
	}
	// Held back: the next run does not ask, so the attempts stay.
	h.sim.RemoveFaults("broken")
	sum, err = h.crawler.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Failures != 6 || len(failures()) != 6 {
		t.Errorf("a held-back run: %d failures, %d recorded; want both 6", sum.Failures, len(failures()))
	}
	for uid, f := range failures() {
		if f.Attempts != 3 {
			t.Errorf("failure of %s was retried while held back (attempts %d)", uid, f.Attempts)
		}
	}

	// Once due, they are read again, and recover.
	clock.Advance(2 * time.Minute)
	sum, err = h.crawler.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum.Failures != 0 || len(failures()) != 0 || runs("ok") != 1 {
		t.Errorf(
			"after recovery: %d failures, %d recorded, %d ok runs; want 0, 0, 1",
			sum.Failures,
			len(failures()),
			runs("ok"),
		)
	}
	if n := h.count(t, `SELECT count(*) FROM tags WHERE repo_uid IN (?, ?) AND history_count = 4`, gone.UID,
		denied.UID); n != 6 {
		t.Errorf("%d of the recovered repos' 6 tags have their history", n)
	}
	// Their history was the starting point, not news; nothing was deleted.
	if n := h.count(t,
		`SELECT count(*) FROM events WHERE type = 'tag.moved' AND (subject LIKE ? || '/%' OR subject LIKE ? || '/%')`,
		gone.UID, denied.UID); n != 0 {
		t.Errorf("%d tag.moved events for the recovered repos' baseline history", n)
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE action = 'deleted'`); n != 0 {
		t.Errorf("%d deletions recorded", n)
	}
}

// TestCrawl_EveryHistoryFailing fails the crawl rather than calling it
// partial: when no history read succeeds, the credential or the registry is
// at fault, not one repo. The listings, which do not use the registry, end
// the baseline (the current state); the histories stay in the backfill.
func TestCrawl_EveryHistoryFailing(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 2})
	h.sim.AddFaults(platformsim.Fault{Name: "down", Path: "/v2/*", Status: 403})
	ctx := context.Background()
	_, err := h.crawler.Sync(ctx)
	if err == nil {
		t.Fatal("a crawl whose every history read failed succeeded")
	}
	if ready, err := h.store.HistoryReady(ctx); err != nil || ready {
		t.Errorf("history ready = %v (%v) although no history was read", ready, err)
	}
	if left, err := h.store.BackfillRemaining(ctx); err != nil || left != 4 {
		t.Errorf("backfill left = %d (%v), want the 4 tags", left, err)
	}
	if n := h.count(t, `SELECT count(*) FROM crawl_runs WHERE outcome = 'failed'`); n != 1 {
		t.Errorf("the run is not recorded as failed")
	}
}

// TestRefreshTag_ByRegistryPath resolves a push's repository given as the
// registry path of a repo below subgroups, with and without the
// organization in front, before and after the repo is mirrored, and
// ignores tags of a family syncd does not mirror.
func TestRefreshTag_ByRegistryPath(t *testing.T) {
	h := newHarnessWith(t, platformsim.Scale{Repos: 3, TagsPerRepo: 1, HistoryPerTag: 2, NestedRepos: 2, EpochTags: 1},
		func(c *crawler.Config) { c.Families = crawler.ParseFamilies([]string{"dates"}) })
	ctx := context.Background()
	truth := h.sim.Truth()
	var plain, epoch platformsim.TruthTag
	var path string
	for _, tg := range truth.Tags {
		p, _ := h.sim.RegistryPath(tg.RepoUID)
		if strings.Count(p, "/") < 1 {
			continue
		}
		switch tg.Family {
		case "":
			plain, path = tg, p
		case platformsim.FamilyEpochs:
			epoch = tg
		}
	}
	if plain.UID == "" || epoch.UID == "" {
		t.Fatalf("no plain and epoch tags in a nested repo: %+v", truth.Tags)
	}
	// Not mirrored yet: found by listing the repos of that name. (Past the
	// baseline of an empty listing: a push during the baseline waits for
	// its end.)
	if err := h.store.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	if err := h.crawler.RefreshTag(ctx, "acme/"+path, plain.Name); err != nil {
		t.Fatal(err)
	}
	if n := h.count(t,
		`SELECT count(*) FROM tags t JOIN repos r ON r.uid = t.repo_uid WHERE t.uid = ? AND r.path = ? AND t.history_count = 2`,
		plain.UID, path); n != 1 {
		t.Fatalf("the tag pushed by path %s is not mirrored with its history", path)
	}
	// Mirrored: found by its path in the store.
	if err := h.sim.MoveTag(plain.UID, fmt.Sprintf("sha256:%064x", 0xbeef)); err != nil {
		t.Fatal(err)
	}
	if err := h.crawler.RefreshTag(ctx, path, plain.Name); err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, `SELECT history_count FROM tags WHERE uid = ?`, plain.UID); n != 3 {
		t.Errorf("after a move pushed by path, the tag has %d history records, want 3", n)
	}
	if err := h.crawler.RefreshTag(ctx, path, epoch.Name); err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, `SELECT count(*) FROM tags WHERE uid = ?`, epoch.UID); n != 0 {
		t.Errorf("a tag of the epochs family was mirrored, though only dates are configured")
	}
}

// TestCrawl_CredentialFailureIsNotAScopeFailure: an STS that cannot be
// reached fails the crawl, and records no failure of any tag, so nothing
// is held back once it answers again. A push before any crawl whose read
// fails is recorded like any other.
func TestCrawl_CredentialFailureIsNotAScopeFailure(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 2})
	ctx := context.Background()
	client, err := platform.New(
		platform.Config{
			BaseURL:     h.client.RegistryURL(),
			RegistryURL: h.client.RegistryURL(),
			Token:       platform.StaticToken(token),
			PullToken: &platform.ExchangeToken{
				STSURL:        "http://127.0.0.1:1",
				Identity:      "org1/x",
				Audience:      "registry",
				ExternalToken: platform.StaticToken("ext"),
			},
			Organization: "acme",
			PublicOrg:    "chainguard",
			Vendor:       "chainguard",
			MaxRetryTime: time.Second,
		},
	)
	if err != nil {
		t.Fatal(err)
	}
	c := crawler.New(client, h.store, crawler.Config{Group: "org1"})
	if _, err := c.Sync(ctx); err == nil || !strings.Contains(err.Error(), "STS") {
		t.Fatalf("crawl with the STS down: %v, want an error naming the STS", err)
	}
	if n := h.count(t, `SELECT count(*) FROM crawl_failures`); n != 0 {
		t.Errorf("%d scope failures recorded for a credential that could not be had", n)
	}

	// A push before the first crawl of a fresh crawler, whose read fails
	// (the mirror past its baseline: a push during it waits for its end).
	if err := h.store.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	truth := h.sim.Truth()
	h.sim.AddFaults(platformsim.Fault{Name: "gone", Image: "acme/" + truth.Repos[0].Path, Status: 404})
	fresh := crawler.New(h.client, h.store, crawler.Config{Group: "org1"})
	var tag platformsim.TruthTag
	for _, tg := range truth.Tags {
		if tg.RepoUID == truth.Repos[0].UID {
			tag = tg
		}
	}
	if err := fresh.RefreshTag(ctx, truth.Repos[0].UID, tag.Name); err != nil {
		t.Fatalf("refresh with a failing history: %v", err)
	}
	if n := h.count(t, `SELECT count(*) FROM crawl_failures WHERE uid = ? AND status = 404`, tag.UID); n != 1 {
		t.Errorf("the failing pushed tag is not recorded")
	}
}

// TestSweep_DeletedScopeForgetsItsFailure: a tag whose history answered
// 404 because it was being deleted leaves crawl_failures with its deletion.
func TestSweep_DeletedScopeForgetsItsFailure(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 2})
	ctx := context.Background()
	if _, err := h.crawler.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	truth := h.sim.Truth()
	tag := truth.Tags[0]
	var path string
	for _, r := range truth.Repos {
		if r.UID == tag.RepoUID {
			path = r.Path
		}
	}
	h.sim.AddFaults(platformsim.Fault{Name: "gone", Image: "acme/" + path, Status: 404})
	if err := h.sim.MoveTag(tag.UID, fmt.Sprintf("sha256:%064x", 0xd1e)); err != nil {
		t.Fatal(err)
	}
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, `SELECT count(*) FROM crawl_failures WHERE uid = ?`, tag.UID); n != 1 {
		t.Fatalf("the failing tag is not recorded")
	}
	if _, err := h.sim.Apply(platformsim.Mutation{Kind: platformsim.TagDeleted, UID: tag.UID}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.crawler.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, `SELECT count(*) FROM crawl_failures WHERE uid = ?`, tag.UID); n != 0 {
		t.Errorf("the deleted tag's failure is still recorded")
	}
}
