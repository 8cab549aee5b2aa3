package crawler_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

const token = "crawler-test-token"

type harness struct {
	sim     *platformsim.Sim
	store   *store.Store
	client  *platform.Client
	crawler *crawler.Crawler
}

func newHarness(t *testing.T, sc platformsim.Scale) *harness {
	t.Helper()
	return newHarnessWith(t, sc, nil)
}

// newHarnessWith is newHarness with the crawler's config adjusted by mutate.
func newHarnessWith(t *testing.T, sc platformsim.Scale, mutate func(*crawler.Config)) *harness {
	t.Helper()
	sim, url := testutil.Sim(t, platformsim.Options{Seed: 3, Tokens: []string{token}}, sc)
	return harnessOn(t, sim, url, mutate)
}

// harnessOn is a mirror and a crawler of the simulator sim served at url.
func harnessOn(t *testing.T, sim *platformsim.Sim, url string, mutate func(*crawler.Config)) *harness {
	t.Helper()
	return harnessClient(t, sim, url, nil, mutate)
}

// harnessClient is harnessOn with the client's config adjusted by client.
func harnessClient(
	t *testing.T,
	sim *platformsim.Sim,
	url string,
	client func(*platform.Config),
	mutate func(*crawler.Config),
) *harness {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	pcfg := platform.Config{BaseURL: url, RegistryURL: url, Token: platform.StaticToken(token),
		Organization: "acme", PublicOrg: "chainguard", Vendor: "chainguard", MaxRetryTime: 2 * time.Second}
	if client != nil {
		client(&pcfg)
	}
	pc, err := platform.New(pcfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg := crawler.Config{Group: "org1", Concurrency: 4, Logger: slog.New(slog.DiscardHandler)}
	if mutate != nil {
		mutate(&cfg)
	}
	return &harness{sim: sim, store: st, client: pc, crawler: crawler.New(pc, st, cfg)}
}

func (h *harness) count(t *testing.T, q string, args ...any) int {
	t.Helper()
	var n int
	if err := h.store.Reader().QueryRow(q, args...).Scan(&n); err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	return n
}

func TestSweep_RecordsConfirmedDeletions(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 3, TagsPerRepo: 3, HistoryPerTag: 2, Advisories: 3})
	ctx := context.Background()
	if _, err := h.crawler.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	truth := h.sim.Truth()
	tag := truth.Tags[0]
	var repo platformsim.TruthRepo
	for _, r := range truth.Repos {
		if r.UID != tag.RepoUID {
			repo = r
			break
		}
	}
	if _, err := h.sim.Apply(platformsim.Mutation{Kind: platformsim.TagDeleted, UID: tag.UID}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.sim.Apply(platformsim.Mutation{Kind: platformsim.RepoDeleted, UID: repo.UID}); err != nil {
		t.Fatal(err)
	}
	// The incremental crawl never records deletions.
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE action = 'deleted'`); n != 0 {
		t.Fatalf("incremental crawl recorded %d deletions", n)
	}
	sum, err := h.crawler.Sweep(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, `SELECT count(*) FROM tags WHERE uid = ? AND deleted_time IS NOT NULL`, tag.UID); n != 1 {
		t.Errorf("deleted tag not tombstoned")
	}
	if n := h.count(t, `SELECT count(*) FROM repos WHERE uid = ? AND deleted_time IS NOT NULL`, repo.UID); n != 1 {
		t.Errorf("deleted repo not tombstoned")
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE type = 'tag.deleted' AND subject = ?`, tag.UID); n != 1 {
		t.Errorf("tag.deleted events for the tag = %d, want 1", n)
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE type = 'repo.deleted' AND subject = ?`, repo.UID); n != 1 {
		t.Errorf("repo.deleted events = %d, want 1", n)
	}
	// The deleted repo's tags went with it.
	if n := h.count(t, `SELECT count(*) FROM tags WHERE repo_uid = ? AND deleted_time IS NULL`, repo.UID); n != 0 {
		t.Errorf("%d tags of the deleted repo still live", n)
	}
	if sum.Deleted != 2 {
		t.Errorf("summary deleted=%d, want 2", sum.Deleted)
	}
	// Rows are kept: nothing is dropped silently.
	if got, want := h.count(t, `SELECT count(*) FROM repos`), len(truth.Repos); got != want {
		t.Errorf("repo rows=%d, want %d (tombstones kept)", got, want)
	}
}

func TestSweep_FailedListingDeletesNothing(t *testing.T) {
	for _, tc := range []struct {
		name  string
		fault platformsim.Fault
	}{
		{"TagListing", platformsim.Fault{Pattern: "GET /registry/v2/tags", ErrorRate: 1, ErrorStatuses: []int{503}}},
		{"RepoListing", platformsim.Fault{Pattern: "GET /registry/v2/repos", ErrorRate: 1, ErrorStatuses: []int{500}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := newHarness(t, platformsim.Scale{Repos: 2, TagsPerRepo: 3, HistoryPerTag: 2})
			ctx := context.Background()
			if _, err := h.crawler.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			truth := h.sim.Truth()
			for _, tg := range truth.Tags[:2] {
				if _, err := h.sim.Apply(platformsim.Mutation{Kind: platformsim.TagDeleted, UID: tg.UID}); err != nil {
					t.Fatal(err)
				}
			}
			h.sim.SetFaults(tc.fault)
			if _, err := h.crawler.Sweep(ctx); err == nil {
				t.Fatal("sweep succeeded with its listing failing")
			}
			if n := h.count(t, `SELECT count(*) FROM tags WHERE deleted_time IS NOT NULL`); n != 0 {
				t.Errorf("%d tags tombstoned by a sweep whose listing failed", n)
			}
			if n := h.count(t, `SELECT count(*) FROM events WHERE action = 'deleted'`); n != 0 {
				t.Errorf("%d deletion events from a failed sweep", n)
			}
			if n := h.count(t, `SELECT count(*) FROM crawl_runs WHERE job = 'sweep' AND outcome = 'failed'`); n != 1 {
				t.Errorf("failed sweeps recorded=%d, want 1", n)
			}
			// Once the platform answers again, the deletions are recorded.
			h.sim.SetFaults()
			if _, err := h.crawler.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			if n := h.count(t, `SELECT count(*) FROM events WHERE type = 'tag.deleted'`); n != 2 {
				t.Errorf("tag.deleted events after recovery=%d, want 2", n)
			}
		})
	}
}

// TestSync_IdleCrawlMakesOnlyListRequests: with nothing changed upstream,
// a crawl of 200 repos with 600 tags lists the repos and only the tags
// updated since the newest update the mirror holds (less the margin): one
// page of each, and no history at all. 200 repos fill one page of the repo
// listing; 600 tags take three pages of the tag listing (200 a page), so
// one page proves the crawl did not list them all. (It had 10,000 tags,
// whose baseline crawl took half the package's time and proved no more.)
func TestSync_IdleCrawlMakesOnlyListRequests(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 200, TagsPerRepo: 3, HistoryPerTag: 2, PublicImages: -1})
	ctx := context.Background()
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	h.sim.ResetStats()
	sum, err := h.crawler.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	st := h.sim.Stats()
	for ep, n := range st.ByEndpoint {
		if ep != "GET /registry/v2/repos" && ep != "GET /registry/v2/tags" {
			t.Errorf("idle crawl made %d requests to %s; want list requests only", n, ep)
		}
	}
	if sum.HistoryReads != 0 {
		t.Errorf("idle crawl: history reads=%d, want 0", sum.HistoryReads)
	}
	// One page of repos (200 per page) and one page of recently updated tags.
	if got, want := st.Total, 1+1; got != want {
		t.Errorf("requests=%d, want %d (the minimum the API allows)", got, want)
	}
	// One move upstream costs one history read, not a re-read of everything.
	tag := h.sim.Truth().Tags[123]
	h.sim.Advance(time.Second)
	if err := h.sim.MoveTag(tag.UID, "sha256:"+strings.Repeat("c", 64)); err != nil {
		t.Fatal(err)
	}
	sum, err = h.crawler.Sync(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sum.HistoryReads != 1 || sum.Events != 1 {
		t.Errorf("after one move: history reads=%d events=%d, want 1 and 1", sum.HistoryReads, sum.Events)
	}
}

// TestSync_PublicImagesFollowedAnonymously: a public image's latest and
// latest-dev history is mirrored with no platform token at all.
func TestSync_PublicImagesFollowedAnonymously(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 1, TagsPerRepo: 1, HistoryPerTag: 1, PublicImages: 2})
	truth := h.sim.Truth()
	img := truth.PublicTags[0].Image
	client, err := platform.New(platform.Config{BaseURL: "http://127.0.0.1:1", RegistryURL: h.client.RegistryURL(),
		PublicOrg: "chainguard", Vendor: "chainguard", MaxRetryTime: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	c := crawler.New(client, h.store, crawler.Config{Group: "org1", PublicImages: []string{img}, PublicOrg: "chainguard"})
	// Only the public images are reachable: the platform API is not.
	if err := c.SyncPublicImages(context.Background()); err != nil {
		t.Fatal(err)
	}
	var followed int
	for _, pt := range truth.PublicTags {
		if pt.Image != img || (pt.Tag != "latest" && pt.Tag != "latest-dev") {
			continue
		}
		followed++
		uid := "chainguard/" + img + "/" + pt.Tag
		var digest string
		if err := h.store.Reader().QueryRow(`SELECT digest FROM tags WHERE uid = ?`, uid).Scan(&digest); err != nil {
			t.Fatalf("public tag %s not mirrored: %v", uid, err)
		}
		if digest != pt.Digest {
			t.Errorf("%s digest=%s, want %s", uid, digest, pt.Digest)
		}
		if got, want := h.count(t, `SELECT count(*) FROM tag_history WHERE tag_uid = ?`, uid), len(pt.History); got != want {
			t.Errorf("%s history rows=%d, want %d", uid, got, want)
		}
	}
	if followed != 2 {
		t.Fatalf("followed %d public tags, want 2", followed)
	}
}

// listingDisturber, once armed, lets the page token of the listing at path
// expire (the simulator's clock moves 73 hours on) right after its first
// page was served, and then changes the platform with disturb, before the
// next page is asked for.
type listingDisturber struct {
	path    string
	disturb func(*platformsim.Sim)
	sim     *platformsim.Sim

	mu      sync.Mutex
	armed   bool
	tripped int
}

func (d *listingDisturber) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r)
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.armed && r.URL.Path == d.path && r.URL.Query().Get("page_token") == "" {
			d.armed = false
			d.tripped++
			d.sim.Advance(73 * time.Hour)
			d.disturb(d.sim)
		}
	})
}

func (d *listingDisturber) arm() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.armed = true
}

func (d *listingDisturber) trips() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.tripped
}

// TestSweep_ListingChangesUnderIt: between two pages of the repo listing the
// page token expires (the listing silently restarts) and repos are created
// and deleted upstream. The sweep must record no duplicates and no false
// deletions: afterwards the mirror's live repos equal the ground truth.
func TestSweep_ListingChangesUnderIt(t *testing.T) {
	d := &listingDisturber{path: "/registry/v2/repos", disturb: func(sim *platformsim.Sim) {
		truth := sim.Truth()
		sim.Apply(platformsim.Mutation{Kind: platformsim.RepoDeleted, UID: truth.Repos[len(truth.Repos)-1].UID})
		sim.Apply(platformsim.Mutation{Kind: platformsim.RepoCreated, Name: "newcomer"})
	}}
	sim, url := testutil.Sim(t, platformsim.Options{Seed: 9, Tokens: []string{token}},
		platformsim.Scale{Repos: 450, TagsPerRepo: 1, HistoryPerTag: 1, PublicImages: -1}, d.wrap)
	d.sim = sim
	h := harnessOn(t, sim, url, func(cfg *crawler.Config) { cfg.Concurrency = 8 })
	c, st := h.crawler, h.store
	ctx := context.Background()
	if _, err := c.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	d.arm()
	if _, err := c.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if n := d.trips(); n != 1 {
		t.Fatalf("the listing was disturbed %d times, want 1", n)
	}
	truth := sim.Truth()
	live := map[string]bool{}
	rows, err := st.Reader().Query(`SELECT uid FROM repos WHERE deleted_time IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var uid string
		rows.Scan(&uid)
		live[uid] = true
	}
	rows.Close()
	for _, r := range truth.Repos {
		if !live[r.UID] {
			t.Errorf("repo %s (%s) exists upstream but is not live in the mirror", r.UID, r.Name)
		}
		delete(live, r.UID)
	}
	for uid := range live {
		t.Errorf("repo %s is live in the mirror but gone upstream", uid)
	}
	var deleted, total int
	st.Reader().QueryRow(`SELECT count(*) FROM events WHERE type = 'repo.deleted'`).Scan(&deleted)
	st.Reader().QueryRow(`SELECT count(*) FROM repos`).Scan(&total)
	if deleted != 1 {
		t.Errorf("repo.deleted events=%d, want exactly the one real deletion", deleted)
	}
	if total != 451 {
		t.Errorf("repo rows=%d, want 451 (450 + the newcomer, the deleted one kept as a tombstone)", total)
	}
}

// TestSync_BaselineCoversAdvisories: the first crawl of an empty mirror is
// silent for every kind of resource, advisories included, and later
// changes are events.
func TestSync_BaselineCoversAdvisories(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 2, Advisories: 6})
	ctx := context.Background()
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := h.crawler.SyncAdvisories(ctx); err != nil {
		t.Fatal(err)
	}
	// The histories' replication records are no news of a resource.
	if n := h.count(t, `SELECT count(*) FROM events WHERE type != 'history.recorded'`); n != 0 {
		t.Fatalf("%d events after the baseline, want none", n)
	}
	if n := h.count(t, `SELECT count(*) FROM advisories`); n != 6 {
		t.Fatalf("advisories=%d, want 6", n)
	}
	if _, err := h.sim.Apply(platformsim.Mutation{Kind: platformsim.AdvisoryCreated}); err != nil {
		t.Fatal(err)
	}
	if _, err := h.crawler.SyncAdvisories(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE type = 'advisory.created'`); n != 1 {
		t.Fatalf("advisory.created events=%d, want 1", n)
	}
}

// TestSync_FirstSyncMakesTheMinimumRequests: with a repo's history reads
// running in parallel, the first sync still fetches one registry token per
// image and reads each tag's history once, all of it.
func TestSync_FirstSyncMakesTheMinimumRequests(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 6, TagsPerRepo: 40, HistoryPerTag: 3, PublicImages: -1})
	sum, err := h.crawler.Sync(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	st := h.sim.Stats()
	if got, want := st.ByEndpoint["GET /token"], 6; got != want {
		t.Errorf("registry token requests=%d, want %d (one per image)", got, want)
	}
	if got, want := st.ByEndpoint["GET /v2/{image}/_chainguard/history/{tag}"], 240; got != want {
		t.Errorf("history requests=%d, want %d (one per tag)", got, want)
	}
	if got, want := h.count(t, `SELECT count(*) FROM tag_history`), 240*3; got != want {
		t.Errorf("history rows=%d, want %d", got, want)
	}
	if sum.HistoryReads != 240 {
		t.Errorf("history reads=%d, want 240", sum.HistoryReads)
	}
}

// TestRun_FirstStartListsAdvisoriesOnce: the baseline crawl of an empty
// mirror lists the advisories alongside the repos; the advisories job that
// follows it at start records a run without listing them again.
func TestRun_FirstStartListsAdvisoriesOnce(t *testing.T) {
	hourly := cron.Every(time.Hour)
	var mu sync.Mutex
	runs := map[string]string{}
	h := newHarnessWith(
		t,
		platformsim.Scale{Repos: 3, TagsPerRepo: 2, HistoryPerTag: 2, Advisories: 450, PublicImages: -1},
		func(cfg *crawler.Config) {
			cfg.Schedule, cfg.SweepSchedule, cfg.AdvisoriesSchedule = hourly, hourly, hourly
			cfg.OnRun = func(job, outcome string, _ crawler.Summary, _ time.Time) {
				mu.Lock()
				defer mu.Unlock()
				runs[job] = outcome
			}
		},
	)
	c, sim, st := h.crawler, h.sim, h.store
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	testutil.Eventually(t, 20*time.Second, func() error {
		mu.Lock()
		defer mu.Unlock()
		crawl, adv := runs[crawler.JobCrawl], runs[crawler.JobAdvisories]
		if crawl == "" || adv == "" {
			return fmt.Errorf("start runs not done: crawl %q, advisories %q", crawl, adv)
		}
		if crawl != "ok" || adv != "ok" {
			t.Fatalf("start runs: crawl %s, advisories %s; want ok and ok", crawl, adv)
		}
		return nil
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, want := sim.Stats().ByEndpoint["GET /vulnerabilities/v2/advisories"], 3; got != want {
		t.Errorf("advisory list requests=%d, want %d (450 advisories, 200 a page, listed once)", got, want)
	}
	var n int
	if err := st.Reader().QueryRow(`SELECT count(*) FROM advisories`).Scan(&n); err != nil || n != 450 {
		t.Errorf("advisories in the mirror=%d (%v), want 450", n, err)
	}
	if err := st.Reader().QueryRow(
		`SELECT count(*) FROM crawl_runs WHERE job = 'advisories' AND outcome = 'ok'`).Scan(&n); err != nil ||
		n != 1 {
		t.Errorf("advisories runs recorded=%d (%v), want 1", n, err)
	}
}

// TestSync_BaselineDefersHistoryIndexes: a baseline crawl writes history
// without the indexes by time and digest; a baseline that fails leaves
// them deferred (the next attempt goes on without them), and the one that
// completes builds them over everything it wrote.
func TestSync_BaselineDefersHistoryIndexes(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 3, TagsPerRepo: 4, HistoryPerTag: 5, PublicImages: -1})
	ctx := context.Background()
	indexes := `SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name IN ('tag_history_time', 'tag_history_digest')`
	h.sim.SetFaults(platformsim.Fault{Pattern: "GET /registry/v2/tags", ErrorRate: 1, ErrorStatuses: []int{400}})
	if _, err := h.crawler.Sync(ctx); err == nil {
		t.Fatal("baseline crawl succeeded with every tag listing failing")
	}
	if n := h.count(t, indexes); n != 0 {
		t.Fatalf("%d history indexes during an unfinished baseline, want 0 (deferred)", n)
	}
	h.sim.SetFaults()
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, indexes); n != 2 {
		t.Fatalf("%d history indexes after the baseline, want 2", n)
	}
	truth := h.sim.Truth()
	for uid, recs := range truth.History {
		last := recs[len(recs)-1]
		if n := h.count(t,
			`SELECT count(*) FROM tag_history INDEXED BY tag_history_digest WHERE digest = ? AND tag_uid = ?`,
			last.Digest, uid); n != 1 {
			t.Fatalf("tag %s: newest record found through the digest index %d times, want 1", uid, n)
		}
	}
	if got, want := h.count(t,
		`SELECT count(*) FROM tag_history INDEXED BY tag_history_time WHERE update_time > ''`), 3*4*5; got != want {
		t.Fatalf("rows through the time index = %d, want %d", got, want)
	}
}

// TestRefreshRepo_ReadsOnlyWhatMoved: a pushed repo is listed as a crawl
// lists the organization, with a query for its tags: the store names the
// tags that moved, and only their histories are read, each once, each
// move an event.
func TestRefreshRepo_ReadsOnlyWhatMoved(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 2, TagsPerRepo: 40, HistoryPerTag: 3, PublicImages: -1})
	ctx := context.Background()
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	var repoUID string
	if err := h.store.Reader().QueryRow(`SELECT uid FROM repos ORDER BY uid LIMIT 1`).Scan(&repoUID); err != nil {
		t.Fatal(err)
	}
	rows, err := h.store.Reader().Query(`SELECT uid FROM tags WHERE repo_uid = ? ORDER BY uid LIMIT 5`, repoUID)
	if err != nil {
		t.Fatal(err)
	}
	var moved []string
	for rows.Next() {
		var uid string
		if err := rows.Scan(&uid); err != nil {
			t.Fatal(err)
		}
		moved = append(moved, uid)
	}
	rows.Close()
	for i, uid := range moved {
		m := platformsim.Mutation{Kind: platformsim.TagMoved, UID: uid, Digest: fmt.Sprintf("sha256:%064x", i+1)}
		if _, err := h.sim.Apply(m); err != nil {
			t.Fatal(err)
		}
	}
	const history = "GET /v2/{image}/_chainguard/history/{tag}"
	before := h.sim.Stats().ByEndpoint[history]
	if err := h.crawler.RefreshRepo(ctx, repoUID); err != nil {
		t.Fatal(err)
	}
	if got := h.sim.Stats().ByEndpoint[history] - before; got != len(moved) {
		t.Errorf("history requests=%d, want %d (the moved tags')", got, len(moved))
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE type = 'tag.moved'`); n != len(moved) {
		t.Errorf("tag.moved events=%d, want %d", n, len(moved))
	}
}
