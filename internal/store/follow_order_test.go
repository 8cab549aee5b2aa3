package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// repairWorld is a leader's repo with a change log, and a follower that
// applies the log's events as a stream would carry them.
type repairWorld struct {
	t        *testing.T
	clk      *clock
	leader   *store.Store
	follower *store.Store
	evs      []store.Event
}

// newRepairWorld records a repo's creation, then changes (each a new
// description, or "deleted"), on the leader.
func newRepairWorld(t *testing.T, changes ...string) *repairWorld {
	ctx := context.Background()
	w := &repairWorld{t: t, clk: newClock()}
	w.leader, _ = openTemp(t, w.clk, false, store.Options{})
	w.follower, _ = openTemp(t, w.clk, false, store.Options{})
	repo := store.Repo{UID: "org1/r1", Name: "nginx", Description: "v0", CreateTime: w.clk.Now(), UpdateTime: w.clk.Now()}
	if _, err := w.leader.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	for _, c := range changes {
		w.clk.Advance(time.Minute)
		if c == "deleted" {
			if _, err := w.leader.MarkReposDeleted(ctx, []string{repo.UID}); err != nil {
				t.Fatal(err)
			}
			continue
		}
		repo.Description, repo.UpdateTime = c, w.clk.Now()
		if _, err := w.leader.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if w.evs, err = w.leader.Unpublished(ctx, 0, 100); err != nil || len(w.evs) != 1+len(changes) {
		t.Fatalf("leader's events = %d (%v), want %d", len(w.evs), err, 1+len(changes))
	}
	return w
}

// at is the i-th event as the message at stream sequence seq, a repair's
// copy behind the one at after when after is not 0.
func (w *repairWorld) at(i int, seq, after uint64) store.StreamEvent {
	e := w.evs[i]
	return store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data, Seq: seq,
		RepairAfter: after}
}

func (w *repairWorld) apply(batch ...store.StreamEvent) {
	w.t.Helper()
	if _, err := w.follower.ApplyStream(context.Background(), batch); err != nil {
		w.t.Fatal(err)
	}
}

// equal fails the test when the follower's repo or digest differs from the
// leader's.
func (w *repairWorld) equal(when string) {
	w.t.Helper()
	q := `SELECT uid || ':' || description || ':' || (deleted_time IS NULL) || ':' || deletions FROM repos`
	if l, f := queryString(w.t, w.leader.Reader(), q), queryString(w.t, w.follower.Reader(), q); l != f {
		w.t.Errorf("%s: follower's repo %s, leader's %s", when, f, l)
	}
	sameDigest(w.t, w.leader, w.follower)
}

// TestApplyStream_ARepairIsAppliedInTheStreamsOrder: the stream lost the
// message of a repo's first update after the follower had read past it, so
// the follower holds the later changes. The audit repairs it as it does:
// the lost event published again and, behind it, the resource's later
// events under the ids the follower holds, each naming the copy before it.
// The follower applies the late event and then the copies again, since
// each follows the message its state came from, and ends equal to the
// leader, in one batch or apart; a deletion applied again is not counted
// twice. Before, it skipped the copies as held and kept the late state,
// which only a checkpoint comparison and a repair from a snapshot put
// right. Nothing else is applied twice: a redelivery, an old message
// copied onto the stream after the duplicate window (a replayed original,
// or a replayed copy of the repair), the copies of a repair of an event
// the follower had read, and a refill of a stream created again.
func TestApplyStream_ARepairIsAppliedInTheStreamsOrder(t *testing.T) {
	for _, c := range []struct {
		name    string
		changes []string
		batches [][]int // the repair's copies (indexes of the changes), batch by batch
	}{
		{"one batch", []string{"v1", "v2", "v3"}, [][]int{{0, 1, 2}}},
		{"apart", []string{"v1", "v2", "v3"}, [][]int{{0}, {1}, {2}}},
		{"a deletion after the loss", []string{"v1", "deleted"}, [][]int{{0, 1}}},
	} {
		t.Run(c.name, func(t *testing.T) {
			w := newRepairWorld(t, c.changes...)
			n := uint64(len(c.changes))
			// The first change's message (seq 2) is lost before the
			// follower reads it.
			read := []store.StreamEvent{w.at(0, 1, 0)}
			for i := uint64(2); i <= n; i++ {
				read = append(read, w.at(int(i), i+1, 0))
			}
			w.apply(read...)
			seq, prev := n+1, uint64(0)
			for _, b := range c.batches {
				var batch []store.StreamEvent
				for _, u := range b {
					seq++
					batch = append(batch, w.at(1+u, seq, prev))
					prev = seq
				}
				w.apply(batch...)
			}
			w.equal("after the repair")
			// Redeliveries and replays: the second change at its first
			// sequence, the repair's second copy at its own and again
			// later, and the lost event's original later.
			w.apply(w.at(2, 3, 0))
			w.apply(w.at(2, n+3, n+2))
			w.apply(w.at(2, seq+10, n+2))
			w.apply(w.at(1, seq+11, 0))
			w.equal("after redeliveries and replays")
			if got := queryInt(t, w.follower.Reader(), `SELECT count(*) FROM event_log`); got != int(n)+1 {
				t.Errorf("the follower's log holds %d events, want %d", got, n+1)
			}
		})
	}
}

// TestApplyStream_ARepairOfWhatTheFollowerReadChangesNothing: the stream
// lost the first update after the follower had read it; the repair's
// copies are all held, the first names no copy before it, and the others
// name copies the follower's state did not come from: it applies none of
// them again (the late state would be v1). Nor does the refill of a stream
// created again, which publishes the whole log anew.
func TestApplyStream_ARepairOfWhatTheFollowerReadChangesNothing(t *testing.T) {
	ctx := context.Background()
	w := newRepairWorld(t, "v1", "v2", "v3")
	w.apply(w.at(0, 1, 0), w.at(1, 2, 0), w.at(2, 3, 0), w.at(3, 4, 0))
	w.apply(w.at(1, 5, 0), w.at(2, 6, 5), w.at(3, 7, 6))
	w.equal("after the repair")
	if _, err := w.follower.SetStreamIncarnation(ctx, w.clk.Now().Add(time.Hour), 0); err != nil {
		t.Fatal(err)
	}
	if moved, err := w.follower.SetStreamIncarnation(ctx, w.clk.Now().Add(2*time.Hour), 0); err != nil || !moved {
		t.Fatalf("the stream created again: moved %v (%v)", moved, err)
	}
	var refill []store.StreamEvent
	for i := range w.evs {
		refill = append(refill, w.at(i, uint64(i+1), uint64(i)))
	}
	w.apply(refill...)
	w.equal("after the refill")
	if got := queryString(t, w.follower.Reader(),
		`SELECT group_concat(COALESCE(stream_seq, 'null'), ',') FROM (SELECT stream_seq FROM event_log ORDER BY seq)`); got !=
		"null,null,null,null" {
		t.Errorf("the follower's stream sequences after the refill = %s, want none taken (no copy was applied again)", got)
	}
}

// TestApplyStream_AnUnfinishedRepairIsFollowed: a repair stops after its
// second copy (its third publish failed after the original was deleted),
// and the next audit publishes the last copy naming the one before it
// (publish TestAuditor_AnUnfinishedRepairGoesOnWithItsChain). The follower
// applies it again behind that copy and ends equal to the leader; a copy
// naming nothing (as the audit published it before) is skipped as held,
// and leaves the state of the copy before.
func TestApplyStream_AnUnfinishedRepairIsFollowed(t *testing.T) {
	w := newRepairWorld(t, "v1", "v2", "v3")
	w.apply(w.at(0, 1, 0), w.at(2, 3, 0), w.at(3, 4, 0)) // v1's message (seq 2) lost
	w.apply(w.at(1, 5, 0), w.at(2, 6, 5))                // the repair stops after deleting seq 4
	w.apply(w.at(3, 7, 0))
	q := `SELECT description FROM repos`
	if got := queryString(t, w.follower.Reader(), q); got != "v2" {
		t.Errorf("after a copy naming nothing the follower's repo is %s, want v2 (skipped as held)", got)
	}
	w.apply(w.at(3, 8, 6))
	w.equal("after the copy naming the one before it")
}

// TestApplyStream_AStateRecordedHereIsNoMessagesState: the replica applied
// the repo's creation from the stream, and then recorded its updates
// without a stream sequence (it led, or a restore brought the leader's
// rows). A repair's first copy of the first update names the creation's
// message: the replica's state came from its own later events, not from
// that message, so it does not apply the copy again (that would roll it
// back to v1 until the rest of the chain came, and for good if it never
// did).
func TestApplyStream_AStateRecordedHereIsNoMessagesState(t *testing.T) {
	w := newRepairWorld(t, "v1", "v2", "v3")
	w.apply(w.at(0, 1, 0))
	w.apply(w.at(1, 0, 0), w.at(2, 0, 0), w.at(3, 0, 0))
	w.apply(w.at(1, 10, 1))
	w.equal("after a copy naming the creation's message")
}
