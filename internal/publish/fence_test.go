package publish_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// fencedNode is one replica's fence in a fencing test: it counts its
// step-downs.
type fencedNode struct {
	fence    *publish.Fence
	stepDown atomic.Int32
	log      *logBuffer
}

func newFencedNode(js jetstream.JetStream, cfg publish.Config, node string) *fencedNode {
	return newLanedNode(js, cfg, node, 1)
}

// newLanedNode is newFencedNode with a term of the given lanes.
func newLanedNode(js jetstream.JetStream, cfg publish.Config, node string, lanes int) *fencedNode {
	n := &fencedNode{log: &logBuffer{}}
	n.fence = publish.NewFence(
		js,
		publish.FenceConfig{Node: node, Format: cfg.Format(), Lanes: lanes, Stream: cfg.Stream,
			OnFenced: func() { n.stepDown.Add(1) },
			Logger:   n.log.logger()},
	)
	return n
}

// guardBuckets has f fence the test's KV buckets as KV.setFence would.
func guardBuckets(f *publish.Fence) {
	c := kvTestConfig()
	for _, b := range []string{c.Tags, c.Repos, c.Advisories} {
		f.Guard("$KV."+b+"."+publish.TermKey, "$KV."+b+"."+publish.TermKey, "KV_"+b)
	}
}

func mark(t *testing.T, f *publish.Fence) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := f.Mark(ctx); err != nil {
		t.Fatalf("mark the term: %v", err)
	}
}

// streamState is the stream's last sequence and the subject stored there.
func streamState(t *testing.T, js jetstream.JetStream) (uint64, string) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	last := info.State.LastSeq
	m, err := s.GetMsg(ctx, last)
	if err != nil {
		t.Fatal(err)
	}
	return last, m.Subject
}

// assertOnlyMarkerSince checks that the stream gained exactly one message
// since seq before, the newer term's marker: nothing of the older term.
func assertOnlyMarkerSince(t *testing.T, js jetstream.JetStream, before uint64) {
	t.Helper()
	last, subject := streamState(t, js)
	if last != before+1 || subject != publish.TermSubject(testPrefix) {
		t.Errorf(
			"stream ends at seq %d (%s), want %d, the newer term's marker: the deposed leader's write landed",
			last,
			subject,
			before+1,
		)
	}
}

// assertFenced checks that n counted refused writes, stepped down once and
// warned once.
func assertFenced(t *testing.T, n *fencedNode) {
	t.Helper()
	if n.fence.Refused() == 0 {
		t.Error("no refused write counted")
	}
	if got := n.stepDown.Load(); got != 1 {
		t.Errorf("stepped down %d times, want once", got)
	}
	if got := strings.Count(n.log.String(), "a write was refused"); got != 1 {
		t.Errorf("warned %d times of the refusal, want once; log:\n%s", got, n.log.String())
	}
}

// TestFence_RelayEventRefusedAfterNewTerm: once another replica marked its
// term, the deposed leader's relay publishes nothing: the server refuses
// its events, which stay in its outbox, and it counts, warns and steps down
// once, and sends nothing more.
func TestFence_RelayEventRefusedAfterNewTerm(t *testing.T) {
	ctx := context.Background()
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	a, b := newFencedNode(c.JS, cfg, "a"), newFencedNode(c.JS, cfg, "b")
	r := publish.NewRelay(c.JS, st, cfg, publish.WithFence(a.fence))
	mark(t, a.fence)
	p.addRepos(ctx, "app", 2, 2)
	if err := r.Flush(ctx); err != nil {
		t.Fatalf("flush within the term: %v", err)
	}
	before, _ := streamState(t, c.JS)
	mark(t, b.fence)

	p.updateAll(ctx)
	err := r.Flush(ctx)
	if err == nil {
		t.Fatal("the deposed leader's flush succeeded")
	}
	assertOnlyMarkerSince(t, c.JS, before)
	if n, _, _ := st.UnpublishedCount(ctx); n != 2 {
		t.Errorf("%d events unpublished, want the 2 refused", n)
	}
	assertFenced(t, a)
	refused := a.fence.Refused()
	if err := r.Flush(ctx); !errors.Is(err, publish.ErrFenced) {
		t.Errorf("a second flush: %v, want ErrFenced before anything is sent", err)
	}
	if a.fence.Refused() != refused {
		t.Error("the second flush sent writes the server refused: the fence did not stop them")
	}
	assertOnlyMarkerSince(t, c.JS, before)
}

// TestFence_CheckpointRefusedAfterNewTerm: a checkpoint of the deposed
// leader does not reach the stream.
func TestFence_CheckpointRefusedAfterNewTerm(t *testing.T) {
	ctx := context.Background()
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	a, b := newFencedNode(c.JS, cfg, "a"), newFencedNode(c.JS, cfg, "b")
	r := publish.NewRelay(c.JS, st, cfg, publish.WithFence(a.fence), publish.WithCheckpoints(st, time.Hour, "a"))
	mark(t, a.fence)
	p.addRepos(ctx, "app", 1, 1)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	before, _ := streamState(t, c.JS)
	mark(t, b.fence)
	seq, why, err := r.PublishCheckpoint(ctx)
	if err == nil {
		t.Fatalf("the deposed leader published a checkpoint at seq %d (why %q)", seq, why)
	}
	assertOnlyMarkerSince(t, c.JS, before)
	assertFenced(t, a)
}

// TestFence_KVPutRefusedAfterNewTerm: the deposed leader's events reached
// the stream before the newer term began, but their KV writes came after
// its markers (the process paused between the two): the buckets keep what
// they held, and only the newer term's marker key changed.
func TestFence_KVPutRefusedAfterNewTerm(t *testing.T) {
	ctx := context.Background()
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	a, b := newFencedNode(c.JS, cfg, "a"), newFencedNode(c.JS, cfg, "b")
	guardBuckets(b.fence)
	k := mustOpenKV(t, c.JS, st)
	r := publish.NewRelay(c.JS, st, cfg, publish.WithKV(k), publish.WithFence(a.fence))
	mark(t, a.fence)
	p.addRepos(ctx, "app", 2, 2)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	tags := k.Bucket("tag")
	want := withoutMarker(t, bucketContents(t, tags))
	if len(want) != 4 {
		t.Fatalf("tags bucket holds %d tags before the new term, want 4", len(want))
	}
	publish.SetBeforeKVApply(k, func([]store.Event) error {
		mark(t, b.fence) // the newer term begins between the marking and the writes
		return nil
	})
	p.moveAll(ctx, 1)
	if err := r.Flush(ctx); err == nil {
		t.Fatal("the deposed leader's KV writes succeeded")
	}
	got := bucketContents(t, tags)
	if !strings.Contains(string(got[publish.TermKey]), `"node":"b"`) {
		t.Errorf("marker key = %s, want node b's", got[publish.TermKey])
	}
	if diff := sameValues(want, withoutMarker(t, got)); diff != "" {
		t.Errorf("tags bucket changed after the newer term began: %s", diff)
	}
	assertFenced(t, a)
}

// TestFence_KVReconcileRefusedAfterNewTerm: the deposed leader's
// reconciliation neither puts a missing key back nor deletes a stray one.
func TestFence_KVReconcileRefusedAfterNewTerm(t *testing.T) {
	ctx := context.Background()
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	a, b := newFencedNode(c.JS, cfg, "a"), newFencedNode(c.JS, cfg, "b")
	guardBuckets(b.fence)
	k := mustOpenKV(t, c.JS, st)
	r := publish.NewRelay(c.JS, st, cfg, publish.WithKV(k), publish.WithFence(a.fence))
	mark(t, a.fence)
	p.addRepos(ctx, "app", 1, 2)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// What a reconciliation would repair: a key missing, a stray key.
	tags := k.Bucket("tag")
	if err := tags.Delete(ctx, publish.TagKey("app-0", "v0")); err != nil {
		t.Fatal(err)
	}
	if _, err := tags.Put(ctx, "stray.key", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	want := withoutMarker(t, bucketContents(t, tags))
	mark(t, b.fence)

	if _, err := k.Reconcile(ctx); err == nil {
		t.Fatal("the deposed leader's reconciliation succeeded")
	}
	if diff := sameValues(want, withoutMarker(t, bucketContents(t, tags))); diff != "" {
		t.Errorf("tags bucket changed after the newer term began: %s", diff)
	}
	assertFenced(t, a)
}

// withoutMarker returns kv without the term marker key, which it must hold.
func withoutMarker(t *testing.T, kv map[string][]byte) map[string][]byte {
	t.Helper()
	if _, ok := kv[publish.TermKey]; !ok {
		t.Errorf("bucket has no term marker key %s", publish.TermKey)
	}
	for key := range kv {
		if publish.IsTermKey(key) {
			delete(kv, key)
		}
	}
	return kv
}

// sameValues is "" when a and b hold the same keys and values.
func sameValues(a, b map[string][]byte) string {
	var diffs []string
	for k, v := range a {
		if string(b[k]) != string(v) {
			diffs = append(diffs, k+": "+string(v)+" became "+string(b[k]))
		}
	}
	for k := range b {
		if _, ok := a[k]; !ok {
			diffs = append(diffs, k+" added")
		}
	}
	return strings.Join(diffs, "; ")
}

// TestKV_DuplicateWritesNoOlderState: a replica that leads again publishes
// the events its outbox kept from its earlier term; the other leader had
// recorded the same changes under the same ids, and more since. JetStream
// drops them as duplicates, and their states, older than the buckets',
// are not written: the buckets never go back, and end with the mirror's.
func TestKV_DuplicateWritesNoOlderState(t *testing.T) {
	ctx := context.Background()
	s := startServer(t, nil)
	cfg := s.config(nil)
	c := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	k := mustOpenKV(t, c.JS, st)
	r := publish.NewRelay(c.JS, st, cfg, publish.WithKV(k))
	p.addRepos(ctx, "app", 1, 1)
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// Two moves the other leader published, and whose newest state it
	// wrote to the bucket; this replica's outbox still holds them.
	tag := p.tags[p.repos[0].UID][0]
	p.move(ctx, tag.UID, 2)
	var evs []store.Event
	if err := st.ReadUnpublished(
		ctx,
		0,
		100,
		func(b []store.Event) error { evs = append(evs, b...); return nil },
	); err != nil {
		t.Fatal(err)
	}
	if len(evs) < 2 {
		t.Fatalf("%d events unpublished, want the 2 moves at least", len(evs))
	}
	for _, e := range evs {
		if _, err := c.JS.PublishMsg(ctx, r.Message(e)); err != nil {
			t.Fatal(err)
		}
	}
	key := publish.TagKey("app-0", tag.Name)
	newest, err := json.Marshal(publish.TagValue{Repo: "app-0", Tag: tag.Name, UID: tag.UID, Digest: digest(2)})
	if err != nil {
		t.Fatal(err)
	}
	tags := k.Bucket("tag")
	rev, err := tags.Put(ctx, key, newest)
	if err != nil {
		t.Fatal(err)
	}

	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	hist, err := tags.History(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range hist {
		var v publish.TagValue
		if e.Revision() <= rev || json.Unmarshal(e.Value(), &v) != nil {
			continue
		}
		if v.Digest != digest(2) {
			t.Errorf("after the newest state, the key went to digest %s (revision %d): an older state", v.Digest, e.Revision())
		}
	}
	if n, _, _ := st.UnpublishedCount(ctx); n != 0 {
		t.Errorf("%d events unpublished, want the duplicates marked published", n)
	}
}

func TestLanesFor(t *testing.T) {
	if publish.LanesFor(1, 0) != 1 || publish.LanesFor(1, 3) != publish.ReplicatedLanes ||
		publish.LanesFor(3) != publish.ReplicatedLanes {
		t.Error("one lane exactly when no stream is replicated")
	}
}

func TestIsTermKey(t *testing.T) {
	for key, want := range map[string]bool{
		"=term": true, "=term_1": true, "=term_31": true,
		"=terms": false, "=2Eterm": false, "term": false, "app.=term": false,
	} {
		if got := publish.IsTermKey(key); got != want {
			t.Errorf("IsTermKey(%q) = %v, want %v", key, got, want)
		}
	}
}

// TestFence_MissingMarkerIsMarkedAgain: a write refused because the
// stream holds no marker at all on its subject (it aged out with max_age,
// or was purged) is no newer term's: the term is marked again (by the
// remark function, which confirms the lease before and after laying the
// markers) and the writes go on, without a step-down; a newer term's
// refusal after that still steps the replica down. When the lease is gone
// before the markers, or after them, the replica steps down once, and
// nothing of its term lands: the markers laid again do not open the term
// to writes until the lease was confirmed after them.
func TestFence_MissingMarkerIsMarkedAgain(t *testing.T) {
	for _, lease := range []string{"held", "lost before", "lost after"} {
		t.Run("lease "+lease, func(t *testing.T) {
			ctx := context.Background()
			s := startServer(t, nil)
			cfg := s.config(nil)
			c := mustConnect(t, cfg)
			st := mustOpenStore(t)
			p := newProducer(t, st)
			a := newFencedNode(c.JS, cfg, "a")
			var remarks atomic.Int32
			a.fence.SetRemark(func(ctx context.Context, lay func(context.Context) error) error {
				remarks.Add(1)
				if lease == "lost before" {
					return errors.New("no longer the leader")
				}
				if err := lay(ctx); err != nil {
					return err
				}
				if lease == "lost after" {
					return errors.New("the lease was lost while the term was marked")
				}
				return nil
			})
			r := publish.NewRelay(c.JS, st, cfg, publish.WithFence(a.fence))
			mark(t, a.fence)
			stream, err := c.JS.Stream(ctx, testStream)
			if err != nil {
				t.Fatal(err)
			}
			if err := stream.Purge(ctx, jetstream.WithPurgeSubject(publish.TermSubject(testPrefix))); err != nil {
				t.Fatal(err)
			}
			p.addRepos(ctx, "app", 1, 1)
			if err := r.Flush(ctx); err == nil {
				t.Fatal("a write conditional on a purged marker succeeded")
			}
			// A write sent before the markers were laid again can be refused
			// for the missing marker after them: a second remark, which
			// confirms the lease like the first.
			remarked(t, a, &remarks)
			if lease != "held" {
				if got := a.stepDown.Load(); got != 1 || a.fence.InTerm() {
					t.Fatalf("marking again failed: stepped down %d times, in term %v; want once, false", got,
						a.fence.InTerm())
				}
				nothingLands(t, r, stream, "the failed remark")
				return
			}
			markedAgain(t, r, st, a)
			if got := strings.Count(a.log.String(), "marker is no longer on the stream"); got != int(remarks.Load()) {
				t.Errorf("warned %d times of the missing marker, want once a remark (%d); log:\n%s", got,
					remarks.Load(), a.log.String())
			}
			// A newer term after that still ends this one.
			mark(t, newFencedNode(c.JS, cfg, "b").fence)
			p.updateAll(ctx)
			if err := r.Flush(ctx); err == nil {
				t.Fatal("the deposed leader's flush succeeded")
			}
			assertFenced(t, a)
		})
	}
}

// remarked waits until a's remark (counted in remarks) has ended: in
// term again, or stepped down.
func remarked(t *testing.T, a *fencedNode, remarks *atomic.Int32) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, func() error {
		if remarks.Load() >= 1 && (a.fence.InTerm() || a.stepDown.Load() > 0) {
			return nil
		}
		return fmt.Errorf("the remark has not ended: %d remarks, in term %v, %d step-downs; log:\n%s",
			remarks.Load(), a.fence.InTerm(), a.stepDown.Load(), a.log.String())
	})
}

// nothingLands checks that r's flush is refused before it is sent
// (ErrFenced) and that the stream does not grow, after what.
func nothingLands(t *testing.T, r *publish.Relay, stream jetstream.Stream, after string) {
	t.Helper()
	last := lastSeq(t, stream)
	if err := r.Flush(context.Background()); !errors.Is(err, publish.ErrFenced) {
		t.Errorf("a flush after %s: %v, want ErrFenced", after, err)
	}
	if now := lastSeq(t, stream); now != last {
		t.Errorf("the stream grew from seq %d to %d after %s", last, now, after)
	}
}

// markedAgain checks that a, whose term was marked again, publishes
// everything st holds through r, and never stepped down.
func markedAgain(t *testing.T, r *publish.Relay, st *store.Store, a *fencedNode) {
	t.Helper()
	ctx := context.Background()
	if err := r.Flush(ctx); err != nil {
		t.Fatalf("flush after the term was marked again: %v", err)
	}
	if n, _, _ := st.UnpublishedCount(ctx); n != 0 {
		t.Errorf("%d events unpublished after the term was marked again", n)
	}
	if got := a.stepDown.Load(); got != 0 {
		t.Errorf("stepped down %d times, want none; log:\n%s", got, a.log.String())
	}
}

// TestFence_AuditRepublishRefusedAfterNewTerm: the stream audit of a
// deposed leader finds an event the stream lost, but its re-publish is
// refused once another replica's term began: nothing lands, and the
// replica steps down.
func TestFence_AuditRepublishRefusedAfterNewTerm(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	w := newAuditWorld(t, time.Second)
	w.p.addRepos(ctx, "audit", 1, 1)
	w.flush(t)
	stored := storedEvents(t, w.st)
	got := consumeAll(t, w.conn.JS, len(stored))
	w.deleteMsgs(t, got[0].StreamSeq) // the repo's creation, lost
	format := publish.Format{SubjectPrefix: testPrefix, Source: testSource}
	var stepDowns atomic.Int32
	log := &logBuffer{}
	a := publish.NewFence(w.conn.JS, publish.FenceConfig{Node: "a", Format: format,
		OnFenced: func() { stepDowns.Add(1) }, Logger: log.logger()})
	b := publish.NewFence(w.conn.JS, publish.FenceConfig{Node: "b", Format: format})
	mark(t, a)
	mark(t, b)
	before, _ := streamState(t, w.conn.JS)
	au := publish.NewAuditor(w.conn.JS, w.st, w.relay.Message, publish.AuditConfig{Stream: testStream,
		SubjectPrefix: testPrefix, Every: time.Hour, Now: time.Now, Batch: 7, Fence: a, MsgID: w.relay.MsgID,
		OnRepaired: func(store.Event) { w.repaired.Add(1) }})
	// Past the duplicate window the audit publishes the lost event again.
	testutil.WaitFor(t, 20*time.Second, "the audit's re-publish to be refused", func() bool {
		_, _ = au.Audit(ctx) // refused, or within the window
		return a.Refused() > 0
	})
	if last, subject := streamState(t, w.conn.JS); last != before {
		t.Errorf("the stream grew to seq %d (%s) after the newer term's markers: the deposed audit's write landed",
			last, subject)
	}
	if w.repaired.Load() != 0 || stepDowns.Load() != 1 {
		t.Errorf("repaired %d, stepped down %d times; want 0 and once", w.repaired.Load(), stepDowns.Load())
	}
}

// lastSeq is the stream's last sequence.
func lastSeq(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// TestPipeline_LanesAndDepth: a pipeline of ReplicatedLanes lanes takes
// lanes 1 to 31 of each stream in turn, and keeps laneSlack of them
// between a lane's writes; one of an unreplicated stream's fence, or of
// no fence, writes on lane 0 without a limit.
func TestPipeline_LanesAndDepth(t *testing.T) {
	p := publish.NewFence(nil, publish.FenceConfig{Node: "a", Lanes: publish.ReplicatedLanes}).Pipeline()
	if got, want := p.Depth(), publish.ReplicatedLanes-5; got != want {
		t.Errorf("depth %d, want %d", got, want)
	}
	for i := range 2 * (publish.ReplicatedLanes - 1) {
		if got, want := p.Lane("s"), 1+i%(publish.ReplicatedLanes-1); got != want {
			t.Fatalf("write %d on lane %d, want %d", i, got, want)
		}
	}
	if got := p.Lane("other"); got != 1 {
		t.Errorf("another stream's first write on lane %d, want 1", got)
	}
	for _, f := range []*publish.Fence{nil, publish.NewFence(nil, publish.FenceConfig{Node: "a"})} {
		if p := f.Pipeline(); p.Depth() != 0 || p.Lane("s") != 0 {
			t.Errorf("one lane: depth %d, lane %d; want 0 and 0", p.Depth(), p.Lane("s"))
		}
	}
	if !publish.LaneConflict(&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequenceConstant}) ||
		publish.LaneConflict(&jetstream.APIError{ErrorCode: jetstream.JSErrCodeStreamWrongLastSequence}) {
		t.Error("LaneConflict is 10164 alone")
	}
}
