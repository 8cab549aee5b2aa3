package store_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestWritable_DoesNotTakeTheWriter: the readiness probe answers at once
// while a long write transaction holds the one writer connection, and
// leaves it alone: each unauthenticated /readyz used to begin a write
// transaction of its own, queueing behind ingest (and ingest behind it).
func TestWritable_DoesNotTakeTheWriter(t *testing.T) {
	entered, release := make(chan struct{}), make(chan struct{})
	st, _ := openTemp(t, newClock(), false, store.Options{BeforeCommit: func(context.Context) error {
		close(entered)
		<-release
		return nil
	}})
	applied := make(chan error, 1)
	go func() {
		_, err := st.ApplyRepos(context.Background(), []store.Repo{{UID: "org1/r1", Name: "r1"}})
		applied <- err
	}()
	<-entered
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	err := st.Writable(ctx)
	took := time.Since(start)
	close(release)
	if err != nil {
		t.Errorf("Writable while ingest holds the writer = %v (after %s), want nil", err, took.Round(time.Millisecond))
	}
	if err := <-applied; err != nil {
		t.Fatalf("the write holding the writer failed: %v", err)
	}
}

// TestWritable_ReportsAFullDisk: a write the file refused (here SQLite's
// page limit, which fails as a full disk does) makes the probe fail,
// naming it; the next successful write makes it pass again.
func TestWritable_ReportsAFullDisk(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), false, store.Options{})
	if err := st.Writable(ctx); err != nil {
		t.Fatalf("Writable of a fresh mirror = %v, want nil", err)
	}
	pages, err := st.WriterPragma(ctx, "page_count")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.WriterPragma(ctx, "max_page_count = "+pages); err != nil {
		t.Fatal(err)
	}
	repos := make([]store.Repo, 50)
	for i := range repos {
		repos[i] = store.Repo{
			UID:         fmt.Sprintf("org1/r%d", i),
			Name:        fmt.Sprintf("r%d", i),
			Description: strings.Repeat("x", 1000),
		}
	}
	if _, err := st.ApplyRepos(ctx, repos); err == nil {
		t.Fatal("ApplyRepos past max_page_count succeeded; the test needs a refused write")
	}
	if err := st.Writable(ctx); err == nil || !strings.Contains(err.Error(), "full") {
		t.Errorf("Writable after a refused write = %v, want an error saying the disk is full", err)
	}
	if _, err := st.WriterPragma(ctx, "max_page_count = 1073741823"); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ApplyRepos(ctx, repos[:1]); err != nil {
		t.Fatal(err)
	}
	if err := st.Writable(ctx); err != nil {
		t.Errorf("Writable after a successful write = %v, want nil", err)
	}
}
