package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// crawlRequests counts each replica's crawl requests to the simulator:
// everything but the advisories, which a new leader lists at start and
// an incremental crawl does not. Each replica reaches the platform API and
// the registry through its own address (so that its registry requests,
// which carry a registry token, count as its own); the registry tokens it
// asks the simulator for are counted by the credential they are asked
// with.
type crawlRequests struct {
	h      http.Handler
	mu     sync.Mutex
	counts map[string]int
}

// crawlRequest reports whether r is a crawl's request.
func crawlRequest(r *http.Request) bool {
	return !strings.Contains(r.URL.Path, "advisor") && !strings.Contains(r.URL.Path, "vulnerabilit")
}

func (c *crawlRequests) add(who string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts[who]++
}

func (c *crawlRequests) get(who string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[who]
}

// tokens counts the registry token requests of each of tokens at the
// simulator's own address.
func (c *crawlRequests) tokens(tokens []string) func(http.Handler) http.Handler {
	return func(h http.Handler) http.Handler {
		c.h = h
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			user, pass, _ := r.BasicAuth()
			for _, tok := range tokens {
				if crawlRequest(r) && (user == tok || pass == tok || strings.Contains(r.Header.Get("Authorization"), tok)) {
					c.add(tok)
				}
			}
			h.ServeHTTP(w, r)
		})
	}
}

// address is the simulator at an address of who's own.
func (c *crawlRequests) address(t *testing.T, who string) string {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if crawlRequest(r) {
			c.add(who)
		}
		c.h.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}

// TestCluster_NewLeaderInheritsCrawlState kills the leader (SIGKILL) while
// one repo answers 403 (its tags' history reads are held back after three
// failures, for a minute: longer than the test takes) and the histories of
// the tags of another repo are still pending in the backfill, and lets the
// standby take over. Every request of the new leader until its first crawl
// and the backfill pass after it ended (its promotion's included) may add
// up to no more than the old leader's next crawl would have made: that
// crawl is run on a copy of the killed leader's mirror, against the same
// simulator, after the takeover. Before the new leader inherited the
// failures and the backfill, it made three times as many (22 against 7):
// the failing repo's reads at once, the pending histories twice, and the
// histories the old leader had read once more.
func TestCluster_NewLeaderInheritsCrawlState(t *testing.T) {
	t.Parallel() // it counts requests, not time: see "Parallel tests" in harness_test.go
	natsURL := startNATSProcess(t)
	// b crawls once when it takes over, and then not for an hour. Without
	// snapshots, b's mirror holds only what the stream carried: the
	// histories a read come in history.recorded records.
	nodes := []*node{{name: "a", token: "tok-a-1f3c", noSnapshots: true},
		{name: "b", token: "tok-b-7d2e", schedule: "@every 1h", noSnapshots: true}}
	const planToken = "tok-plan-5e8a"
	tokens := []string{nodes[0].token, nodes[1].token, planToken}
	counter := &crawlRequests{counts: map[string]int{}}
	sim, simURL := testutil.Sim(t, platformsim.Options{Seed: 83, Tokens: tokens},
		platformsim.Scale{Repos: 4, TagsPerRepo: 4, HistoryPerTag: 3, Advisories: 1, PublicImages: -1},
		counter.tokens(tokens))
	truth := sim.Truth()
	denied, unread := truth.Repos[0], truth.Repos[1]
	deny := platformsim.Fault{Name: "denied", Image: "acme/" + denied.Path, Status: 403}
	// The unread repo's reads never answer (connection reset, an error of
	// the network rather than of the repo, retried for minutes): its tags
	// stay in the backfill without being failures.
	stall := platformsim.Fault{Name: "unread", Image: "acme/" + unread.Path, ResetRate: 1}
	sim.SetFaults(stall)
	dir := t.TempDir()
	a, b := nodes[0], nodes[1]
	for _, n := range nodes {
		n.dbPath = filepath.Join(dir, n.name+".db")
		n.cfg = clusterNodeConfig(t, counter.address(t, n.token), natsURL, n)
	}
	a.start(t, "run")
	adb := openReader(t, a.dbPath)
	testutil.WaitFor(t, 30*time.Second, "a to read every history but the unread repo's", func() bool {
		return metaOf(a.dbPath, "role") == "leader" && metaOf(a.dbPath, "baseline_time") != "" &&
			queryInt(a.dbPath, `SELECT count(*) FROM tag_history`) > 0 &&
			queryInt(a.dbPath, `SELECT count(*) FROM backfill`) == 4
	})
	// The denied repo's tags move, and its reads are refused from now on.
	for i, tg := range truth.Tags {
		if tg.RepoUID == denied.UID {
			if err := sim.MoveTag(tg.UID, fmt.Sprintf("sha256:%064x", 0xd0+i)); err != nil {
				t.Fatal(err)
			}
		}
	}
	sim.SetFaults(deny, stall)
	testutil.WaitFor(t, 30*time.Second, "a to hold the denied repo's tags back", func() bool {
		return metaOf(a.dbPath, "role") == "leader" &&
			queryInt(a.dbPath, `SELECT count(*) FROM crawl_failures WHERE attempts >= 3`) == 4
	})
	b.start(t, "run")
	bdb := openReader(t, b.dbPath)
	// a is stopped (SIGSTOP) where everything it committed is on the
	// stream, and b has applied it all: then it is killed.
	testutil.Eventually(t, 30*time.Second, func() error {
		if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		var unpublished, events int
		adb.QueryRow(`SELECT count(*) FROM events WHERE published_time IS NULL`).Scan(&unpublished)
		adb.QueryRow(`SELECT count(*) FROM events`).Scan(&events)
		var applied int
		bdb.QueryRow(`SELECT count(*) FROM events`).Scan(&applied)
		if unpublished == 0 && applied == events && metaOf(b.dbPath, "role") == "standby" {
			return nil
		}
		if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
			t.Fatal(err)
		}
		return fmt.Errorf("a: %d events, %d unpublished; b applied %d", events, unpublished, applied)
	})
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.cmd.Wait()
	sim.SetFaults(deny)
	plan := copyMirror(t, a.dbPath)
	pending := queryInt(plan, `SELECT count(*) FROM backfill`)
	failing := queryInt(plan, `SELECT count(*) FROM crawl_failures`)

	testutil.WaitFor(t, 4*clusterTTL, "b to take over", func() bool { return metaOf(b.dbPath, "role") == "leader" })
	// The first crawl, and the backfill pass after it, have read the
	// histories a had not.
	testutil.WaitFor(t, 30*time.Second, "b's first crawl and backfill to end", func() bool {
		return queryInt(b.dbPath, `SELECT count(*) FROM crawl_runs WHERE job = 'crawl' AND finished_time IS NOT NULL`) > 0 &&
			queryInt(b.dbPath, `SELECT count(*) FROM crawl_runs WHERE finished_time IS NULL`) == 0 &&
			queryInt(b.dbPath, `SELECT count(*) FROM backfill`) == 0 &&
			queryInt(b.dbPath, `SELECT count(*) FROM tags WHERE history_count = 0`) == 0
	})
	got := counter.get(b.token)
	if pending == 0 || failing == 0 {
		t.Fatalf("a was killed with %d histories pending and %d failing: the test proved nothing", pending, failing)
	}
	if held := queryInt(b.dbPath, `SELECT count(*) FROM crawl_failures WHERE attempts >= 3`); held != failing {
		t.Errorf("b holds %d failures back, want the %d of a", held, failing)
	}

	// The old leader's next crawl, on its mirror as it was killed.
	want := planCrawl(t, plan, simURL, planToken, counter)
	t.Logf("a killed with %d histories pending and %d failing; requests of b's first crawl %d, of a's next crawl %d",
		pending, failing, got, want)
	if got > want {
		t.Errorf("the new leader's first crawl made %d requests, more than the %d of the old leader's next crawl",
			got, want)
	}
}

// copyMirror copies the mirror at path (its WAL included) into a directory
// of its own and returns the copy's path.
func copyMirror(t *testing.T, path string) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "plan.db")
	for _, suffix := range []string{"", "-wal"} {
		in, err := os.Open(path + suffix)
		if os.IsNotExist(err) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		out, err := os.Create(dst + suffix)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(out, in); err != nil {
			t.Fatal(err)
		}
		in.Close()
		if err := out.Close(); err != nil {
			t.Fatal(err)
		}
	}
	return dst
}

// planCrawl runs one incremental crawl (and its backfill pass) on the
// mirror at path, as a single replica with the platform token tok, and
// returns its requests.
func planCrawl(t *testing.T, path, simURL, tok string, counter *crawlRequests) int {
	t.Helper()
	ctx := context.Background()
	cfg := config.Default()
	addr := counter.address(t, tok)
	p := &cfg.Platform
	p.BaseURL, p.RegistryURL, p.Token = addr, addr, tok
	p.Group, p.Organization, p.Timeout = "org1", "acme", config.Duration{Duration: 2 * time.Second}
	cfg.Crawl.RequestsPerSecond = 0
	cfg.Store.Path, cfg.Store.InitialEvents = path, "snapshot"
	cfg.Admin.Listen, cfg.KV.Enabled, cfg.Snapshot.Enabled = "", false, false
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	app, err := daemon.Open(ctx, cfg, slog.New(slog.DiscardHandler), daemon.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer app.Close()
	before := counter.get(tok)
	if _, err := app.Crawler.Sync(ctx); err != nil {
		t.Fatalf("the old leader's next crawl: %v", err)
	}
	return counter.get(tok) - before
}
