package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// historyPage is the tag history API's page size: one ApplyHistory call.
const historyPage = 1000

// ingestTags stores a repo with tags tags, named so that tests can find them,
// and returns their refs.
func ingestTags(tb testing.TB, st *store.Store, tags int) []store.TagRef {
	tb.Helper()
	repo := nginx()
	mustApplyRepos(tb, st, repo)
	var refs []store.TagRef
	for start := 0; start < tags; start += 200 {
		var page []store.Tag
		for i := start; i < min(start+200, tags); i++ {
			page = append(page, tag(fmt.Sprintf("g1/r1/t%06d", i), fmt.Sprintf("v%d", i), i))
		}
		refs = append(refs, mustApplyTags(tb, st, repo, page...)...)
	}
	return refs
}

// historyOf returns a page of n records for tag number i, one minute apart,
// with distinct digests.
func historyOf(i, n int) []store.HistoryRecord {
	t0 := ts("2025-01-01T00:00:00Z")
	recs := make([]store.HistoryRecord, n)
	for j := range recs {
		recs[j] = store.HistoryRecord{Time: t0.Add(time.Duration(j) * time.Minute), Digest: digest(i*n + j)}
	}
	return recs
}

func TestReaders_DuringIngest(t *testing.T) {
	for _, size := range []struct {
		name string
		rows int
		long bool
	}{{"50k", 50_000, false}, {"1M", 1_000_000, true}} {
		t.Run(size.name, func(t *testing.T) {
			if size.long && (testing.Short() || os.Getenv("LONG_TESTS") != "1") {
				t.Skip("ingesting 1,000,000 rows takes minutes under -race: set LONG_TESTS=1 (without -short) to run it")
			}
			readersDuringIngest(t, size.rows)
		})
	}
}

// readersDuringIngest ingests rows history rows, a page per transaction,
// while readers query the views in a loop, and checks that no query fails
// and that readers only ever see whole pages.
func readersDuringIngest(t *testing.T, rows int) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), true, store.Options{Readers: 4})
	refs := ingestTags(t, st, rows/historyPage)

	// Readers pace themselves by the writer's commits rather than spinning:
	// on a two-core machine, spinning readers would take most of the CPU
	// from the writer the test is about. After every commit each reader runs
	// another round of queries, which overlaps the next page's transaction.
	var pace pacer
	pace.init()
	const readers = 3
	results := make([]readResult, readers)
	var wg sync.WaitGroup
	for r := range readers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			results[r] = readLoop(ctx, st.Reader(), rows, &pace)
		}()
	}
	var werr error
	for i, ref := range refs {
		if _, werr = st.ApplyHistory(ctx, ref, historyOf(i, historyPage), true); werr != nil {
			break
		}
		pace.committed()
	}
	pace.finish()
	wg.Wait()
	if werr != nil {
		t.Fatalf("ingest: %v", werr)
	}
	if got := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM tag_history`); got != rows {
		t.Fatalf("history rows=%d, want %d", got, rows)
	}
	midIngest := 0
	for i, r := range results {
		if r.err != nil {
			t.Fatalf("reader %d after %d queries: %v", i, r.queries, r.err)
		}
		midIngest += r.midIngest
		t.Logf("reader %d: %d queries, %d rounds saw the ingest part way", i, r.queries, r.midIngest)
	}
	if midIngest == 0 {
		t.Fatal("no reader query ran while the ingest was under way")
	}
}

// pacer lets readers wait for the writer's next commit.
type pacer struct {
	mu    sync.Mutex
	next  chan struct{} // closed at the next commit
	pages int           // pages committed so far
	done  chan struct{} // closed when the writer finished
}

func (p *pacer) init() { p.next, p.done = make(chan struct{}), make(chan struct{}) }

// wait returns the channel that the next commit closes, and how many pages
// are committed.
func (p *pacer) wait() (<-chan struct{}, int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.next, p.pages
}

func (p *pacer) committed() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pages++
	close(p.next)
	p.next = make(chan struct{})
}

func (p *pacer) finish() { close(p.done) }

type readResult struct {
	queries, midIngest int
	err                error
}

// readLoop runs rounds of analyst queries, one per commit, until the writer
// is done or a query fails. It counts the rounds that saw the ingest part
// way, and fails if a snapshot shows a page's rows without its bookmark or
// the other way round, part of a page, or fewer rows than before.
func readLoop(ctx context.Context, db *sql.DB, total int, pace *pacer) (res readResult) {
	queries := []string{
		`SELECT COUNT(*) FROM tag_moves WHERE moved_time >= '2025-01-01T01:00:00.000Z' AND moved_time < '2025-01-01T01:01:00.000Z'`,
		`SELECT COUNT(*) FROM (SELECT moved_time FROM tag_moves WHERE tag_uid = 'g1/r1/t000001' ORDER BY moved_time DESC LIMIT 10)`,
		`SELECT COUNT(*) FROM (SELECT * FROM repo_moves ORDER BY moves DESC LIMIT 5)`,
		`SELECT COUNT(*) FROM current_tags WHERE repo = 'nginx'`,
		`SELECT COUNT(*) FROM (SELECT * FROM events ORDER BY seq DESC LIMIT 20)`,
	}
	last := 0
	for round := 0; ; round++ {
		next, pages := pace.wait()
		// The newest page's tag: its rows and its bookmark come from one
		// transaction, so one snapshot shows both or neither. Counting the
		// whole table each round would cost the writer its CPU.
		uid := fmt.Sprintf("g1/r1/t%06d", max(pages-1, 0))
		var n, rowsOfTag, bookmarked int
		err := db.QueryRowContext(
			ctx,
			`SELECT (SELECT COALESCE(SUM(history_count), 0) FROM tags),
			(SELECT COUNT(*) FROM tag_history WHERE tag_uid = ?), (SELECT history_count FROM tags WHERE uid = ?)`,
			uid,
			uid,
		).Scan(
			&n,
			&rowsOfTag,
			&bookmarked,
		)
		if err != nil {
			res.err = fmt.Errorf("count history: %w", err)
			return res
		}
		res.queries++
		switch {
		case rowsOfTag != bookmarked:
			res.err = fmt.Errorf("saw %d history rows of %s and a bookmark for %d in one snapshot", rowsOfTag, uid, bookmarked)
			return res
		case n%historyPage != 0:
			res.err = fmt.Errorf("saw bookmarks for %d history rows: part of a page", n)
			return res
		case n < last:
			res.err = fmt.Errorf("saw %d history rows after %d", n, last)
			return res
		case n > 0 && n < total:
			res.midIngest++
		}
		last = n
		// One analyst query per round, in turn, keeps the readers' share of
		// the CPU small next to the writer's.
		q := queries[round%len(queries)]
		if err := db.QueryRowContext(ctx, q).Scan(&n); err != nil {
			res.err = fmt.Errorf("%s: %w", q, err)
			return res
		}
		res.queries++
		select {
		case <-next:
		case <-pace.done:
			return res
		}
	}
}
