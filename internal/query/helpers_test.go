package query_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

const (
	token  = "query-test-token"
	prefix = "syncd-query-test"
)

// world is a mirror crawled from a simulator, a NATS server, and the query
// service answering from the mirror on it.
type world struct {
	sim     *platformsim.Sim
	store   *store.Store
	crawler *crawler.Crawler
	nats    *testutil.NATSServer
	pos     *query.Position
	svc     *query.Service
	client  *query.Client
}

// scale is the simulated organization of these tests: small, with repos
// below a subgroup, long enough histories to page, and advisories.
var scale = platformsim.Scale{
	Repos:         4,
	TagsPerRepo:   3,
	HistoryPerTag: 7,
	Advisories:    12,
	NestedRepos:   1,
	PublicImages:  -1,
}

// newWorld crawls the simulator into a fresh mirror (the baseline) and
// starts the service with cfg (its prefix, and defaults for the rest).
func newWorld(t *testing.T, cfg query.Config) *world {
	t.Helper()
	w := mirrorOf(t, scale)
	w.crawl(t)
	w.nats = testutil.NATS(t)
	w.pos = query.NewPosition()
	qs := w.store.Queries()
	t.Cleanup(func() { qs.Close() })
	w.start(t, qs, cfg)
	return w
}

// mirrorOf is a simulator of sc and an empty mirror with a crawler of it.
func mirrorOf(tb testing.TB, sc platformsim.Scale) *world {
	tb.Helper()
	sim, url := testutil.Sim(tb, platformsim.Options{Seed: 7, Tokens: []string{token}}, sc)
	st, err := store.Open(context.Background(), filepath.Join(tb.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { st.Close() })
	client, err := platform.New(platform.Config{BaseURL: url, RegistryURL: url, Token: platform.StaticToken(token),
		Organization: "acme", PublicOrg: "chainguard", Vendor: "chainguard", MaxRetryTime: 2 * time.Second})
	if err != nil {
		tb.Fatal(err)
	}
	return &world{
		sim:   sim,
		store: st,
		crawler: crawler.New(
			client,
			st,
			crawler.Config{Group: "org1", Concurrency: 4, Logger: slog.New(slog.DiscardHandler)},
		),
	}
}

// crawl syncs the mirror with the simulator: repos, tags, history and
// advisories.
func (w *world) crawl(t testing.TB) {
	t.Helper()
	ctx := context.Background()
	if _, err := w.crawler.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := w.crawler.SyncAdvisories(ctx); err != nil {
		t.Fatal(err)
	}
}

// start starts a service answering from m, and a client of it on a
// connection of its own.
func (w *world) start(t *testing.T, m query.Mirror, cfg query.Config) {
	t.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = prefix
	}
	w.svc = query.New(connect(t, w.nats.URL()), m, w.pos, cfg)
	if err := w.svc.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.svc.Stop)
	w.client = &query.Client{NC: connect(t, w.nats.URL()), Prefix: cfg.Prefix}
}

func connect(t testing.TB, url string) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// ask sends req to endpoint and decodes the answer into out, failing the
// test on any error.
func (w *world) ask(t *testing.T, endpoint string, req, out any) {
	t.Helper()
	if err := w.try(endpoint, req, out); err != nil {
		t.Fatalf("%s %+v: %v", endpoint, req, err)
	}
}

// try sends req to endpoint within 5s.
func (w *world) try(endpoint string, req, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return w.client.Do(ctx, endpoint, req, out)
}

// refused sends req and checks that it is refused with code (and reason,
// when given), returning the error.
func (w *world) refused(t *testing.T, endpoint string, req any, code int, reason string) *query.Error {
	t.Helper()
	err := w.try(endpoint, req, nil)
	e, ok := err.(*query.Error)
	if !ok {
		t.Fatalf("%s %+v: got %v, want a %d error", endpoint, req, err, code)
	}
	if e.Code != code || (reason != "" && e.Reason != reason) {
		t.Fatalf("%s %+v: got %d %q (%s), want %d %s", endpoint, req, e.Code, e.Reason, e.Message, code, reason)
	}
	if e.Message == "" {
		t.Errorf("%s %+v: %d without a message", endpoint, req, code)
	}
	return e
}

// ms is t as the mirror keeps it: UTC, to the millisecond.
func ms(t time.Time) time.Time { return t.UTC().Truncate(time.Millisecond) }

func timeOf(p *time.Time) string {
	if p == nil {
		return "null"
	}
	return p.UTC().Format(time.RFC3339Nano)
}
