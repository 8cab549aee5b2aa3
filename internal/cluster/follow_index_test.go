package cluster_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/store"
)

// historyIndexes counts the indexes of tag_history by time and by digest
// that db has.
func historyIndexes(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM sqlite_schema WHERE type = 'index'
		AND name IN ('tag_history_time', 'tag_history_digest')`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// TestFollower_CatchesUpFromNothingWithoutTheHistoryIndexes: a follower
// whose mirror is empty applies the stream without the indexes of
// tag_history by time and digest (kept up row by row, they were a third of
// its catch-up) and builds them once nothing is pending, both in a
// catch-up and when following; a follower whose mirror holds something
// keeps them throughout.
func TestFollower_CatchesUpFromNothingWithoutTheHistoryIndexes(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(6)
	leader.publish()
	open := func(name string) *store.Store {
		st, err := store.Open(ctx, filepath.Join(t.TempDir(), name), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		return st
	}
	// watch returns a config whose OnBatch records the indexes the mirror
	// had after each batch that left messages pending.
	watch := func(consumer string, st *store.Store, during *[]int) cluster.FollowerConfig {
		cfg := gapFollowerConfig
		cfg.Consumer, cfg.Batch = consumer, 2
		cfg.OnBatch = func(_ int, pending uint64) {
			if pending > 0 {
				*during = append(*during, historyIndexes(t, st.Reader()))
			}
		}
		return cfg
	}
	wantHistory := queryCount(t, leader.st, `SELECT COUNT(*) FROM tag_history`)

	t.Run("CatchUp", func(t *testing.T) {
		st := open("catchup.db")
		var during []int
		if err := cluster.NewFollower(js, st, watch("c1", st, &during)).CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if len(during) == 0 {
			t.Fatal("no batch left messages pending: the catch-up took one batch")
		}
		for i, n := range during {
			if n != 0 {
				t.Fatalf("after batch %d of the catch-up the mirror had %d of the history indexes, want none", i+1, n)
			}
		}
		if n := historyIndexes(t, st.Reader()); n != 2 {
			t.Fatalf("caught up with %d of the 2 history indexes", n)
		}
		if got := queryCount(t, st, `SELECT COUNT(*) FROM tag_history INDEXED BY tag_history_digest`); got != wantHistory {
			t.Fatalf("history rows through the digest index = %d, want the leader's %d", got, wantHistory)
		}
		if l, fo := mirrorRows(t, leader.st), mirrorRows(t, st); l != fo {
			t.Fatalf("the follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
		}
	})

	t.Run("Run", func(t *testing.T) {
		st := open("run.db")
		var during []int
		f := cluster.NewFollower(js, st, watch("r1", st, &during))
		ctx, cancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- f.Run(ctx) }()
		// The rows come after the indexes were dropped: with all of them
		// in, the indexes are there once built.
		deadline := time.Now().Add(10 * time.Second)
		for queryCount(t, st, `SELECT COUNT(*) FROM tag_history`) != wantHistory || historyIndexes(t, st.Reader()) != 2 {
			if time.Now().After(deadline) {
				cancel()
				<-done
				t.Fatalf("the following follower never built the history indexes (lag %d, err %v)", f.Lag(), f.Err())
			}
			time.Sleep(10 * time.Millisecond)
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if len(during) == 0 || during[0] != 0 {
			t.Fatalf("history indexes after the batches with messages pending = %v, want none", during)
		}
	})

	t.Run("NotEmpty", func(t *testing.T) {
		st := open("notempty.db")
		if err := cluster.NewFollower(js, st, watch("n1", st, new([]int))).CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		leader.change(6)
		leader.publish()
		var during []int
		if err := cluster.NewFollower(js, st, watch("n1", st, &during)).CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if len(during) == 0 {
			t.Fatal("no batch left messages pending: the catch-up took one batch")
		}
		for i, n := range during {
			if n != 2 {
				t.Fatalf("after batch %d of a catch-up into a mirror that held events it had %d of the 2 history indexes",
					i+1, n)
			}
		}
	})
}
