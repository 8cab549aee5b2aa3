package crawler_test

import (
	"context"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// historyLog records the tag history requests a simulator answered, in
// order, as "<repo path>:<tag>".
type historyLog struct {
	mu    sync.Mutex
	reads []string
}

func (l *historyLog) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if image, tag, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/acme/"), "/_chainguard/history/"); ok {
			l.mu.Lock()
			l.reads = append(l.reads, image+":"+tag)
			l.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

func (l *historyLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.reads)
}

// TestBackfill_CurrentStateFirstThenHistoriesInOrder: the first crawl of an
// empty mirror lists the current state and ends the baseline without
// reading a history; the backfill then reads every history once, the tag a
// later listing showed moving first and the others newest update first;
// the histories are silent up to the listing and the moves after it are
// exact tag.moved events, one per record, in order.
func TestBackfill_CurrentStateFirstThenHistoriesInOrder(t *testing.T) {
	var log historyLog
	sim, url := testutil.Sim(t, platformsim.Options{Seed: 5, Tokens: []string{token}},
		platformsim.Scale{Repos: 3, TagsPerRepo: 4, HistoryPerTag: 3, Advisories: 2, PublicImages: -1}, log.wrap)
	// One read at a time, so that the requests' order is the backfill's.
	h := harnessOn(t, sim, url, func(c *crawler.Config) { c.Concurrency = 1 })
	ctx := context.Background()

	if _, err := crawler.CrawlOnly(h.crawler, ctx); err != nil {
		t.Fatal(err)
	}
	truth := sim.Truth()
	// Current: every tag with its digest, no history read, nothing news.
	if reads := log.all(); len(reads) != 0 {
		t.Fatalf("the listings read %d histories, want none: %v", len(reads), reads)
	}
	for _, tag := range truth.Tags {
		if n := h.count(t, `SELECT count(*) FROM tags WHERE uid = ? AND digest = ? AND deleted_time IS NULL`, tag.UID,
			tag.Digest); n != 1 {
			t.Errorf("tag %s: not in the mirror with digest %s after the listings", tag.UID, tag.Digest)
		}
	}
	if n := h.count(t, `SELECT count(*) FROM advisories`); n != len(truth.Advisories) {
		t.Errorf("advisories = %d after the listings, want %d", n, len(truth.Advisories))
	}
	if in, err := h.store.InBaseline(ctx); err != nil || in {
		t.Fatalf("in baseline after the listings = %v (%v), want the current state ready", in, err)
	}
	if ready, err := h.store.HistoryReady(ctx); err != nil || ready {
		t.Fatalf("history ready before any history was read = %v (%v)", ready, err)
	}
	if left, err := h.store.BackfillRemaining(ctx); err != nil || left != int64(len(truth.Tags)) {
		t.Fatalf("backfill remaining = %d (%v), want %d", left, err, len(truth.Tags))
	}
	if n := h.count(t, `SELECT count(*) FROM events`); n != 0 {
		t.Fatalf("%d events after the listings, want none", n)
	}

	// The oldest tag moves twice after the listing; the next crawl sees it
	// and leaves its read, and its digest, to the backfill.
	moving := truth.Tags[0]
	for _, tag := range truth.Tags {
		if tag.UpdateTime.Before(moving.UpdateTime) {
			moving = tag
		}
	}
	moves := []string{"sha256:" + strings.Repeat("a", 64), "sha256:" + strings.Repeat("b", 64)}
	for _, d := range moves {
		if err := sim.MoveTag(moving.UID, d); err != nil {
			t.Fatal(err)
		}
		sim.Advance(time.Second)
	}
	if _, err := crawler.CrawlOnly(h.crawler, ctx); err != nil {
		t.Fatal(err)
	}
	if reads := log.all(); len(reads) != 0 {
		t.Fatalf("the crawl read %d histories the backfill holds, want none: %v", len(reads), reads)
	}
	if n := h.count(t, `SELECT count(*) FROM tags WHERE uid = ? AND digest = ?`, moving.UID, moving.Digest); n != 1 {
		t.Fatalf("the moving tag's digest changed without its moves' events")
	}

	if _, err := h.crawler.Backfill(ctx); err != nil {
		t.Fatal(err)
	}
	// Order: the moving tag, then the newest update first.
	keyOf := map[string]string{}
	paths := map[string]string{}
	for _, r := range truth.Repos {
		paths[r.UID] = r.Path
	}
	for _, tag := range truth.Tags {
		keyOf[tag.UID] = paths[tag.RepoUID] + ":" + tag.Name
	}
	rest := slices.DeleteFunc(
		slices.Clone(truth.Tags),
		func(tag platformsim.TruthTag) bool { return tag.UID == moving.UID },
	)
	slices.SortStableFunc(rest, func(a, b platformsim.TruthTag) int {
		if c := b.UpdateTime.Compare(a.UpdateTime); c != 0 {
			return c
		}
		return strings.Compare(a.UID, b.UID)
	})
	want := []string{keyOf[moving.UID]}
	for _, tag := range rest {
		want = append(want, keyOf[tag.UID])
	}
	if got := log.all(); !slices.Equal(got, want) {
		t.Fatalf("history reads:\n got %v\nwant %v", got, want)
	}
	if ready, err := h.store.HistoryReady(ctx); err != nil || !ready {
		t.Fatalf("history ready after the backfill = %v (%v)", ready, err)
	}

	// The history in full, the moves as events and nothing else news.
	after := sim.Truth()
	for uid, recs := range after.History {
		if n := h.count(t, `SELECT count(*) FROM tag_history WHERE tag_uid = ?`, uid); n != len(recs) {
			t.Errorf("tag %s: %d history records, want %d", uid, n, len(recs))
		}
	}
	rows, err := h.store.Reader().
		Query(`SELECT subject, json_extract(data, '$.after.digest'), json_extract(data, '$.before.digest') FROM events
		WHERE type != 'history.recorded' ORDER BY seq`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var subject, after, before string
		if err := rows.Scan(&subject, &after, &before); err != nil {
			t.Fatal(err)
		}
		got = append(got, fmt.Sprintf("%s %s->%s", subject, before, after))
	}
	wantEvents := []string{
		fmt.Sprintf("%s %s->%s", moving.UID, moving.Digest, moves[0]),
		fmt.Sprintf("%s %s->%s", moving.UID, moves[0], moves[1]),
	}
	if !slices.Equal(got, wantEvents) {
		t.Fatalf("events after the backfill:\n got %v\nwant %v", got, wantEvents)
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE type = 'tag.moved'`); n != 2 {
		t.Fatalf("tag.moved events = %d, want 2", n)
	}
	// Followers get the silent records as replication records: every
	// record of every tag is on the stream once, as a move or recorded.
	if n := h.count(t, `SELECT count(DISTINCT subject) FROM events WHERE type = 'history.recorded'`); n != len(
		truth.Tags,
	) {
		t.Errorf("history.recorded for %d tags, want %d", n, len(truth.Tags))
	}
	if n := h.count(t, `SELECT count(*) FROM tags WHERE uid = ? AND digest = ?`, moving.UID, moves[1]); n != 1 {
		t.Errorf("the moving tag's digest is not its last move's")
	}
	// A later crawl reads nothing again.
	before := len(log.all())
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if reads := log.all()[before:]; len(reads) != 0 {
		t.Errorf("a crawl after the backfill read %v again", reads)
	}
}

// TestBackfill_ATagReadWhileTheStoreIsAskedIsNotReadAgain: the backfill
// asks the store for the next tags while reads are under way, and the
// store answers from a snapshot of the mirror taken as it began. A tag
// whose read ends after that snapshot and before the backfill looks at
// it is still in the answer; it must not be read a second time. The
// hook holds the backfill at such a tag until its read has ended (CI saw
// 241 reads of 240 tags, one run in eight).
func TestBackfill_ATagReadWhileTheStoreIsAskedIsNotReadAgain(t *testing.T) {
	h := newHarness(t, platformsim.Scale{Repos: 2, TagsPerRepo: 100, HistoryPerTag: 1, PublicImages: -1})
	var waited atomic.Int32
	crawler.SetBeforeSkip(h.crawler, func(uid string, underWay func(string) bool) {
		if !underWay(uid) {
			return
		}
		waited.Add(1)
		for deadline := time.Now().Add(10 * time.Second); underWay(uid); {
			if time.Now().After(deadline) {
				t.Errorf("the read of tag %s never ended", uid)
				return
			}
			time.Sleep(time.Millisecond)
		}
	})
	if _, err := h.crawler.Sync(context.Background()); err != nil {
		t.Fatal(err)
	}
	if waited.Load() == 0 {
		t.Fatal("the backfill never met a tag whose read was under way: the test proved nothing")
	}
	if got, want := h.sim.Stats().ByEndpoint["GET /v2/{image}/_chainguard/history/{tag}"], 200; got != want {
		t.Errorf("history requests=%d, want %d (one per tag; %d tags met while read)", got, want, waited.Load())
	}
}
