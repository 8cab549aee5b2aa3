package crawler

import (
	"context"
	"fmt"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// committerStore opens a mirror past its baseline holding one repo, and
// counts its commits.
func committerStore(t *testing.T) (*store.Store, store.Repo, *atomic.Int64) {
	t.Helper()
	ctx := context.Background()
	commits := new(atomic.Int64)
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "m.db"), store.Options{
		BeforeCommit: func(context.Context) error { commits.Add(1); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	repo := store.Repo{UID: "org1/r", Name: "r"}
	if _, err := st.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	return st, repo, commits
}

// TestHistoryCommitter_ConcurrentReadsShareCommits: reads finishing at once
// are all written, each exactly once, with every event counted, in no more
// commits than reads.
func TestHistoryCommitter_ConcurrentReadsShareCommits(t *testing.T) {
	ctx := context.Background()
	st, repo, commits := committerStore(t)
	const tags = 40
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var list []store.Tag
	for i := range tags {
		list = append(
			list,
			store.Tag{
				UID:        fmt.Sprintf("org1/r/t%02d", i),
				Name:       fmt.Sprintf("t%02d", i),
				Digest:     "sha256:c",
				UpdateTime: t0.Add(2 * time.Second),
			},
		)
	}
	need, _, err := st.ApplyTags(ctx, repo, list)
	if err != nil {
		t.Fatal(err)
	}
	before := commits.Load()
	hc := &historyCommitter{store: st, maxBatch: 16}
	var wg sync.WaitGroup
	var events atomic.Int64
	for _, ref := range need {
		wg.Go(func() {
			recs := []store.HistoryRecord{
				{Time: t0, Digest: "sha256:a"},
				{Time: t0.Add(time.Second), Digest: "sha256:b"},
				{Time: t0.Add(2 * time.Second), Digest: "sha256:c"},
			}
			n, err := hc.apply(ctx, store.HistoryUpdate{Ref: ref, Records: recs, Complete: true})
			if err != nil {
				t.Error(err)
			}
			events.Add(int64(n))
		})
	}
	wg.Wait()
	var rows, moved int
	st.Reader().QueryRow(`SELECT count(*) FROM tag_history`).Scan(&rows)
	st.Reader().QueryRow(`SELECT count(*) FROM events WHERE type = 'tag.moved'`).Scan(&moved)
	// Each first read announces its tag (tag.created) and records its
	// two moves.
	if rows != 3*tags || moved != 2*tags || events.Load() != 3*tags {
		t.Fatalf(
			"history rows=%d moved events=%d counted=%d, want %d, %d, %d",
			rows,
			moved,
			events.Load(),
			3*tags,
			2*tags,
			3*tags,
		)
	}
	if n := commits.Load() - before; n > tags {
		t.Fatalf("%d commits for %d reads", n, tags)
	} else {
		t.Logf("%d reads in %d commits", tags, n)
	}
}

// TestHistoryCommitter_WaitsForReadsOnTheWire: while requests are under
// way, the first read to finish waits for them and they share its commit;
// a read with no request under way commits at once (the linger is an hour,
// so waiting for it would hang the test).
func TestHistoryCommitter_WaitsForReadsOnTheWire(t *testing.T) {
	ctx := context.Background()
	st, repo, commits := committerStore(t)
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var list []store.Tag
	for i := range 4 {
		list = append(
			list,
			store.Tag{
				UID:        fmt.Sprintf("org1/r/t%d", i),
				Name:       fmt.Sprintf("t%d", i),
				Digest:     "sha256:b",
				UpdateTime: t0.Add(time.Second),
			},
		)
	}
	need, _, err := st.ApplyTags(ctx, repo, list)
	if err != nil {
		t.Fatal(err)
	}
	update := func(ref store.TagRef) store.HistoryUpdate {
		return store.HistoryUpdate{Ref: ref, Complete: true,
			Records: []store.HistoryRecord{{Time: t0, Digest: "sha256:a"}, {Time: t0.Add(time.Second), Digest: "sha256:b"}}}
	}
	rows := func() int {
		var n int
		if err := st.Reader().QueryRow(`SELECT count(*) FROM tag_history`).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	var reading atomic.Int64
	hc := newHistoryCommitter(st, &reading)
	hc.linger = time.Hour

	// Three requests under way; the first to end waits for the others.
	reading.Store(3)
	before := commits.Load()
	queued := func(n int) {
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("%d reads to queue", n), func() bool {
			hc.mu.Lock()
			defer hc.mu.Unlock()
			return hc.committing && len(hc.queue) == n
		})
	}
	var wg sync.WaitGroup
	for i, ref := range need[:3] {
		wg.Go(func() {
			if _, err := hc.apply(ctx, update(ref)); err != nil {
				t.Error(err)
			}
		})
		queued(i + 1)
		if n := rows(); n != 0 {
			t.Fatalf("%d history rows written while requests were under way", n)
		}
		reading.Add(-1)
		hc.signal()
	}
	wg.Wait()
	if n := commits.Load() - before; n != 1 {
		t.Fatalf("3 reads that ended together took %d commits, want 1", n)
	}
	if n := rows(); n != 6 {
		t.Fatalf("%d history rows, want 6", n)
	}

	// Nothing under way: a lone read commits at once.
	before = commits.Load()
	if _, err := hc.apply(ctx, update(need[3])); err != nil {
		t.Fatal(err)
	}
	if n := commits.Load() - before; n != 1 || rows() != 8 {
		t.Fatalf("a lone read: %d commits, %d rows; want 1 and 8", n, rows())
	}
}

// TestRecordGate_HoldsReadsUntilCommitted: once the records waiting for
// their commit reach the bound, a new read waits until some are committed,
// and gives up with its context.
func TestRecordGate_HoldsReadsUntilCommitted(t *testing.T) {
	g := newRecordGate(10)
	ctx := context.Background()
	if err := g.wait(ctx); err != nil {
		t.Fatalf("empty gate: %v", err)
	}
	g.add(6000) // one heavy tag read past the bound
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	if err := g.wait(cancelled); err == nil {
		t.Fatal("a read started with 6,000 records waiting and a bound of 10")
	}
	passed := make(chan error, 1)
	go func() { passed <- g.wait(ctx) }()
	g.done(6000)
	if err := <-passed; err != nil {
		t.Fatalf("after the commit: %v", err)
	}
}
