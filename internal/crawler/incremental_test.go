package crawler_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/store"
)

// liveTags describes the live tags of a mirror: digest, deprecation and
// history count per uid.
func liveTags(t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	rows, err := db.Query(
		`SELECT uid, digest, deprecated, history_count FROM tags WHERE deleted_time IS NULL AND uid LIKE 'org1/%'`,
	)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	out := map[string]string{}
	for rows.Next() {
		var uid, digest string
		var dep bool
		var n int
		if err := rows.Scan(&uid, &digest, &dep, &n); err != nil {
			t.Fatal(err)
		}
		out[uid] = fmt.Sprintf("%s deprecated=%v history=%d", digest, dep, n)
	}
	return out
}

// TestSync_UpdatedSinceMissesNothingTheSweepFinds runs two mirrors of one
// organization while tags move, are deprecated, created and deleted under
// them: one kept by incremental crawls (an updated_since listing of one
// page), one by full sweeps. After every round the incremental mirror holds
// every live tag the sweep's holds, equal; it differs only in deletions,
// which only a sweep records, and one sweep of its own makes them equal.
func TestSync_UpdatedSinceMissesNothingTheSweepFinds(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 40, TagsPerRepo: 6, HistoryPerTag: 3, PublicImages: -1})
	ctx := context.Background()
	full, err := store.Open(ctx, filepath.Join(t.TempDir(), "full.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer full.Close()
	sweeper := crawler.New(
		h.client,
		full,
		crawler.Config{Group: "org1", Concurrency: 4, Logger: slog.New(slog.DiscardHandler)},
	)
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := sweeper.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	h.sim.SetRates(platformsim.Rates{MoveTag: 10, Deprecate: 4, CreateTag: 4, DeleteTag: 2})
	kinds := map[platformsim.MutationKind]int{}
	for round := range 8 {
		h.sim.Advance(time.Minute)
		for _, m := range h.sim.Step(6) {
			kinds[m.Kind]++
		}
		h.sim.ResetStats()
		if _, err := h.crawler.Sync(ctx); err != nil {
			t.Fatal(err)
		}
		if st := h.sim.Stats(); st.ByEndpoint["GET /registry/v2/tags"] != 1 {
			t.Errorf(
				"round %d: the incremental crawl made %d tag list requests, want 1",
				round,
				st.ByEndpoint["GET /registry/v2/tags"],
			)
		}
		if _, err := sweeper.Sweep(ctx); err != nil {
			t.Fatal(err)
		}
		inc, swept := liveTags(t, h.store.Reader()), liveTags(t, full.Reader())
		for uid, want := range swept {
			if got := inc[uid]; got != want {
				t.Errorf("round %d: tag %s: incremental %q, sweep %q", round, uid, got, want)
			}
			delete(inc, uid)
		}
		for uid := range inc {
			if !gone(h.sim.Truth(), uid) {
				t.Errorf("round %d: tag %s live in the incremental mirror only, and not deleted upstream", round, uid)
			}
		}
	}
	for _, k := range []platformsim.MutationKind{platformsim.TagMoved, platformsim.TagDeprecated, platformsim.TagCreated,
		platformsim.TagDeleted} {
		if kinds[k] == 0 {
			t.Errorf("the scenario made no %s: the test proves less than it says (made %v)", k, kinds)
		}
	}
	// One sweep of its own records the deletions, and the mirrors agree.
	if _, err := h.crawler.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	inc, swept := liveTags(t, h.store.Reader()), liveTags(t, full.Reader())
	if a, b := fmt.Sprint(inc), fmt.Sprint(swept); a != b {
		t.Errorf("after a sweep the mirrors differ:\n%s", firstDiff(a, b))
	}
}

func gone(truth platformsim.Truth, uid string) bool {
	for _, tg := range truth.Tags {
		if tg.UID == uid {
			return false
		}
	}
	return true
}

func firstDiff(a, b string) string {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			lo := max(0, i-80)
			return "incremental ..." + a[lo:min(len(a), i+80)] + "\nsweep ..." + b[lo:min(len(b), i+80)]
		}
	}
	return strings.Repeat("=", 3) + " one is a prefix of the other"
}

// TestSync_ProgressForStatus: a running crawl keeps its progress in the
// mirror (what "syncd status" shows): tags listed, history reads done of
// those queued, the request rate, and that the rate limit holds it back;
// the record goes when the crawl ends.
func TestSync_ProgressForStatus(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 3, TagsPerRepo: 10, HistoryPerTag: 2, PublicImages: -1})
	// A limit low enough that a loaded machine running the race detector
	// still reaches it (held means at least 90% of it): at 40 a second the
	// client fell short now and then, and the crawl ended unheld.
	const limit = 20
	client, err := platform.New(
		platform.Config{
			BaseURL:           h.client.RegistryURL(),
			RegistryURL:       h.client.RegistryURL(),
			Token:             platform.StaticToken(token),
			Organization:      "acme",
			PublicOrg:         "chainguard",
			Vendor:            "chainguard",
			RequestsPerSecond: limit,
		},
	)
	if err != nil {
		t.Fatal(err)
	}
	c := crawler.New(
		client,
		h.store,
		crawler.Config{Group: "org1", ProgressEvery: 20 * time.Millisecond, Logger: slog.New(slog.DiscardHandler)},
	)
	done := make(chan error, 1)
	go func() { _, err := c.Sync(context.Background()); done <- err }()
	var p crawler.Progress
	deadline := time.Now().Add(20 * time.Second)
	for {
		var v string
		h.store.Reader().QueryRow(`SELECT value FROM meta WHERE key = ?`, store.ProgressKey).Scan(&v)
		if v != "" && json.Unmarshal([]byte(v), &p) == nil && p.HistoryRead > 0 && p.HeldByRateLimit {
			break
		}
		select {
		case err := <-done:
			t.Fatalf("the crawl ended (%v) before its progress showed reads held by the rate limit: %q", err, v)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("no progress recorded: %q", v)
		}
		runtime.Gosched()
	}
	if p.TagsTotal != 30 || p.HistoryQueued < p.HistoryRead || p.RateLimit != limit || p.ETA == "" {
		t.Errorf("progress %+v: want 30 tags, reads within those queued, the limit %d and an ETA", p, limit)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := h.count(t, `SELECT count(*) FROM meta WHERE key = ? AND value != ''`, store.ProgressKey); n != 0 {
		t.Errorf("the progress of a finished crawl is still recorded")
	}
}
