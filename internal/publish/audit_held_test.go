package publish_test

import (
	"context"
	"path/filepath"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// streamSeqs maps the Nats-Msg-Id of every message on the stream to its
// stream sequence.
func streamSeqs(t *testing.T, w *auditWorld, n int) map[string]uint64 {
	t.Helper()
	seqOf := map[string]uint64{}
	for _, m := range consumeAll(t, w.conn.JS, n) {
		seqOf[first(m.Header, jetstream.MsgIDHeader)] = m.StreamSeq
	}
	return seqOf
}

// TestAuditor_ACopyLostBeforeItWasDurableIsRepaired: the audit repairs a
// lost tag creation, which deletes the tag's move (durable, long on the
// stream) and publishes both again at the stream's tail. JetStream then
// loses that tail, as a crash before its next fsync does (the very fault
// the audit is for). The audit must see it: the copies were never checked
// once older than the window, as the documented contract has every
// published message checked. Before the fix, the position had moved past
// both events at the repair, and the tag's creation and its move (which
// the stream had not lost) were gone for good.
func TestAuditor_ACopyLostBeforeItWasDurableIsRepaired(t *testing.T) {
	t.Parallel()
	w := newAuditWorld(t, time.Second)
	au, stored := repairedCreation(t, w, "again", 1)
	// The tail the repair wrote (the creation and the move behind it) is
	// lost before it was synced.
	var tail []uint64
	for _, seq := range streamSeqs(t, w, len(stored)) {
		if seq > uint64(len(stored)) {
			tail = append(tail, seq)
		}
	}
	if len(tail) != len(stored)-1 {
		t.Fatalf("the repair wrote %d messages, want the tag's %d events", len(tail), len(stored)-1)
	}
	w.deleteMsgs(t, tail...)

	auditUntilTheStreamHolds(t, w, au, len(stored), "an audit to publish the lost copies again")
	assertExactlyOnceInOrder(t, consumeAll(t, w.conn.JS, len(stored)), stored)
}

// TestAuditor_ADeferredRepairDoesNotStopTheAudit: a tag whose creation the
// stream lost changes again within the duplicate window (a tag that moves
// more often than the window, `latest`, keeps it so): its repair waits, as
// documented. That must not keep the audit from every event after it: a
// repo's creation lost later in the log, long out of the window, is
// published again. Before the fix, the audit stopped at the first batch
// for as long as the tag kept moving, and the repo's creation stayed lost.
func TestAuditor_ADeferredRepairDoesNotStopTheAudit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "busy", 1, 1) // seq 1 the repo, 2 its tag's creation
	w.p.addRepos(ctx, "calm", 4, 0) // seqs 3-6
	w.flush(t)
	stored := storedEvents(t, w.st)
	seqOf := streamSeqs(t, w, len(stored))
	tagCreation, lastRepo := stored[1], stored[len(stored)-1]
	w.deleteMsgs(t, seqOf[tagCreation.ID], seqOf[lastRepo.ID])
	time.Sleep(2 * time.Second) // all of them out of the window and margin
	w.p.moveAll(ctx, 1)         // the tag moves again: young
	w.flush(t)

	// Batches of 2: the tag's creation is in the first.
	au := publish.NewAuditor(w.conn.JS, w.st, w.relay.Message, publish.AuditConfig{
		Stream: testStream, SubjectPrefix: testPrefix, Every: time.Hour, Now: time.Now,
		Batch: 2, Logger: w.log.logger(), MsgID: w.relay.MsgID,
		OnRepaired: func(store.Event) { w.repaired.Add(1) },
	})
	rep, err := au.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Deferred != 1 || w.repaired.Load() != 1 || rep.Checked < len(stored)-1 {
		t.Fatalf("audit in batches of 2 = %+v (%d repaired), want the tag's creation deferred and the calm repo's "+
			"lost creation (seq %d) checked and published again", rep, w.repaired.Load(), lastRepo.Seq)
	}
	// The tag's creation is not forgotten: the next audits look at it
	// again, and repair it once the tag's move left the window.
	testutil.WaitFor(t, 20*time.Second, "an audit to publish the tag's creation again", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		return w.repaired.Load() >= 2
	})
	assertExactlyOnceInOrder(t, consumeAll(t, w.conn.JS, len(storedEvents(t, w.st))), storedEvents(t, w.st))
}

// TestAuditor_LateMarkedEventsAreNotPublishedTwice: a standby applies
// what it catches up on from the stream long after the stream stored it
// (after an outage, or joining late), and audits its whole log the first
// time it leads. It marks each event published when the stream stored it
// (store.StreamEvent.Stored, as the cluster's follower sets it), so the
// audit, which reads the stream from an event's publication time, finds
// them all: before, marked at the apply time, every one was taken for lost
// and published again, a second copy on the stream.
func TestAuditor_LateMarkedEventsAreNotPublishedTwice(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "late", 3, 0)
	w.flush(t)
	stored := storedEvents(t, w.st)
	_ = streamSeqs(t, w, len(stored))

	// A standby's mirror, whose clock says it applies the events 5 s after
	// the stream stored them.
	standby, err := store.Open(ctx, filepath.Join(t.TempDir(), "standby.db"),
		store.Options{Now: func() time.Time { return time.Now().Add(5 * time.Second) }})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })
	if err := standby.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	var sevs []store.StreamEvent
	for _, m := range consumeAll(t, w.conn.JS, len(stored)) {
		se, err := publish.Decode(m.Data)
		if err != nil {
			t.Fatal(err)
		}
		se.Seq, se.Stored = m.StreamSeq, m.Stored
		sevs = append(sevs, se)
	}
	if _, err := standby.ApplyStreamEvents(ctx, sevs); err != nil {
		t.Fatal(err)
	}
	au := publish.NewAuditor(w.conn.JS, standby, w.relay.Message, publish.AuditConfig{
		Stream: testStream, SubjectPrefix: testPrefix, Every: time.Hour,
		Now:   func() time.Time { return time.Now().Add(10 * time.Second) },
		Slack: 100 * time.Millisecond, Logger: w.log.logger(), MsgID: w.relay.MsgID,
		OnRepaired: func(store.Event) { w.repaired.Add(1) },
	})
	rep, err := au.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Checked != len(stored) || rep.Repaired+rep.Reordered+rep.Duplicates != 0 {
		t.Errorf("audit of a whole stream = %+v, want %d checked and nothing published again", rep, len(stored))
	}
	assertExactlyOnceInOrder(t, consumeAll(t, w.conn.JS, len(stored)), stored)
}

// TestAuditor_ARecheckedRepairIsNotTakenForLostAgain: a tag's lost
// creation waits (its move is young); at the next audit the recheck
// repairs it and moves the move behind it. The main loop of the same
// audit then reaches the move (it was past the position, young at the
// first audit), reads the stream only up to the sequence of the audit's
// start, misses the copy the recheck just wrote, and publishes the move
// once more: JetStream drops it as a duplicate, and the audit reports a
// stream that lacks an event it holds. The relay published >1000
// messages meanwhile (here: before the recheck's first read).
func TestAuditor_ARecheckedRepairIsNotTakenForLostAgain(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "busy", 1, 1) // the repo, its tag's creation
	w.flush(t)
	stored := storedEvents(t, w.st)
	seqOf := streamSeqs(t, w, len(stored))
	w.deleteMsgs(t, seqOf[stored[1].ID])
	time.Sleep(2 * time.Second)
	w.p.moveAll(ctx, 1) // young
	w.flush(t)

	var filled atomic.Bool
	au := publish.NewAuditor(w.conn.JS, w.st, w.relay.Message, publish.AuditConfig{
		Stream: testStream, SubjectPrefix: testPrefix, Every: time.Hour, Now: time.Now,
		Slack: 100 * time.Millisecond, Logger: w.log.logger(), MsgID: w.relay.MsgID,
		OnRepaired: func(store.Event) { w.repaired.Add(1) },
		Yield: func(ctx context.Context) error {
			if held, _ := w.st.AuditHeld(ctx); len(held) > 0 && filled.CompareAndSwap(false, true) {
				// other resources' events, published while the audit runs
				for i := range 1500 {
					if _, err := w.conn.JS.Publish(ctx, testPrefix+".repo.created.filler"+strconv.Itoa(i), []byte("{}")); err != nil {
						return err
					}
				}
			}
			return nil
		},
	})
	rep, err := au.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Deferred != 1 {
		t.Fatalf("first audit = %+v, want the creation deferred", rep)
	}
	time.Sleep(2 * time.Second) // the move is old now
	rep, err = au.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("second audit = %+v", rep)
	if rep.Duplicates != 0 {
		t.Errorf("second audit = %+v: the recheck repaired the tag, and the main loop took the move it had just "+
			"moved for lost and published it once more (dropped as a duplicate)", rep)
	}
}

// TestAuditor_AnUnfinishedRepairGoesOnWithItsChain: a repair's last copy
// is lost (as when its publish failed after the original was deleted, or
// the stream lost it before its next fsync). The next audit publishes it
// again naming the copy before it (RepairAttribute), which the stream
// still holds, so that a replica holding the event applies it again behind
// that copy. Before, it began a new chain that named nothing, and a
// replica that had applied the copies before it skipped it as held and
// kept the state of the one before (store
// TestApplyStream_AnUnfinishedRepairIsFollowed).
func TestAuditor_AnUnfinishedRepairGoesOnWithItsChain(t *testing.T) {
	t.Parallel()
	w := newAuditWorld(t, time.Second)
	au, stored := repairedCreation(t, w, "chain", 2)
	copies := map[string]received{}
	for _, m := range consumeAll(t, w.conn.JS, len(stored)) {
		if m.StreamSeq > uint64(len(stored)) {
			copies[first(m.Header, jetstream.MsgIDHeader)] = m
		}
	}
	secondMove, firstMove := stored[len(stored)-1], stored[len(stored)-2]
	lastCopy, ok := copies[secondMove.ID]
	if !ok {
		t.Fatalf("the repair wrote no copy of the log's last event")
	}
	for _, m := range []received{copies[firstMove.ID], lastCopy} {
		if e, err := publish.Decode(m.Data); err != nil || e.Type != "tag.moved" {
			t.Fatalf("the copy at %d is %s (%v), want one of the tag's moves", m.StreamSeq, e.Type, err)
		}
	}
	w.deleteMsgs(t, lastCopy.StreamSeq)

	auditUntilTheStreamHolds(t, w, au, len(stored), "an audit to publish the lost copy again")
	got := consumeAll(t, w.conn.JS, len(stored))
	assertExactlyOnceInOrder(t, got, stored)
	m := got[len(got)-1]
	e, err := publish.Decode(m.Data)
	if err != nil {
		t.Fatal(err)
	}
	if want := copies[firstMove.ID].StreamSeq; e.ID != secondMove.ID || e.RepairAfter != want {
		t.Errorf("the stream's last message is %s at %d naming %d; want the second move naming the first move's copy at %d",
			e.ID, m.StreamSeq, e.RepairAfter, want)
	}
}

// auditUntilTheStreamHolds audits until the stream holds n messages.
func auditUntilTheStreamHolds(t *testing.T, w *auditWorld, au *publish.Auditor, n int, what string) {
	t.Helper()
	ctx := context.Background()
	testutil.WaitFor(t, 20*time.Second, what, func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		s, err := w.conn.JS.Stream(ctx, testStream)
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return info.State.Msgs == uint64(n)
	})
}

// repairedCreation records a repo with a tag that then moves moves times,
// publishes them, loses the tag's creation from the stream, and audits
// until the auditor it returns has published it again, with the moves
// behind it; it returns the log's events too.
func repairedCreation(t *testing.T, w *auditWorld, name string, moves int) (*publish.Auditor, []storedEvent) {
	t.Helper()
	ctx := context.Background()
	w.p.addRepos(ctx, name, 1, 1) // the repo, then its tag's creation
	w.flush(t)
	w.p.moveAll(ctx, moves)
	w.flush(t)
	stored := storedEvents(t, w.st)
	seqOf := streamSeqs(t, w, len(stored))
	w.deleteMsgs(t, seqOf[stored[1].ID])
	au := w.auditor(time.Now)
	testutil.WaitFor(t, 20*time.Second, "an audit to publish the lost creation again", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		return w.repaired.Load() >= 1
	})
	return au, stored
}
