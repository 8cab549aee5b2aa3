package publish_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/signing"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// The sweeps: what the stream loses after an audit found it there, and a
// head it loses, are published again (Jepsen's analysis of NATS 2.12.1
// found acknowledged messages lost to a damaged block file, and streams
// lost whole).

// ahead is a clock past the test worlds' duplicate window and its margin.
func ahead(d time.Duration) func() time.Time {
	return func() time.Time { return time.Now().Add(d) }
}

// auditUntilWhole audits with au until the stream holds every event of the
// store once (a re-publish within the server's real-time duplicate window
// is dropped, held, and made again by a later audit), then checks that
// each resource's events are in order.
func auditUntilWhole(t *testing.T, w *auditWorld, au *publish.Auditor) {
	t.Helper()
	ctx := context.Background()
	stored := storedEvents(t, w.st)
	s, err := w.conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "audits to bring back every event", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			t.Fatal(err)
		}
		rep := au.Last()
		return info.State.Msgs == uint64(len(stored)) && rep.Deferred+rep.Duplicates == 0
	})
	assertExactlyOnceInOrder(t, consumeAll(t, w.conn.JS, len(stored)), stored)
}

// streamIDs returns the event ids of the stream's messages at seqs.
func streamIDs(t *testing.T, w *auditWorld, seqs ...uint64) []string {
	t.Helper()
	ctx := context.Background()
	s, err := w.conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, seq := range seqs {
		m, err := s.GetMsg(ctx, seq)
		if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		ids = append(ids, m.Header.Get(jetstream.MsgIDHeader))
	}
	return ids
}

// seqsTo returns the stream sequences 1 to n.
func seqsTo(n int) []uint64 {
	seqs := make([]uint64, n)
	for i := range seqs {
		seqs[i] = uint64(i + 1)
	}
	return seqs
}

// assertRepaired fails unless the log names each event of ids as
// published again, and the counter counts at least as many. (It may count
// more: a later event moved behind a repaired one whose copy the server
// dropped, its original still in the real-time duplicate window, is lost
// then, and published again by a later audit.)
func assertRepaired(t *testing.T, w *auditWorld, ids []string) {
	t.Helper()
	for _, id := range ids {
		if !strings.Contains(w.log.String(), `msg="event missing from the stream published again" id=`+id) {
			t.Errorf("the log does not name %s as published again", id)
		}
	}
	if n := w.repaired.Load(); n < int64(len(ids)) {
		t.Errorf("repaired %d events, want at least the %d lost", n, len(ids))
	}
}

// assertSweptBecause fails unless the log says that a sweep began, for
// the reason why names.
func assertSweptBecause(t *testing.T, w *auditWorld, why string) {
	t.Helper()
	if !strings.Contains(w.log.String(), `msg="stream audit: checking the whole event log again" why="`) ||
		!strings.Contains(w.log.String(), why) {
		t.Errorf("the log does not say that the audit went through the whole log again because %s:\n%s", why, w.log)
	}
}

// auditAll audits the world's stream with a clock past every window and
// fails unless every event was found there.
func auditAll(t *testing.T, w *auditWorld, au *publish.Auditor) {
	t.Helper()
	rep, err := au.Audit(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	stored := storedEvents(t, w.st)
	if rep.Repaired+rep.Reordered+rep.Deferred+rep.Duplicates != 0 || rep.Position != stored[len(stored)-1].Seq {
		t.Fatalf("audit of a whole stream = %+v, want nothing published and the position at %d",
			rep, stored[len(stored)-1].Seq)
	}
}

// TestAuditor_BringsBackALostHead: on a stream whose only limit is max_age,
// the events of a head the stream lost (purged here, as a damaged first
// block loses it) are published again, each resource's in order.
func TestAuditor_BringsBackALostHead(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "old", 3, 2)
	w.flush(t)
	w.p.moveAll(ctx, 1)
	w.flush(t)
	s, err := w.conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	stored := storedEvents(t, w.st)
	lost := streamIDs(t, w, seqsTo(len(stored)-4)...)
	if err := s.Purge(ctx, jetstream.WithPurgeKeep(4)); err != nil {
		t.Fatal(err)
	}
	auditUntilWhole(t, w, w.auditor(ahead(3*time.Minute)))
	assertRepaired(t, w, lost)
}

// TestAuditor_SweepsAStreamCreatedAgain: the stream lost whole after an
// audit found every event on it, and created again (as syncd's start
// does), gets the whole log again from the next audit, with the events
// published to the new stream moved behind their resources' older ones.
func TestAuditor_SweepsAStreamCreatedAgain(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "lost", 3, 2)
	w.flush(t)
	au := w.auditor(ahead(3 * time.Minute))
	auditAll(t, w, au)

	testutil.RecreateStream(t, w.conn.JS, w.cfg)
	w.p.moveAll(ctx, 1) // on the new stream: the moves, ahead of their tags' creations
	w.p.addRepos(ctx, "after", 1, 1)
	w.flush(t)
	auditUntilWhole(t, w, au)
	assertSweptBecause(t, w, "the stream was created again")
}

// TestAuditor_SweepsWhatWasLostAfterItWasChecked: a message the stream
// loses after an audit found it there (deleted here, as a damaged block
// loses messages between the first and the last) is published again by
// the next audit, which sees more messages gone than the last one left.
func TestAuditor_SweepsWhatWasLostAfterItWasChecked(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "checked", 4, 1)
	w.flush(t)
	au := w.auditor(ahead(3 * time.Minute))
	auditAll(t, w, au)

	lost := streamIDs(t, w, 2, 5)
	w.deleteMsgs(t, 2, 5)
	auditUntilWhole(t, w, au)
	assertRepaired(t, w, lost)
	assertSweptBecause(t, w, "are gone")
}

// TestAuditor_SweepsEverySweepEvery: a lost head that the stream's state
// cannot tell from its limits' work, after the audit had found it, is
// published again by the first audit SweepEvery after the last sweep, and
// not before.
func TestAuditor_SweepsEverySweepEvery(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "swept", 3, 1)
	w.flush(t)
	every := func(c *publish.AuditConfig) { c.SweepEvery = 10 * time.Minute }
	auditAll(t, w, w.auditor(ahead(3*time.Minute), every))

	_, lost := loseHead(t, w)
	rep, err := w.auditor(ahead(8*time.Minute), every).Audit(ctx)
	if err != nil || rep.Checked != 0 || rep.Repaired != 0 {
		t.Fatalf("audit before the sweep is due = %+v, %v; want nothing checked", rep, err)
	}
	auditUntilWhole(t, w, w.auditor(ahead(14*time.Minute), every))
	assertRepaired(t, w, lost)
	assertSweptBecause(t, w, "the last sweep began")
}

// loseHead purges all but the stream's last three messages, as a damaged
// first block loses them, and returns the stream and their event ids.
func loseHead(t *testing.T, w *auditWorld) (jetstream.Stream, []string) {
	t.Helper()
	s, err := w.conn.JS.Stream(context.Background(), testStream)
	if err != nil {
		t.Fatal(err)
	}
	lost := streamIDs(t, w, seqsTo(len(storedEvents(t, w.st))-3)...)
	if err := s.Purge(context.Background(), jetstream.WithPurgeKeep(3)); err != nil {
		t.Fatal(err)
	}
	return s, lost
}

// recreateStream deletes the world's stream and creates it again, as
// NATS losing it and syncd's start would.
func recreateStream(t *testing.T, w *auditWorld) {
	t.Helper()
	testutil.RecreateStream(t, w.conn.JS, w.cfg)
}

// TestAuditor_ALossDuringAnAuditIsSweptAfter: the stream lost whole while
// an audit runs (after it read the stream's state) is not taken for the
// stream as it should be: the next audit sweeps and brings every event
// back.
func TestAuditor_ALossDuringAnAuditIsSweptAfter(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "lost", 3, 1)
	w.flush(t)
	var lose atomic.Bool
	au := w.auditor(ahead(3*time.Minute), func(c *publish.AuditConfig) {
		c.Yield = func(context.Context) error {
			if lose.CompareAndSwap(true, false) {
				recreateStream(t, w)
			}
			return nil
		}
	})
	auditAll(t, w, au)
	lose.Store(true)
	if _, err := au.Audit(ctx); err != nil {
		t.Fatal(err)
	}
	auditUntilWhole(t, w, au)
	assertSweptBecause(t, w, "the stream was created again")
}

// TestAuditor_ASweepCutShortResumes: a sweep that a loss began and that
// was cut short (here by its Yield failing, as a lost lease or a crash
// would) resumes from its position at the next audit, and does not begin
// again.
func TestAuditor_ASweepCutShortResumes(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "lost", 4, 1) // 8 events, batches of 7
	w.flush(t)
	var sweeps atomic.Int64
	var fail atomic.Bool
	au := w.auditor(ahead(3*time.Minute), func(c *publish.AuditConfig) {
		c.OnSweep = func(string) { sweeps.Add(1) }
		c.Yield = func(context.Context) error {
			if pos, _ := w.st.AuditPosition(ctx); pos > 0 && fail.Load() {
				return errors.New("cut short")
			}
			return nil
		}
	})
	auditAll(t, w, au)
	recreateStream(t, w)
	fail.Store(true)
	if _, err := au.Audit(ctx); err == nil {
		t.Fatal("the audit was not cut short")
	}
	fail.Store(false)
	auditUntilWhole(t, w, au)
	if n := sweeps.Load(); n != 1 {
		t.Errorf("%d sweeps began, want 1", n)
	}
}

// TestAuditor_ASweepAfterAKeyChangeFindsEveryEvent: after the signing key
// changed (docs/cluster.md, "Signed messages"), the events published
// under the old key carry other Nats-Msg-Ids than the new key derives;
// a sweep finds them all the same, and publishes nothing again.
func TestAuditor_ASweepAfterAKeyChangeFindsEveryEvent(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	key := func() *signing.Signer {
		kp, err := nkeys.CreateUser()
		if err != nil {
			t.Fatal(err)
		}
		seed, _ := kp.Seed()
		k, err := signing.ParseSigner(seed)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	w := newAuditWorld(t, time.Second, publish.WithSigner(key()))
	w.p.addRepos(ctx, "old", 3, 1)
	w.flush(t)
	every := func(c *publish.AuditConfig) { c.SweepEvery = 10 * time.Minute }
	auditAll(t, w, w.auditor(ahead(3*time.Minute), every))
	relay := publish.NewRelay(w.conn.JS, w.st, w.cfg, publish.WithSigner(key()))
	au := publish.NewAuditor(w.conn.JS, w.st, relay.Message, publish.AuditConfig{Stream: testStream,
		SubjectPrefix: testPrefix, Every: time.Hour, SweepEvery: 10 * time.Minute,
		Now: ahead(14 * time.Minute), Batch: 7, MsgID: relay.MsgID, Logger: w.log.logger()})
	rep, err := au.Audit(ctx)
	if err != nil || rep.Checked == 0 || rep.Repaired+rep.Reordered != 0 {
		t.Fatalf("sweep after a key change = %+v, %v; want every event checked and nothing published again", rep, err)
	}
	assertSweptBecause(t, w, "the last sweep began")
}

// TestAuditor_MoreToHoldThanItKeepsSweepsAgain: an audit that would hold
// more events for the next than it keeps (a sweep repairing a stream lost
// whole holds every resource it repaired) holds none, says so, and the
// next audit sweeps again; the stream ends whole.
func TestAuditor_MoreToHoldThanItKeepsSweepsAgain(t *testing.T) {
	ctx := context.Background()
	publish.SetMaxHeldEvents(t, 2)
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "many", 4, 1)
	w.flush(t)
	au := w.auditor(ahead(3 * time.Minute))
	auditAll(t, w, au)
	recreateStream(t, w)
	auditUntilWhole(t, w, au)
	rep, err := au.Audit(ctx)
	if err != nil || rep.Checked == 0 || rep.Repaired+rep.Reordered+rep.Duplicates != 0 {
		t.Errorf("the audit after = %+v, %v; want the whole log checked again and nothing published", rep, err)
	}
	if !strings.Contains(w.log.String(), "more events to look at again than it keeps") {
		t.Errorf("the log does not say the audit held none:\n%s", w.log)
	}
	assertSweptBecause(t, w, "the last audit had more events to look at again than it keeps")
}

// lostTagCreations deletes from the stream the creation of every tag of
// the world's log, and returns those events.
func lostTagCreations(t *testing.T, w *auditWorld) []storedEvent {
	t.Helper()
	stored := storedEvents(t, w.st)
	seqOf := streamSeqs(t, w, len(stored))
	var lost []storedEvent
	seen := map[string]bool{}
	for _, e := range stored {
		if strings.Contains(e.Subject, "-tag-") && !seen[e.Subject] {
			seen[e.Subject] = true
			lost = append(lost, e)
			w.deleteMsgs(t, seqOf[e.ID])
		}
	}
	return lost
}

// heldAuditor is an auditor on the real clock reading two events a
// batch, with yield as its Yield.
func heldAuditor(w *auditWorld, yield func(context.Context) error) *publish.Auditor {
	return w.auditor(time.Now, func(c *publish.AuditConfig) {
		c.Batch, c.Yield = 2, yield
	})
}

// TestAuditor_HeldDroppedThenCutShortIsNotForgotten: an audit that drops
// its held events (more than it keeps) and is then cut short (a lost
// lease) still leaves the next audit to sweep: the lost events whose
// repair waited are published again.
func TestAuditor_HeldDroppedThenCutShortIsNotForgotten(t *testing.T) {
	ctx := context.Background()
	publish.SetMaxHeldEvents(t, 1)
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "busy", 2, 1)
	w.p.addRepos(ctx, "calm", 4, 0)
	w.flush(t)
	lost := lostTagCreations(t, w)
	if len(lost) != 2 {
		t.Fatalf("%d tag creations, want 2", len(lost))
	}
	time.Sleep(2 * time.Second) // past the server's real-time duplicate window and the margin
	w.p.moveAll(ctx, 1)         // the tags move: their repairs wait, held
	w.flush(t)
	var fail atomic.Bool
	fail.Store(true)
	au := heldAuditor(w, func(context.Context) error {
		if pos, _ := w.st.AuditPosition(ctx); fail.Load() && pos >= lost[1].Seq {
			return errors.New("cut short: the lease was lost")
		}
		return nil
	})
	if _, err := au.Audit(ctx); err == nil {
		t.Fatal("the audit was not cut short")
	}
	if !strings.Contains(w.log.String(), "more events to look at again than it keeps") {
		t.Fatalf("the held events were not dropped:\n%s", w.log)
	}
	fail.Store(false)
	testutil.WaitFor(t, 10*time.Second, "the lost tag creations to be published again", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		return w.repaired.Load() >= int64(len(lost))
	})
}

// TestAuditor_NoSweepsKeepsItsHeldEvents: on a stream that is not swept
// (a limit per subject), the audit keeps every held event however many,
// and publishes the lost ones again once their repair may go.
func TestAuditor_NoSweepsKeepsItsHeldEvents(t *testing.T) {
	ctx := context.Background()
	publish.SetMaxHeldEvents(t, 1)
	w := newAuditWorld(t, time.Second)
	s, err := w.conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgsPerSubject = 1000
	if _, err := w.conn.JS.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	w.p.addRepos(ctx, "busy", 2, 1)
	w.flush(t)
	lost := lostTagCreations(t, w)
	time.Sleep(2 * time.Second) // past the server's real-time duplicate window and the margin
	w.p.moveAll(ctx, 1)
	w.flush(t)
	au := heldAuditor(w, nil)
	testutil.WaitFor(t, 10*time.Second, "the lost tag creations to be published again", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		return w.repaired.Load() >= int64(len(lost))
	})
}

// TestAuditor_AnIDSyncdDoesNotDeriveIsNotTheEvent: a message whose
// Nats-Msg-Id begins with a lost event's id but goes on as no key's
// derived id does is not taken for the event: the audit publishes the
// event again.
func TestAuditor_AnIDSyncdDoesNotDeriveIsNotTheEvent(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "forged", 2, 0)
	w.flush(t)
	lost := streamIDs(t, w, 1)
	w.deleteMsgs(t, 1)
	m := nats.NewMsg(testPrefix + ".repo.created.forged")
	m.Header.Set(jetstream.MsgIDHeader, lost[0]+".not-a-key")
	m.Data = []byte("{}")
	if _, err := w.conn.JS.PublishMsg(ctx, m); err != nil {
		t.Fatal(err)
	}
	au := w.auditor(ahead(3 * time.Minute))
	testutil.WaitFor(t, 20*time.Second, "an audit to publish the lost event again", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		return w.repaired.Load() >= 1
	})
	assertRepaired(t, w, lost)
}

// TestAuditor_CheckpointsWaitForTheRefill: a leader whose relay meets the
// stream created again publishes no checkpoint until its audit has
// published the event log into the new stream again: one published
// meanwhile would cover events the stream does not carry, and a follower
// reading the new stream from its start would find its mirror diverged at
// it. Once the audit has swept the log, checkpoints are published again.
func TestAuditor_CheckpointsWaitForTheRefill(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w, relay := checkpointingWorld(t)
	w.p.addRepos(ctx, "before", 3, 2)
	if err := relay.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	au := w.auditor(ahead(3 * time.Minute))
	auditAll(t, w, au)
	if _, why, err := relay.PublishCheckpoint(ctx); err != nil || why != "" {
		t.Fatalf("a checkpoint before the loss: %q, %v", why, err)
	}

	testutil.RecreateStream(t, w.conn.JS, w.cfg)
	// Quiet: the checkpoint would be the new stream's first message.
	if seq, why, err := relay.PublishCheckpoint(ctx); err != nil || !strings.Contains(why, "created again") {
		t.Fatalf("a quiet leader's checkpoint before the refill: seq %d, why %q, %v; want none", seq, why, err)
	}
	w.p.addRepos(ctx, "after", 1, 1)
	if err := relay.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if seq, why, err := relay.PublishCheckpoint(ctx); err != nil || !strings.Contains(why, "created again") {
		t.Fatalf("a checkpoint before the refill: seq %d, why %q, %v; want none, the stream created again", seq, why, err)
	}
	auditUntilWhole(t, w, au) // the new stream holds the events alone: no checkpoint
	// The audit that found the stream whole has ended the refill, or the
	// next one does (it holds its repairs for one more look).
	testutil.WaitFor(t, 10*time.Second, "a checkpoint after the refill", func() bool {
		_, why, err := relay.PublishCheckpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if why == "" {
			return true
		}
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		return false
	})
}

// TestAuditor_SweepsWhenTheMirrorMetALostTail: the mirror that met the
// stream with messages it had counted gone (the relay's new messages at
// or below its position: a lost tail, recorded by
// store.SetStreamIncarnation) has the next audit sweep, whatever the
// stream's state shows by then; here a lost head the state cannot tell
// from the limits' work comes back with it.
func TestAuditor_SweepsWhenTheMirrorMetALostTail(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "tail", 3, 1)
	w.flush(t)
	never := func(c *publish.AuditConfig) { c.SweepEvery = -1 }
	auditAll(t, w, w.auditor(ahead(3*time.Minute), never))

	s, lost := loseHead(t, w)
	if rep, err := w.auditor(ahead(4*time.Minute), never).Audit(ctx); err != nil || rep.Repaired != 0 {
		t.Fatalf("audit before the mirror met the loss = %+v, %v; want nothing repaired", rep, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if moved, err := w.st.SetStreamIncarnation(ctx, info.Created, 1); err != nil || !moved {
		t.Fatalf("the mirror meeting a lost tail: moved %v, %v", moved, err)
	}
	auditUntilWhole(t, w, w.auditor(ahead(5*time.Minute), never))
	assertRepaired(t, w, lost)
	assertSweptBecause(t, w, "messages it had counted gone")
}

// checkpointingWorld is an audit world past its baseline, with a relay
// that writes checkpoints (an hour apart, unless asked for).
func checkpointingWorld(t *testing.T) (*auditWorld, *publish.Relay) {
	t.Helper()
	w := newAuditWorld(t, time.Second)
	if err := w.st.EndBaseline(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Log(w.log.String())
		}
	})
	return w, publish.NewRelay(w.conn.JS, w.st, w.cfg, publish.WithCheckpoints(w.st, time.Hour, "a"))
}

// TestRelay_ACheckpointHeldForTheRefillFollowsItsEnd: a checkpoint asked
// for while the refill holds the checkpoints off is published soon after
// the audit ends the refill, not at the next one due (an hour here).
// make cluster-test's stream-lost scenario waited in vain for the
// checkpoint after its last change: it was asked for during the refill,
// and the relay tried again only a checkpoint interval later.
func TestRelay_ACheckpointHeldForTheRefillFollowsItsEnd(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w, relay := checkpointingWorld(t)
	w.p.addRepos(ctx, "before", 2, 1)
	au := w.auditor(ahead(3 * time.Minute))
	if err := relay.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	auditAll(t, w, au)
	testutil.RecreateStream(t, w.conn.JS, w.cfg)
	w.p.addRepos(ctx, "after", 1, 1)

	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- relay.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	// The relay publishes the new events, meets the new stream, and
	// holds the checkpoint it is asked for.
	testutil.WaitFor(t, 10*time.Second, "the relay to meet the stream created again", func() bool {
		v, err := w.st.Meta(ctx, store.RefillUntilKey)
		return err == nil && v != ""
	})
	relay.RequestCheckpoint()
	auditUntilWhole(t, w, au)
	testutil.WaitFor(t, 10*time.Second, "the audit to end the refill", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		v, err := w.st.Meta(ctx, store.RefillUntilKey)
		return err == nil && v == ""
	})
	s, err := w.conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the checkpoint held for the refill", func() bool {
		_, err := s.GetLastMsgForSubject(ctx, publish.CheckpointSubject(w.cfg.SubjectPrefix))
		return err == nil
	})
}
