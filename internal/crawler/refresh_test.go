package crawler_test

import (
	"context"
	"net/http"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestRefresh_APushDuringTheBaselineWaitsForItsEnd: a tag listed on the
// baseline's first page moves, and its push arrives while the listing's
// second page is held. The push's refresh waits for the end of the
// baseline, and the move, which came after the tag's listing, is a
// tag.moved event. (A refresh made during the baseline took the move in
// silently: the listing it made was the baseline's, and its history read
// stopped there.)
func TestRefresh_APushDuringTheBaselineWaitsForItsEnd(t *testing.T) {
	release := make(chan struct{})
	hold := func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/registry/v2/tags" && r.URL.Query().Get("page_token") != "" {
				select {
				case <-release:
				case <-r.Context().Done():
					return
				}
			}
			h.ServeHTTP(w, r)
		})
	}
	sim, url := testutil.Sim(t, platformsim.Options{Seed: 5, Tokens: []string{token}},
		platformsim.Scale{Repos: 2, TagsPerRepo: 150, HistoryPerTag: 2, Advisories: 2, PublicImages: -1}, hold)
	// A request rate: no history is read before the listings end.
	h := harnessClient(t, sim, url, func(c *platform.Config) { c.MaxInFlight, c.RequestsPerSecond = 4, 1000 },
		func(c *crawler.Config) { c.Concurrency = 4 })
	ctx := context.Background()
	crawled := make(chan error, 1)
	go func() {
		_, err := crawler.CrawlOnly(h.crawler, ctx)
		crawled <- err
	}()
	testutil.WaitFor(t, 10*time.Second, "the listing's first page", func() bool {
		return h.count(t, `SELECT count(*) FROM tags`) > 0
	})
	var uid, repoUID, name, listed string
	if err := h.store.Reader().QueryRow(`SELECT uid, repo_uid, name, digest FROM tags ORDER BY uid LIMIT 1`).
		Scan(&uid, &repoUID, &name, &listed); err != nil {
		t.Fatal(err)
	}
	moved := "sha256:" + "5e1f" + listed[len("sha256:")+4:]
	if err := sim.MoveTag(uid, moved); err != nil {
		t.Fatal(err)
	}
	refreshed := make(chan error, 1)
	go func() { refreshed <- h.crawler.RefreshTag(ctx, repoUID, name) }()
	testutil.WaitFor(t, 10*time.Second, "the push's refresh to wait, or end", func() bool {
		return crawler.WaitingForBaseline(h.crawler) == 1 || len(refreshed) == 1
	})
	close(release)
	if err := <-crawled; err != nil {
		t.Fatal(err)
	}
	if err := <-refreshed; err != nil {
		t.Fatal(err)
	}
	var digest string
	if err := h.store.Reader().QueryRow(`SELECT digest FROM tags WHERE uid = ?`, uid).Scan(&digest); err != nil {
		t.Fatal(err)
	}
	if digest != moved {
		t.Fatalf("the tag points at %s, want %s", digest, moved)
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE type = 'tag.moved' AND subject = ?
		AND json_extract(data, '$.before.digest') = ? AND json_extract(data, '$.after.digest') = ?`,
		uid, listed, moved); n != 1 {
		t.Fatalf("%d tag.moved events from %s to %s, want 1: the move came after the tag's listing", n, listed, moved)
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE type != 'history.recorded'`); n != 1 {
		t.Errorf("%d events, want only the move's", n)
	}
}
