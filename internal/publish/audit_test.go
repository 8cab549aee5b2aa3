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

// auditWorld is a store whose events the relay published to a stream with
// a duplicate window of window, and an auditor of the stream.
type auditWorld struct {
	st       *store.Store
	cfg      publish.Config
	conn     *publish.Conn
	relay    *publish.Relay
	p        *producer
	log      *logBuffer
	repaired atomic.Int64
}

func newAuditWorld(t *testing.T, window time.Duration, opts ...publish.RelayOption) *auditWorld {
	t.Helper()
	srv := startServer(t, nil)
	w := &auditWorld{log: &logBuffer{}}
	cfg := srv.config(w.log.logger())
	cfg.DuplicateWindow = window
	w.cfg = cfg
	w.conn = mustConnect(t, cfg)
	w.st = mustOpenStore(t)
	w.p = newProducer(t, w.st)
	w.relay = publish.NewRelay(w.conn.JS, w.st, cfg, opts...)
	return w
}

// auditor returns an auditor of the world's stream with the clock now,
// its configuration changed by opts.
func (w *auditWorld) auditor(now func() time.Time, opts ...func(*publish.AuditConfig)) *publish.Auditor {
	cfg := publish.AuditConfig{
		Stream:        testStream,
		SubjectPrefix: testPrefix,
		Every:         time.Hour,
		Now:           now,
		Batch:         7,
		Logger:        w.log.logger(),
		OnRepaired:    func(store.Event) { w.repaired.Add(1) },
		MsgID:         w.relay.MsgID,
		RepairMessage: w.relay.RepairMessage,
	}
	for _, o := range opts {
		o(&cfg)
	}
	return publish.NewAuditor(w.conn.JS, w.st, w.relay.Message, cfg)
}

// flush publishes the outbox.
func (w *auditWorld) flush(t *testing.T) {
	t.Helper()
	if err := w.relay.Flush(context.Background()); err != nil {
		t.Fatalf("relay: %v", err)
	}
}

// deleteMsgs deletes the messages of the stream at seqs behind the relay's
// back, as a lost write would.
func (w *auditWorld) deleteMsgs(t *testing.T, seqs ...uint64) {
	t.Helper()
	ctx := context.Background()
	s, err := w.conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	for _, seq := range seqs {
		if err := s.DeleteMsg(ctx, seq); err != nil {
			t.Fatalf("delete stream message %d: %v", seq, err)
		}
	}
}

// TestAuditor_RepublishesWhatTheStreamLost: messages deleted from the stream
// behind the relay's back, among them a tag's creation with moves after it,
// are published again once they are older than the duplicate window; the
// stream then holds every event once, each resource's in order (the moves
// went behind the repaired creation); the counter counts the lost ones
// alone, and the log names them. An audit after it, and one by a new
// auditor (a restart), find nothing more to do.
func TestAuditor_RepublishesWhatTheStreamLost(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "audit", 3, 2) // seqs 1-3 repos, then 2 tags each
	w.flush(t)
	w.p.moveAll(ctx, 2)
	w.flush(t)
	stored := storedEvents(t, w.st)
	got := consumeAll(t, w.conn.JS, len(stored))
	seqOf := map[string]uint64{}
	for _, m := range got {
		seqOf[first(m.Header, jetstream.MsgIDHeader)] = m.StreamSeq
	}
	// A repo's creation (its tags are other resources), a tag's creation
	// (its two moves come after it) and the first of another tag's moves.
	nth := func(subject string, n int) storedEvent {
		for _, e := range stored {
			if e.Subject == subject {
				if n == 0 {
					return e
				}
				n--
			}
		}
		t.Fatalf("no such event of %s", subject)
		return storedEvent{}
	}
	lost := []storedEvent{nth("audit-uid-1", 0), nth("audit-uid-0-tag-0", 0), nth("audit-uid-2-tag-1", 1)}
	for _, e := range lost {
		w.deleteMsgs(t, seqOf[e.ID])
	}

	au := w.auditor(time.Now)
	// Until the lost events are older than the window, the audit leaves
	// them (JetStream would drop them as duplicates).
	rep, err := au.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Repaired != 0 || rep.Duplicates != 0 {
		t.Fatalf("audit within the window = %+v, want nothing published again", rep)
	}
	testutil.WaitFor(t, 20*time.Second, "an audit to publish the lost events again", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		return w.repaired.Load() >= int64(len(lost))
	})
	if n := w.repaired.Load(); n != int64(len(lost)) {
		t.Errorf("repaired %d events, want the %d lost", n, len(lost))
	}
	repaired := consumeAll(t, w.conn.JS, len(stored))
	assertExactlyOnceInOrder(t, repaired, stored)
	assertRepairChains(t, repaired, seqOf)
	for _, e := range lost {
		if !strings.Contains(w.log.String(), "event missing from the stream published again") ||
			!strings.Contains(w.log.String(), e.ID) {
			t.Errorf("the log does not name the repaired event %s", e.ID)
		}
	}

	rep, err = au.Audit(ctx)
	if err != nil || rep.Repaired+rep.Reordered+rep.Deferred+rep.Duplicates != 0 {
		t.Errorf("audit after the repair = %+v, %v; want nothing to do", rep, err)
	}
	rep, err = w.auditor(time.Now).Audit(ctx)
	if err != nil || rep.Checked != 0 || rep.Position != stored[len(stored)-1].Seq {
		t.Errorf(
			"a new auditor's audit = %+v, %v; want it to resume after seq %d and check nothing",
			rep,
			err,
			stored[len(stored)-1].Seq,
		)
	}
	assertExactlyOnceInOrder(t, consumeAll(t, w.conn.JS, len(stored)), stored)
}

// TestAuditor_DuplicateIsNotARepair: an audit whose clock runs ahead of the
// server's duplicate window publishes a lost event again, JetStream drops
// it as a duplicate, and the audit counts nothing, says so, and holds
// the event for the next audit; the stream has not got it twice.
func TestAuditor_DuplicateIsNotARepair(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Minute)
	w.p.addRepos(ctx, "dup", 2, 0)
	w.flush(t)
	stored := storedEvents(t, w.st)
	w.deleteMsgs(t, 2)
	au := w.auditor(func() time.Time { return time.Now().Add(3 * time.Minute) })
	rep, err := au.Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Duplicates != 1 || rep.Repaired != 0 || w.repaired.Load() != 0 {
		t.Errorf("audit = %+v (counter %d), want one duplicate and nothing repaired", rep, w.repaired.Load())
	}
	want := store.HeldEvent{Seq: stored[1].Seq, Subject: stored[1].Subject}
	if held, err := w.st.AuditHeld(ctx); err != nil || len(held) != 1 || held[0] != want {
		t.Errorf("held = %v, %v; want [%d]: the event JetStream dropped, for the next audit", held, err, stored[1].Seq)
	}
	if !strings.Contains(w.log.String(), "dropped it again as a duplicate") {
		t.Errorf("the log does not say JetStream dropped the event:\n%s", w.log.String())
	}
	s, err := w.conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetMsg(ctx, 2); !errors.Is(err, jetstream.ErrMsgNotFound) {
		t.Errorf("stream message 2: %v, want it still deleted", err)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 1 {
		t.Errorf("stream holds %v messages (%v), want 1", info.State.Msgs, err)
	}
}

// TestAuditor_LeavesWhatTheStreamDropped: events whose messages the
// stream dropped from its head by a limit on its messages (its operator's,
// with manage_stream = false) are not the audit's to bring back: on such a
// stream it checks only what was published after the stream's first
// message, and publishes nothing. (On a stream limited by max_age alone, a
// lost head is published again: TestAuditor_BringsBackALostHead.)
func TestAuditor_LeavesWhatTheStreamDropped(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "old", 3, 0)
	w.flush(t)
	w.p.addRepos(ctx, "new", 2, 0)
	w.flush(t)
	s, err := w.conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	sc := s.CachedInfo().Config
	sc.MaxMsgs = 2
	if _, err := w.conn.JS.UpdateStream(ctx, sc); err != nil {
		t.Fatal(err)
	}
	// The clock past every window: everything is due for the audit.
	rep, err := w.auditor(func() time.Time { return time.Now().Add(3 * time.Minute) }).Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	stored := storedEvents(t, w.st)
	if rep.Checked != 2 || rep.Repaired+rep.Reordered+rep.Deferred+rep.Duplicates != 0 ||
		rep.Position != stored[len(stored)-1].Seq {
		t.Errorf(
			"audit = %+v, want the 2 events after the stream's first message checked, nothing published and the position at seq %d",
			rep,
			stored[len(stored)-1].Seq,
		)
	}
	if info, err := s.Info(ctx); err != nil || info.State.Msgs != 2 {
		t.Errorf("stream holds %v messages (%v), want the 2 kept", info.State.Msgs, err)
	}
}

// TestAuditor_SignedEvents: with a signing key, events go out under a
// Nats-Msg-Id that is not their id; the audit still finds every one on the
// stream (nothing published again), and one lost from the stream it
// publishes again signed, under the same Nats-Msg-Id, verifiable with the
// key.
func TestAuditor_SignedEvents(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	key, err := signing.ParseSigner(seed)
	if err != nil {
		t.Fatal(err)
	}
	v, err := signing.NewVerifier([]string{key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	w := newAuditWorld(t, time.Second, publish.WithSigner(key))
	w.p.addRepos(ctx, "signed", 3, 0)
	w.flush(t)
	stored := storedEvents(t, w.st)
	got := consumeAll(t, w.conn.JS, len(stored))
	for _, m := range got {
		if id := first(m.Header, jetstream.MsgIDHeader); !strings.Contains(id, ".") {
			t.Fatalf("Nats-Msg-Id %q is the event id", id)
		}
	}
	// Past every window: everything is due, and everything is there.
	later := func() time.Time { return time.Now().Add(3 * time.Minute) }
	rep, err := w.auditor(later).Audit(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rep.Checked != len(stored) || rep.Repaired+rep.Reordered+rep.Deferred+rep.Duplicates != 0 {
		t.Fatalf("audit of a whole signed stream = %+v, want %d checked and nothing published", rep, len(stored))
	}

	w.p.addRepos(ctx, "lost", 1, 0)
	w.flush(t)
	stored = storedEvents(t, w.st)
	w.deleteMsgs(t, uint64(len(stored)))
	au := w.auditor(time.Now)
	testutil.WaitFor(t, 20*time.Second, "an audit to publish the lost event again", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		return w.repaired.Load() >= 1
	})
	got = consumeAll(t, w.conn.JS, len(stored))
	last := got[len(got)-1]
	if err := v.Verify(last.Subject, nats.Header(last.Header), last.Data); err != nil {
		t.Errorf("the re-published event: %v", err)
	}
	if id, want := first(last.Header, jetstream.MsgIDHeader), key.MsgID(stored[len(stored)-1].ID); id != want {
		t.Errorf("re-published under Nats-Msg-Id %q, want %q", id, want)
	}
}

// TestAuditor_GivesWay: the audit asks its Yield before each read of the
// event log and of the stream, and an error from it ends the audit where
// it stands, with nothing checked past what it had read.
func TestAuditor_GivesWay(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "audit", 30, 0)
	w.flush(t)
	later := func() time.Time { return time.Now().Add(3 * time.Second) } // every event past the window
	cfg := func(yield func(context.Context) error) publish.AuditConfig {
		return publish.AuditConfig{Stream: testStream, SubjectPrefix: testPrefix, Every: time.Hour, Now: later,
			Batch: 7, MsgID: w.relay.MsgID, Yield: yield}
	}

	stop := errors.New("the relay needs the machine")
	rep, err := publish.NewAuditor(w.conn.JS, w.st, w.relay.Message, cfg(func(context.Context) error {
		return stop
	})).Audit(ctx)
	if !errors.Is(err, stop) || rep.Checked != 0 || rep.Position != 0 {
		t.Fatalf("audit whose Yield fails = %+v, %v; want %v and nothing checked", rep, err, stop)
	}

	var asked atomic.Int64
	rep, err = publish.NewAuditor(w.conn.JS, w.st, w.relay.Message, cfg(func(context.Context) error {
		asked.Add(1)
		return nil
	})).Audit(ctx)
	if err != nil || rep.Checked != 30 {
		t.Fatalf("audit = %+v, %v; want the 30 events checked", rep, err)
	}
	// 30 events in reads of 7: five reads of the log (the last empty),
	// four with events, each looking for them on the stream.
	if n := asked.Load(); n < 5+4 {
		t.Errorf("Yield asked %d times, want at least once before each of the 9 reads", n)
	}
}

// assertRepairChains checks the RepairAttribute of the stream's messages
// after a repair: each copy of a resource's own events (a lost one, or a
// later one moved behind it) names the message of the resource's own
// events just before it on the stream (a history.recorded copy between
// them names none, and is passed over); a message the repair left where it
// was (seqOf holds its first sequence) names none.
func assertRepairChains(t *testing.T, msgs []received, seqOf map[string]uint64) {
	t.Helper()
	before := map[string]uint64{} // per resource, its own last message
	chained := 0
	for _, m := range msgs {
		e, err := publish.Decode(m.Data)
		if err != nil {
			t.Fatalf("stream message %d: %v", m.StreamSeq, err)
		}
		own := strings.HasPrefix(e.Type, "tag.") || strings.HasPrefix(e.Type, "repo.")
		var want uint64
		if own && m.StreamSeq != seqOf[e.ID] {
			want = before[e.Subject]
			chained++
		}
		if e.RepairAfter != want {
			t.Errorf("stream message %d (%s of %s): %s = %d, want %d", m.StreamSeq, e.Type, e.Subject,
				publish.RepairAttribute, e.RepairAfter, want)
		}
		if own {
			before[e.Subject] = m.StreamSeq
		}
	}
	if chained == 0 {
		t.Errorf("no message was published again")
	}
}
