package bench

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/store"
)

// token and registryToken are the credentials the simulator accepts, one
// per audience: the platform API's and the registry's.
const (
	token         = "bench-token-8d2e"
	registryToken = "bench-registry-token-51c0"
)

// historyEndpoint is the simulator's name for tag history requests.
const historyEndpoint = "GET /v2/{image}/_chainguard/history/{tag}"

// params are the knobs of one benchmark run, from the environment.
type params struct {
	// Scale multiplies the size of the organization (BENCH_SCALE; 1 is
	// the 1,000 repos and 1,000,000 history records).
	Scale float64 `json:"scale"`
	// Concurrency is the crawler's concurrency and the most connections
	// the platform client opens to the simulator (BENCH_CONCURRENCY).
	Concurrency int `json:"concurrency"`
	// Latency is the simulated latency of every request in the
	// latency-bound sync.
	Latency time.Duration `json:"latency_ns"`
	// Pushes is how many moves the push-to-NATS latency is measured over.
	Pushes int `json:"pushes"`
	// Follow runs the follower and snapshot section, unless BENCH_FOLLOW=0
	// (at full size it takes about 40 s of the run's 15 minutes;
	// docs/performance.md).
	Follow bool `json:"follow"`
}

func paramsFromEnv() (params, error) {
	p := params{Scale: 1, Concurrency: 16, Latency: 20 * time.Millisecond, Pushes: 200}
	if v := os.Getenv("BENCH_SCALE"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f <= 0 || f > 8 {
			return p, fmt.Errorf("BENCH_SCALE=%q: want a number in (0, 8]", v)
		}
		p.Scale = f
	}
	if v := os.Getenv("BENCH_CONCURRENCY"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 64 {
			return p, fmt.Errorf("BENCH_CONCURRENCY=%q: want 1 to 64 (the range crawl.concurrency allows)", v)
		}
		p.Concurrency = n
	}
	p.Follow = os.Getenv("BENCH_FOLLOW") != "0"
	if p.Scale < 1 {
		// The quick run keeps its push count in proportion, but enough
		// for a p99 to mean something.
		p.Pushes = max(50, int(float64(p.Pushes)*p.Scale))
	}
	return p, nil
}

// orgScale is the organization times f: repos, heavy tags and
// advisories grow, the shape of a repo stays.
func orgScale(f float64) platformsim.Scale {
	sc := platformsim.ScaleScenario()
	scale := func(n int) int { return max(1, int(math.Round(float64(n)*f))) }
	sc.Repos, sc.Advisories, sc.HeavyTags = scale(sc.Repos), scale(sc.Advisories), scale(sc.HeavyTags)
	sc.PublicImages = -1 // not part of the organization
	return sc
}

// org is a simulated organization served on a loopback port.
type org struct {
	sim *platformsim.Sim
	srv *httptest.Server
	sc  platformsim.Scale
}

func startOrg(sc platformsim.Scale, wrap ...func(http.Handler) http.Handler) *org {
	sim := platformsim.New(
		platformsim.Options{Seed: 1, Tokens: []string{token}, RegistryTokens: []string{registryToken}, AllowHTTPSinks: true},
	)
	sim.Populate(sc)
	h := sim.Handler()
	for _, w := range wrap {
		h = w(h)
	}
	// httptest listens on 127.0.0.1.
	srv := httptest.NewServer(h)
	sim.SetBaseURL(srv.URL)
	return &org{sim: sim, srv: srv, sc: sc}
}

func (o *org) URL() string { return o.srv.URL }

func (o *org) Close() {
	o.sim.Close()
	o.srv.Close()
}

// minimum is the fewest requests the API allows for a full sync of an
// organization, by kind: one listing of the organization's tags
// (uidp.descendants_of), and no registry token at all, since a
// registry-audience credential is sent to the history API as it is.
// PerRepoTagPages and PerImageTokens are what the looser minimum of
// earlier runs counted instead (a tag listing per repo, a token per
// image), printed beside it.
type minimum struct {
	RepoPages, TagPages, HistoryWindows, AdvisoryPages int
	PerRepoTagPages, PerImageTokens                    int
}

func (m minimum) Total() int {
	return m.RepoPages + m.TagPages + m.HistoryWindows + m.AdvisoryPages
}

// PerRepoTotal is the looser minimum of earlier runs.
func (m minimum) PerRepoTotal() int {
	return m.RepoPages + m.PerRepoTagPages + m.HistoryWindows + m.AdvisoryPages + m.PerImageTokens
}

// minimumRequests counts, from the generated organization itself: list
// pages of 200 (at least one per listing), ceil(records/1000) history
// windows per tag, and one registry token per image (repo).
func minimumRequests(t platformsim.Truth) minimum {
	pages := func(n, per int) int { return max(1, (n+per-1)/per) }
	tagsPerRepo := map[string]int{}
	for _, tg := range t.Tags {
		tagsPerRepo[tg.RepoUID]++
	}
	m := minimum{
		RepoPages:      pages(len(t.Repos), 200),
		TagPages:       pages(len(t.Tags), 200),
		AdvisoryPages:  pages(len(t.Advisories), 200),
		PerImageTokens: len(t.Repos),
	}
	for _, r := range t.Repos {
		m.PerRepoTagPages += pages(tagsPerRepo[r.UID], 200)
	}
	for _, h := range t.History {
		m.HistoryWindows += pages(len(h), 1000)
	}
	return m
}

// newClient returns a platform client that opens at most conns
// connections to the simulator, so that no more than conns requests are
// in flight: the latency floor divides by exactly that number.
func newClient(url string, conns int, wrap ...func(http.RoundTripper) http.RoundTripper) (*platform.Client, error) {
	return newLimitedClient(url, conns, 0, wrap...)
}

// newLimitedClient is newClient with the client's rate limit: rps
// requests a second ([crawl] requests_per_second; 0: none).
func newLimitedClient(
	url string,
	conns int,
	rps float64,
	wrap ...func(http.RoundTripper) http.RoundTripper,
) (*platform.Client, error) {
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost = conns, conns
	var rt http.RoundTripper = tr
	for _, w := range wrap {
		rt = w(rt)
	}
	return platform.New(
		platform.Config{
			BaseURL:           url,
			RegistryURL:       url,
			Token:             platform.StaticToken(token),
			PullToken:         platform.StaticToken(registryToken),
			Organization:      "acme",
			PublicOrg:         "chainguard",
			Vendor:            "chainguard",
			HTTPClient:        &http.Client{Transport: rt},
			MaxInFlight:       conns,
			RequestsPerSecond: rps,
		},
	)
}

// mirror is one syncd mirror: store, client and crawler.
type mirror struct {
	store   *store.Store
	client  *platform.Client
	crawler *crawler.Crawler
	path    string
}

func openMirror(
	ctx context.Context,
	dir, url string,
	concurrency int,
	initialEvents string,
	wrap ...func(http.RoundTripper) http.RoundTripper,
) (*mirror, error) {
	return openLimitedMirror(ctx, dir, url, concurrency, 0, initialEvents, wrap...)
}

// openLimitedMirror is openMirror with the client's rate limit: rps
// requests a second ([crawl] requests_per_second; 0: none).
func openLimitedMirror(
	ctx context.Context,
	dir, url string,
	concurrency int,
	rps float64,
	initialEvents string,
	wrap ...func(http.RoundTripper) http.RoundTripper,
) (*mirror, error) {
	path := filepath.Join(dir, "syncd.db")
	var log *slog.Logger
	if os.Getenv("BENCH_LOG") != "" {
		// The crawl's and the store's own log, for finding where a run's
		// time went.
		log = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	st, err := store.Open(ctx, path, store.Options{InitialEvents: initialEvents, Logger: log})
	if err != nil {
		return nil, err
	}
	client, err := newLimitedClient(url, concurrency, rps, wrap...)
	if err != nil {
		st.Close()
		return nil, err
	}
	cfg := crawler.Config{Group: "org1", Concurrency: concurrency, Logger: log}
	c := crawler.New(client, st, cfg)
	return &mirror{store: st, client: client, crawler: c, path: path}, nil
}

func (m *mirror) Close() error { return m.store.Close() }

// count counts the rows of table as an analyst would, on a connection of
// its own: the store's readers map the file, and a count through them
// would put the whole table in the process's resident set, which the
// memory child measures.
func (m *mirror) count(ctx context.Context, table string) (int64, error) {
	db, err := sql.Open("sqlite", "file:"+m.path+"?mode=ro")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	var n int64
	err = db.QueryRowContext(ctx, `SELECT count(*) FROM `+table).Scan(&n)
	return n, err
}

// syncResult is what one sync cost.
type syncResult struct {
	Wall        time.Duration `json:"wall_ns"`
	WallSeconds float64       `json:"wall_s"`
	// Requests are the crawl job's (a baseline crawl lists the advisories
	// too); AdvisoryRequests those of the advisory listing and Gets, in
	// the crawl or in the advisories job beside it.
	Requests         int   `json:"requests"`
	AdvisoryRequests int   `json:"advisory_requests"`
	HistoryRequests  int   `json:"history_requests"`
	HistoryRows      int64 `json:"history_rows"` // rows added to tag_history
	Events           int64 `json:"events"`
	// CurrentSeconds is, for a sync that ended the baseline, how long it
	// took to the current state (the listings complete, the backfill of
	// the histories starting); WallSeconds is then the time to the
	// history complete.
	CurrentSeconds float64 `json:"current_s,omitempty"`
}

// syncOnce runs the crawl and the advisories job, as a start of syncd
// does, and counts the requests the simulator served.
func syncOnce(ctx context.Context, o *org, m *mirror) (syncResult, error) {
	before, err := m.count(ctx, "tag_history")
	if err != nil {
		return syncResult{}, err
	}
	o.sim.ResetStats()
	start := time.Now()
	crawl, err := m.crawler.Sync(ctx)
	if err != nil {
		return syncResult{}, fmt.Errorf("sync: %w", err)
	}
	crawled := o.sim.Stats()
	// As at a start of syncd, the advisories job lists them unless the
	// crawl (a baseline) just did.
	var adv crawler.Summary
	if !m.crawler.AdvisoriesListedSince(start) {
		if adv, err = m.crawler.SyncAdvisories(ctx); err != nil {
			return syncResult{}, fmt.Errorf("sync advisories: %w", err)
		}
	}
	wall := time.Since(start)
	st := o.sim.Stats()
	after, err := m.count(ctx, "tag_history")
	if err != nil {
		return syncResult{}, err
	}
	current, err := currentAfter(ctx, m, start)
	if err != nil {
		return syncResult{}, err
	}
	return syncResult{
		Wall:             wall,
		WallSeconds:      wall.Seconds(),
		Requests:         crawled.Total,
		HistoryRequests:  st.ByEndpoint[historyEndpoint],
		HistoryRows:      after - before,
		Events:           crawl.Events + adv.Events,
		CurrentSeconds:   current,
		AdvisoryRequests: st.ByEndpoint[advisoryListEndpoint] + st.ByEndpoint[advisoryGetEndpoint],
	}, nil
}

// currentAfter is how long after start the mirror's baseline ended, when
// it ended after start (0 otherwise): the time to the current state.
func currentAfter(ctx context.Context, m *mirror, start time.Time) (float64, error) {
	v, err := m.store.Meta(ctx, "baseline_time")
	if err != nil || v == "" {
		return 0, err
	}
	ended, err := store.ParseTime(v)
	if err != nil || ended.Before(start.Truncate(time.Millisecond)) {
		return 0, err
	}
	return ended.Sub(start).Seconds(), nil
}

// listingFloor is the least time a latency-bound sync takes to the
// current state: the repo and tag listings, a page after another (the
// advisories are listed beside them).
func listingFloor(m minimum, latency time.Duration) float64 {
	return float64(m.RepoPages+m.TagPages) * latency.Seconds()
}

// syncUntilCurrent runs m's first sync until its current state is ready
// (the baseline ended: every listing complete), then stops it, and
// returns how long that took: the backfill of the histories behind it is
// not waited for. It gives up after limit.
func syncUntilCurrent(ctx context.Context, m *mirror, limit time.Duration) (float64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	start := time.Now()
	done := make(chan error, 1)
	go func() {
		_, err := m.crawler.Sync(ctx)
		done <- err
	}()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err == nil {
				return currentAfter(ctx, m, start)
			}
			return 0, fmt.Errorf("sync: %w", err)
		case <-tick.C:
		}
		current, err := currentAfter(ctx, m, start)
		if err != nil {
			return 0, err
		}
		if current > 0 {
			cancel()
			<-done
			return current, nil
		}
		if time.Since(start) > limit {
			cancel()
			<-done
			return 0, fmt.Errorf("the current state was not ready after %s", limit)
		}
	}
}
