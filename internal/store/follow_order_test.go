package store_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestApplyStream_ARepairIsAppliedInTheStreamsOrder: the stream lost the
// message of a repo's first update after the follower had read past it, so
// the follower holds the later two. The audit repairs it as it does: the
// lost event published again, and the resource's later events deleted and
// published again behind it, under the ids the follower holds. The
// follower applies the late event, and then the later ones again, since
// the stream carries them after it: it ends equal to the leader, in one
// batch or apart. Before, it skipped them as held and kept the first
// update's state, which only a checkpoint comparison and a repair from a
// snapshot put right. A redelivery of a held event, at its own sequence
// or below, changes nothing.
func TestApplyStream_ARepairIsAppliedInTheStreamsOrder(t *testing.T) {
	for _, c := range []struct {
		name    string
		batches [][]int // the repair's events (indexes into the updates), batch by batch
	}{
		{"one batch", [][]int{{0, 1, 2}}},
		{"apart", [][]int{{0}, {1}, {2}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := context.Background()
			clk := newClock()
			leader, _ := openTemp(t, clk, false, store.Options{})
			follower, _ := openTemp(t, clk, false, store.Options{})
			repo := store.Repo{UID: "org1/r1", Name: "nginx", Description: "v0", CreateTime: clk.Now(), UpdateTime: clk.Now()}
			if _, err := leader.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
				t.Fatal(err)
			}
			for i := 1; i <= 3; i++ {
				clk.Advance(time.Minute)
				repo.Description, repo.UpdateTime = fmt.Sprintf("v%d", i), clk.Now()
				if _, err := leader.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
					t.Fatal(err)
				}
			}
			evs, err := leader.Unpublished(ctx, 0, 100)
			if err != nil || len(evs) != 4 {
				t.Fatalf("leader's events = %d (%v), want 4: created and three updates", len(evs), err)
			}
			at := func(i int, seq uint64) store.StreamEvent {
				e := evs[i]
				return store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data, Seq: seq}
			}
			apply := func(batch ...store.StreamEvent) {
				t.Helper()
				if _, err := follower.ApplyStream(ctx, batch); err != nil {
					t.Fatal(err)
				}
			}
			// The first update's message (seq 2) is lost before the
			// follower reads it.
			apply(at(0, 1), at(2, 3), at(3, 4))
			seq := uint64(4)
			for _, b := range c.batches {
				var batch []store.StreamEvent
				for _, u := range b {
					seq++
					batch = append(batch, at(1+u, seq))
				}
				apply(batch...)
			}
			equal := func(when string) {
				t.Helper()
				q := `SELECT uid || ':' || description FROM repos`
				if l, f := queryString(t, leader.Reader(), q), queryString(t, follower.Reader(), q); l != f {
					t.Errorf("%s: follower's repo %s, leader's %s", when, f, l)
				}
				sameDigest(t, leader, follower)
			}
			equal("after the repair")
			// Redeliveries: the second update at its old sequence, and
			// the repair's second update at its own.
			apply(at(2, 3))
			apply(at(2, 6))
			equal("after redeliveries")
			if n := queryInt(t, follower.Reader(), `SELECT count(*) FROM event_log`); n != 4 {
				t.Errorf("the follower's log holds %d events, want 4", n)
			}
		})
	}
}
