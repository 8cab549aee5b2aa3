package crawler_test

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// listingGate holds the tag listing's second page until the simulator has
// answered want history reads, or for 5 s, and records how many it had
// answered when that page went.
type listingGate struct {
	historyLog
	want    int
	mu      sync.Mutex
	atPage2 int
	// reading and most count the history requests being answered, and
	// the most at once.
	reading, most atomic.Int64
}

func (g *listingGate) wrap(h http.Handler) http.Handler {
	inner := g.historyLog.wrap(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/registry/v2/tags" && r.URL.Query().Get("page_token") != "" {
			deadline := time.Now().Add(5 * time.Second)
			for len(g.all()) < g.want && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
			g.mu.Lock()
			g.atPage2 = len(g.all())
			g.mu.Unlock()
		}
		if strings.Contains(r.URL.Path, "/_chainguard/history/") {
			n := g.reading.Add(1)
			defer g.reading.Add(-1)
			for m := g.most.Load(); n > m && !g.most.CompareAndSwap(m, n); m = g.most.Load() {
			}
		}
		inner.ServeHTTP(w, r)
	})
}

// TestBaseline_SparePlacesReadHistoriesDuringTheListing: without a request
// rate, the places on the wire the baseline's listings leave free read the
// histories of the tags listed so far; those reads are silent, go to
// followers as replication records, and are not read again by the backfill.
// With a rate, the listings read no history.
func TestBaseline_SparePlacesReadHistoriesDuringTheListing(t *testing.T) {
	const places = 5 // 4 spare
	scale := platformsim.Scale{Repos: 3, TagsPerRepo: 100, HistoryPerTag: 2, Advisories: 2, PublicImages: -1}
	ctx := context.Background()

	t.Run("NoRate", func(t *testing.T) {
		gate := &listingGate{want: 3}
		sim, url := testutil.Sim(t, platformsim.Options{Seed: 5, Tokens: []string{token}}, scale, gate.wrap)
		h := harnessClient(t, sim, url, func(c *platform.Config) { c.MaxInFlight = places },
			func(c *crawler.Config) { c.Concurrency = places })
		sum, err := crawler.CrawlOnly(h.crawler, ctx)
		if err != nil {
			t.Fatal(err)
		}
		if most := gate.most.Load(); most > places-1 {
			t.Errorf("%d history reads at once during the listings, want at most the %d places they leave",
				most, places-1)
		}
		truth := sim.Truth()
		gate.mu.Lock()
		atPage2 := gate.atPage2
		gate.mu.Unlock()
		if atPage2 < gate.want {
			t.Fatalf("%d histories read before the listing's second page, want %d: the free places stayed empty",
				atPage2, gate.want)
		}
		// A read still under way when the listings end is cut short, and
		// its tag left to the backfill: at most one a spare place.
		answered := len(gate.all())
		read := h.count(t, `SELECT count(*) FROM tags WHERE history_count > 0`)
		if int(sum.HistoryReads) != read || read == 0 || answered-read > places-1 {
			t.Errorf("summary: %d history reads; %d tags read, %d reads answered: want them equal but for at most %d cut short",
				sum.HistoryReads, read, answered, places-1)
		}
		if in, err := h.store.InBaseline(ctx); err != nil || in {
			t.Fatalf("in baseline after the listings = %v (%v)", in, err)
		}
		// Silent, but on the stream for followers.
		if n := h.count(t, `SELECT count(*) FROM events WHERE type != 'history.recorded'`); n != 0 {
			t.Fatalf("%d events from the baseline, want none", n)
		}
		if n := h.count(t, `SELECT count(DISTINCT subject) FROM events WHERE type = 'history.recorded'`); n != read {
			t.Fatalf("history.recorded for %d tags, want the %d read", n, read)
		}
		left, err := h.store.BackfillRemaining(ctx)
		if err != nil || left != int64(len(truth.Tags)-read) {
			t.Fatalf("backfill remaining = %d (%v), want %d", left, err, len(truth.Tags)-read)
		}

		if _, err := h.crawler.Backfill(ctx); err != nil {
			t.Fatal(err)
		}
		all := gate.all()
		if unique := slices.Compact(slices.Sorted(slices.Values(all))); len(unique) != len(truth.Tags) ||
			len(all)-len(unique) != answered-read {
			t.Fatalf("%d history reads of %d tags (%d distinct), want each tag once but the %d cut short",
				len(all), len(truth.Tags), len(unique), answered-read)
		}
		for uid, recs := range truth.History {
			if n := h.count(t, `SELECT count(*) FROM tag_history WHERE tag_uid = ?`, uid); n != len(recs) {
				t.Errorf("tag %s: %d history records, want %d", uid, n, len(recs))
			}
		}
		if n := h.count(t, `SELECT count(*) FROM events WHERE type != 'history.recorded'`); n != 0 {
			t.Fatalf("%d events after the backfill, want none", n)
		}
		if n := h.count(t, `SELECT count(DISTINCT subject) FROM events WHERE type = 'history.recorded'`); n != len(
			truth.Tags,
		) {
			t.Errorf("history.recorded for %d tags, want %d", n, len(truth.Tags))
		}
		if ready, err := h.store.HistoryReady(ctx); err != nil || !ready {
			t.Fatalf("history ready after the backfill = %v (%v)", ready, err)
		}
	})

	t.Run("Rate", func(t *testing.T) {
		var log historyLog
		sim, url := testutil.Sim(t, platformsim.Options{Seed: 5, Tokens: []string{token}}, scale, log.wrap)
		h := harnessClient(t, sim, url, func(c *platform.Config) {
			c.MaxInFlight, c.RequestsPerSecond = places, 1000
		}, func(c *crawler.Config) { c.Concurrency = places })
		if _, err := crawler.CrawlOnly(h.crawler, ctx); err != nil {
			t.Fatal(err)
		}
		if reads := log.all(); len(reads) != 0 {
			t.Fatalf("the listings read %d histories under a request rate, want none", len(reads))
		}
		if left, err := h.store.BackfillRemaining(ctx); err != nil || left != int64(len(sim.Truth().Tags)) {
			t.Fatalf("backfill remaining = %d (%v), want every tag", left, err)
		}
	})
}

// TestBaseline_AStalledSpareReadDoesNotHoldTheListings: the end of the
// baseline's listings never waits for a history read: reads under way then
// are cut short, not failed, and their tags stay the backfill's. With every
// place the spare reads may hold stalled, and more reads waiting for one,
// the listing's later pages go in the place kept for them.
func TestBaseline_AStalledSpareReadDoesNotHoldTheListings(t *testing.T) {
	const places = 5
	var arrived atomic.Int64
	release := make(chan struct{})
	stall := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if strings.Contains(r.URL.Path, "/_chainguard/history/") {
				arrived.Add(1)
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			if r.URL.Path == "/registry/v2/tags" && r.URL.Query().Get("page_token") != "" {
				// The second page waits for the spare reads to be under way.
				deadline := time.Now().Add(5 * time.Second)
				for arrived.Load() < places-1 && time.Now().Before(deadline) {
					time.Sleep(time.Millisecond)
				}
			}
			h.ServeHTTP(w, r)
		})
	}
	sim, url := testutil.Sim(t, platformsim.Options{Seed: 5, Tokens: []string{token}},
		platformsim.Scale{Repos: 3, TagsPerRepo: 300, HistoryPerTag: 2, Advisories: 2, PublicImages: -1}, stall)
	h := harnessClient(t, sim, url, func(c *platform.Config) { c.MaxInFlight = places },
		func(c *crawler.Config) { c.Concurrency = places })
	ctx := context.Background()
	done := make(chan error, 1)
	go func() {
		_, err := crawler.CrawlOnly(h.crawler, ctx)
		done <- err
	}()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		close(release)
		t.Fatal("the listings did not end while history reads were stalled")
	}
	if n := arrived.Load(); n < places-1 {
		t.Fatalf("%d spare reads were under way, want %d", n, places-1)
	}
	tags := len(sim.Truth().Tags)
	if left, err := h.store.BackfillRemaining(ctx); err != nil || left != int64(tags) {
		t.Fatalf("backfill remaining = %d (%v), want every tag (%d)", left, err, tags)
	}
	if n := h.count(t, `SELECT count(*) FROM crawl_failures`); n != 0 {
		t.Fatalf("%d crawl failures: a read cut short by the end of the listings is no failure", n)
	}
	close(release)
	if _, err := h.crawler.Backfill(ctx); err != nil {
		t.Fatal(err)
	}
	if ready, err := h.store.HistoryReady(ctx); err != nil || !ready {
		t.Fatalf("history ready after the backfill = %v (%v)", ready, err)
	}
}
