package cluster_test

import (
	"context"
	"database/sql"
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/store"
)

// historyIndexes counts the indexes of tag_history by time and by digest
// that db has; -1 when it cannot tell (reported as the test's error, from
// any goroutine).
func historyIndexes(t *testing.T, db *sql.DB) int {
	t.Helper()
	var n int
	if err := db.QueryRow(`SELECT COUNT(*) FROM sqlite_schema WHERE type = 'index'
		AND name IN ('tag_history_time', 'tag_history_digest')`).Scan(&n); err != nil {
		t.Error(err)
		return -1
	}
	return n
}

// TestFollower_CatchesUpFromNothingWithoutTheHistoryIndexes: a follower
// whose mirror is empty applies the stream without the indexes of
// tag_history by time and digest (kept up row by row, they were a third of
// its catch-up) and builds them once nothing is pending, both in a
// catch-up (FinishCatchUp, as a promotion does after its catch-up) and
// when following; a follower whose mirror holds something keeps them
// throughout.
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
		f := cluster.NewFollower(js, st, watch("c1", st, &during))
		if err := f.CatchUp(ctx); err != nil {
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
		// Not built by the catch-up, whose deadline (a promotion's) would
		// cut the build short.
		if n := historyIndexes(t, st.Reader()); n != 0 {
			t.Fatalf("the catch-up built %d of the history indexes, want none before FinishCatchUp", n)
		}
		if err := f.FinishCatchUp(ctx); err != nil {
			t.Fatal(err)
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
		first := cluster.NewFollower(js, st, watch("n1", st, new([]int)))
		if err := first.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if err := first.FinishCatchUp(ctx); err != nil {
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

	t.Run("Promotion", func(t *testing.T) {
		// A standby with an empty mirror that gains the lease leads with
		// the indexes built, after its catch-up.
		st := open("promoted.db")
		lease, err := cluster.NewLease(ctx, js, cluster.LeaseConfig{Bucket: "lease", Key: "leader", Node: "p", TTL: ttl})
		if err != nil {
			t.Fatal(err)
		}
		cfg := gapFollowerConfig
		cfg.Consumer, cfg.Batch = "p1", 2
		ledWith := make(chan int, 1)
		rctx, cancel := context.WithCancel(ctx)
		r := &cluster.Replica{
			Lease:    lease,
			Follower: cluster.NewFollower(js, st, cfg),
			Lead: func(ctx context.Context) error {
				ledWith <- historyIndexes(t, st.Reader())
				<-ctx.Done()
				return nil
			},
			Logger: slog.New(slog.DiscardHandler),
		}
		done := make(chan error, 1)
		go func() { done <- r.Run(rctx) }()
		defer func() { cancel(); <-done }()
		select {
		case n := <-ledWith:
			if n != 2 {
				t.Fatalf("led with %d of the 2 history indexes", n)
			}
		case <-time.After(10 * ttl):
			t.Fatal("the standby never led")
		}
		want := queryCount(t, leader.st, `SELECT COUNT(*) FROM tag_history`)
		if got := queryCount(t, st, `SELECT COUNT(*) FROM tag_history`); got != want {
			t.Fatalf("led with %d history rows, want the leader's %d", got, want)
		}
	})
}
