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
)

// TestHistoryCommitter_ConcurrentReadsShareCommits: reads finishing at once
// are all written, each exactly once, with every event counted, in no more
// commits than reads.
func TestHistoryCommitter_ConcurrentReadsShareCommits(t *testing.T) {
	ctx := context.Background()
	var commits atomic.Int64
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "m.db"), store.Options{
		BeforeCommit: func(context.Context) error { commits.Add(1); return nil }})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	repo := store.Repo{UID: "org1/r", Name: "r"}
	if _, err := st.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	const tags = 40
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	var list []store.Tag
	for i := range tags {
		list = append(list, store.Tag{UID: fmt.Sprintf("org1/r/t%02d", i), Name: fmt.Sprintf("t%02d", i), Digest: "sha256:c", UpdateTime: t0.Add(2 * time.Second)})
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
			recs := []store.HistoryRecord{{Time: t0, Digest: "sha256:a"}, {Time: t0.Add(time.Second), Digest: "sha256:b"}, {Time: t0.Add(2 * time.Second), Digest: "sha256:c"}}
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
	if rows != 3*tags || moved != 2*tags || events.Load() != 2*tags {
		t.Fatalf("history rows=%d moved events=%d counted=%d, want %d, %d, %d", rows, moved, events.Load(), 3*tags, 2*tags, 2*tags)
	}
	if n := commits.Load() - before; n > tags {
		t.Fatalf("%d commits for %d reads", n, tags)
	} else {
		t.Logf("%d reads in %d commits", tags, n)
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
