package cluster_test

import (
	"bytes"
	"context"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/signing"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// newKey returns a signer of a fresh user nkey.
func newKey(t *testing.T) *signing.Signer {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	s, err := signing.ParseSigner(seed)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// rejections counts a follower's rejected messages by reason.
type rejections struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *rejections) add(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[reason]++
}

func (r *rejections) get(reason string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.n[reason]
}

// verifyingFollower is a follower of stream EV on consumer that verifies
// signatures with v (nil: it does not). The tests call its CatchUp, which
// reads what the consumer skipped from the stream itself, rather than run
// it: a fetch lost on a loaded machine comes again only after the AckWait.
func verifyingFollower(
	t *testing.T,
	js jetstream.JetStream,
	consumer string,
	v *signing.Verifier,
	rej *rejections,
) (*cluster.Follower, *store.Store) {
	t.Helper()
	fst, err := store.Open(context.Background(), filepath.Join(t.TempDir(), consumer+".db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fst.Close() })
	f := cluster.NewFollower(
		js,
		fst,
		cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: consumer, MaxWait: 100 * time.Millisecond,
			Meta: fst, Verifier: v, OnRejected: rej.add},
	)
	return f, fst
}

func catchUp(t *testing.T, f *cluster.Follower) {
	t.Helper()
	if err := f.CatchUp(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// signedLeader is a leader's mirror whose relay signs with key.
func signedLeader(t *testing.T, key *signing.Signer) (jetstream.JetStream, *leaderMirror) {
	t.Helper()
	js, leader := newStreamLeader(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	opts := []publish.RelayOption{publish.WithCheckpoints(leader.st, time.Hour, "leader")}
	if key != nil {
		opts = append(opts, publish.WithSigner(key))
	}
	leader.relay = publish.NewRelay(js, leader.st, pcfg, opts...)
	return js, leader
}

// attackerConn is a plain NATS client of the same account: not syncd, and
// without syncd's key.
func attackerConn(t *testing.T, js jetstream.JetStream) jetstream.JetStream {
	t.Helper()
	return testutil.JetStream(t, js.Conn().ConnectedUrl())
}

// forgeries returns the messages an attacker publishes: repo g/evil with
// tag g/evil/t (digest sha256:attacker), the deletion of the leader's tag
// g/r1/t1, and a checkpoint whose digest matches no mirror. They are in
// syncd's own wire format, encoded from a mirror of the attacker's.
func forgeries(t *testing.T) []*nats.Msg {
	t.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "attacker.db"), store.Options{InitialEvents: "snapshot"})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	real := store.Repo{UID: "g/r1", Name: "nginx", CreateTime: t0, UpdateTime: t0}
	evil := store.Repo{UID: "g/evil", Name: "evil", CreateTime: t0, UpdateTime: t0}
	if _, err := st.ApplyRepos(ctx, []store.Repo{real}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 2, 0, 0, 1, 0, time.UTC) // the leader's first tag (leaderMirror.change)
	if _, _, err := st.ApplyTags(
		ctx,
		real,
		[]store.Tag{
			{
				UID:        "g/r1/t1",
				Name:       "v1",
				Digest:     "sha256:0000000000000000000000000000000000000000000000000000000000000001",
				CreateTime: at,
				UpdateTime: at,
			},
		},
	); err != nil {
		t.Fatal(err)
	}
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ApplyRepos(ctx, []store.Repo{real, evil}); err != nil {
		t.Fatal(err)
	}
	testutil.AnnounceTags(t, st, evil,
		[]store.Tag{{UID: "g/evil/t", Name: "t", Digest: "sha256:attacker", CreateTime: t0, UpdateTime: t0}})
	if _, err := st.MarkTagsDeleted(ctx, []string{"g/r1/t1"}); err != nil {
		t.Fatal(err)
	}
	evs, err := st.Unpublished(ctx, 0, 100)
	if err != nil {
		t.Fatal(err)
	}
	f := publish.Format{SubjectPrefix: "ev", Source: "test"}
	var out []*nats.Msg
	for _, e := range evs {
		if e.Type == "repo.created" && e.Subject == "g/evil" || e.Type == "tag.created" && e.Subject == "g/evil/t" ||
			e.Type == "tag.deleted" {
			out = append(out, f.Message(e))
		}
	}
	if len(out) != 3 {
		t.Fatalf("%d forged events, want 3: %+v", len(out), evs)
	}
	cp, err := publish.NewCheckpoint("evil", 1, time.Now(), store.ReplicaDigest{{Table: "tags", Rows: 1, Sum: 42}}).
		Message("ev", "test")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, cp)
}

func tagLive(t *testing.T, st *store.Store, uid string) (live, known bool) {
	t.Helper()
	var deleted bool
	err := st.Reader().QueryRow(`SELECT deleted_time IS NOT NULL FROM tags WHERE uid = ?`, uid).Scan(&deleted)
	if err != nil {
		return false, false
	}
	return !deleted, true
}

// TestFollower_RejectsForgedMessages: an attacker with a plain NATS
// client of the account publishes, in syncd's own format, repo g/evil
// with a tag, the deletion of a real tag and a checkpoint that matches no
// mirror; unsigned, then signed with a key of its own. A follower that
// verifies the leader's key terminates each (counted by reason), goes on
// with the leader's next events and ends with the leader's mirror; one
// that verifies nothing, on the same stream, takes the forgeries in: the
// attack is real.
func TestFollower_RejectsForgedMessages(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	js, leader := signedLeader(t, key)
	v, err := signing.NewVerifier([]string{key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	var rej, none rejections
	f, fst := verifyingFollower(t, js, "verifying", v, &rej)
	open, ost := verifyingFollower(t, js, "trusting", nil, &none)
	leader.change(2)
	publishCheckpoint(t, leader.relay)

	attacker := attackerConn(t, js)
	forged := forgeries(t)
	for _, m := range forged {
		if _, err := attacker.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	// The same again, signed with the attacker's own key (which also
	// gives them new Nats-Msg-Ids: the first ones are in the duplicate
	// window).
	other := newKey(t)
	for _, m := range forged {
		c := &nats.Msg{
			Subject: m.Subject,
			Data:    m.Data,
			Header:  nats.Header{jetstream.MsgIDHeader: []string{m.Header.Get(jetstream.MsgIDHeader)}},
		}
		if _, err := attacker.PublishMsg(ctx, other.Seal(c)); err != nil {
			t.Fatal(err)
		}
	}
	// A lease term's markers (one per lane) and a snapshot's record,
	// which the leader does not sign and no follower acts on: passed over,
	// not rejected.
	fence := publish.NewFence(js, publish.FenceConfig{Node: "leader", Lanes: 2,
		Format: publish.Config{SubjectPrefix: "ev", Source: "test"}.Format()})
	if err := fence.Mark(ctx); err != nil {
		t.Fatal(err)
	}
	if err := fence.RecordSnapshot(ctx, "mirror-1", 1); err != nil {
		t.Fatal(err)
	}
	leader.change(1)
	last := publishCheckpoint(t, leader.relay)

	for _, fl := range []*cluster.Follower{f, open} {
		catchUp(t, fl)
		if r, ok := fl.LastCheckpoint(); !ok || r.Seq != last {
			t.Fatalf("last checkpoint compared %+v, want the leader's last at %d", r, last)
		}
	}
	if got, want := mirrorRows(t, fst), mirrorRows(t, leader.st); got != want {
		t.Errorf("verifying follower's mirror:\n%s\nleader's:\n%s", got, want)
	}
	if live, known := tagLive(t, fst, "g/evil/t"); known {
		t.Errorf("verifying follower holds the forged tag g/evil/t (live %v)", live)
	}
	if live, _ := tagLive(t, fst, "g/r1/t1"); !live {
		t.Error("verifying follower: the forged deletion tombstoned g/r1/t1")
	}
	if r, _ := f.LastCheckpoint(); r.Diff != "" || r.Leader != "leader" || f.Diverged() {
		t.Errorf("verifying follower's last checkpoint %+v, diverged %v", r, f.Diverged())
	}
	if got := rej.get(signing.ReasonUnsigned); got != len(forged) {
		t.Errorf("rejected unsigned = %d, want %d", got, len(forged))
	}
	if got := rej.get(signing.ReasonBadSignature); got != len(forged) {
		t.Errorf("rejected bad_signature = %d, want %d", got, len(forged))
	}

	// Without verification, the same stream rewrites the mirror.
	if live, _ := tagLive(t, ost, "g/evil/t"); !live {
		t.Error("trusting follower lacks the forged tag: the forgery is not one")
	}
	if live, known := tagLive(t, ost, "g/r1/t1"); live || !known {
		t.Error("trusting follower: the forged deletion did not tombstone g/r1/t1")
	}
	if none.get(signing.ReasonUnsigned)+none.get(signing.ReasonBadSignature) != 0 {
		t.Error("a follower without a verifier rejected messages")
	}
}

// TestRelay_PreemptedMsgID: an attacker who computes the id of the
// leader's next event (ids are deterministic) publishes a message under
// it as Nats-Msg-Id before the leader does. With a signing key the
// leader's Nats-Msg-Id is not the id, the real event lands on the stream
// and the follower has it; without one, JetStream drops the real event as
// a duplicate (the attack the key defeats).
func TestRelay_PreemptedMsgID(t *testing.T) {
	for _, signed := range []bool{true, false} {
		t.Run(map[bool]string{true: "signed", false: "unsigned"}[signed], func(t *testing.T) {
			ctx := context.Background()
			var key *signing.Signer
			var v *signing.Verifier
			if signed {
				key = newKey(t)
				var err error
				if v, err = signing.NewVerifier([]string{key.PublicKey()}); err != nil {
					t.Fatal(err)
				}
			}
			js, leader := signedLeader(t, key)
			var rej rejections
			f, fst := verifyingFollower(t, js, "f", v, &rej)
			leader.change(1)
			next, err := leader.st.Unpublished(ctx, 0, 10)
			if err != nil {
				t.Fatal(err)
			}
			var ev store.Event
			for _, e := range next {
				if e.Type == "tag.created" {
					ev = e
				}
			}
			if ev.ID == "" {
				t.Fatalf("no tag.created among %+v", next)
			}
			junk := &nats.Msg{
				Subject: "ev.tag.created.junk",
				Data:    []byte("{}"),
				Header:  nats.Header{jetstream.MsgIDHeader: []string{ev.ID}},
			}
			if _, err := attackerConn(t, js).PublishMsg(ctx, junk); err != nil {
				t.Fatal(err)
			}
			last := publishCheckpoint(t, leader.relay)
			catchUp(t, f)
			if r, ok := f.LastCheckpoint(); !ok || r.Seq != last {
				t.Fatalf("last checkpoint compared %+v, want the leader's last at %d", r, last)
			}
			s, err := js.Stream(ctx, "EV")
			if err != nil {
				t.Fatal(err)
			}
			m, err := s.GetLastMsgForSubject(ctx, publish.Format{SubjectPrefix: "ev"}.Subject(ev))
			landed := err == nil
			if landed {
				got, err := publish.Decode(m.Data)
				landed = err == nil && got.ID == ev.ID
			}
			live, _ := tagLive(t, fst, "g/r1/t1")
			if landed != signed || live != signed {
				t.Errorf("leader's event on the stream %v, follower has the tag %v; want %v", landed, live, signed)
			}
			if signed && rej.get(signing.ReasonUnsigned) != 1 {
				t.Errorf("the junk message rejected %d times, want once", rej.get(signing.ReasonUnsigned))
			}
		})
	}
}

// TestSnapshot_SignedManifest: the leader signs its snapshot's manifest.
// An attacker copies the genuine object under a newer name, claiming a
// stream sequence ahead of it, the stream's last (a follower would skip the
// events in between), and a created time of now, so that the plausibility
// checks pass, with the genuine signature copied along. A follower that
// verifies restores the genuine snapshot and counts the planted one; one
// that verifies nothing restores the planted one (the attack is real).
func TestSnapshot_SignedManifest(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	js, leader := signedLeader(t, key)
	leader.change(2)
	leader.publish()
	snaps := cluster.NewSnapshotter(
		js,
		leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 5, Dir: t.TempDir(),
			Signer: key},
	)
	genuine, err := snaps.Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	leader.change(2)
	leader.publish()
	stream, err := js.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	sinfo, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if sinfo.State.LastSeq <= genuine.Seq {
		t.Fatalf("stream's last sequence %d, want past the snapshot's %d", sinfo.State.LastSeq, genuine.Seq)
	}
	planted := "mirror-" + time.Now().UTC().Add(time.Second).Format("20060102T150405.000Z")

	attacker := attackerConn(t, js)
	obj, err := attacker.ObjectStore(ctx, "snaps")
	if err != nil {
		t.Fatal(err)
	}
	info, err := obj.GetInfo(ctx, genuine.Name)
	if err != nil {
		t.Fatal(err)
	}
	if info.Metadata["signature"] == "" {
		t.Fatalf("genuine snapshot metadata %v: no signature", info.Metadata)
	}
	body, err := obj.GetBytes(ctx, genuine.Name)
	if err != nil {
		t.Fatal(err)
	}
	md := map[string]string{}
	for k, v := range info.Metadata {
		md[k] = v
	}
	md["stream_seq"], md["created"] = strconv.FormatUint(
		sinfo.State.LastSeq,
		10,
	), time.Now().
		UTC().
		Format(time.RFC3339Nano)
	if _, err := obj.PutBytes(ctx, planted, body); err != nil {
		t.Fatal(err)
	}
	if err := obj.UpdateMeta(ctx, planted, jetstream.ObjectMeta{Name: planted, Metadata: md}); err != nil {
		t.Fatal(err)
	}

	v, err := signing.NewVerifier([]string{key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	restoring := func(consumer string, v *signing.Verifier, rej *rejections) *cluster.Follower {
		fst, err := store.Open(ctx, filepath.Join(t.TempDir(), consumer+".db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fst.Close() })
		f := cluster.NewFollower(
			js,
			fst,
			cluster.FollowerConfig{
				Stream:         "EV",
				SubjectPrefix:  "ev",
				Consumer:       consumer,
				MaxWait:        100 * time.Millisecond,
				SnapshotBucket: "snaps",
				Restore:        cluster.RestoreWhenEmpty,
				SnapshotDir:    t.TempDir(),
				Verifier:       v,
				OnRejected:     rej.add,
			},
		)
		if err := f.CatchUp(ctx); err != nil {
			t.Fatalf("%s: %v", consumer, err)
		}
		return f
	}
	var rej, none rejections
	f := restoring("verifying", v, &rej)
	if got := f.Restored(); got.Name != genuine.Name || got.Seq != genuine.Seq {
		t.Errorf("verifying follower restored %s (stream_seq %d), want %s (%d)", got.Name, got.Seq, genuine.Name, genuine.Seq)
	}
	if rej.get(signing.ReasonBadSignature) != 1 {
		t.Errorf("bad_signature rejections = %d, want 1 (the planted snapshot)", rej.get(signing.ReasonBadSignature))
	}
	open := restoring("trusting", nil, &none)
	if got := open.Restored(); got.Name != planted {
		t.Errorf("trusting follower restored %s, want the planted snapshot: the attack is not one", got.Name)
	}

	// The genuine snapshot's content replaced, its signed metadata kept:
	// the manifest verifies, the download does not match it.
	if err := obj.Delete(ctx, planted); err != nil {
		t.Fatal(err)
	}
	enc, err := zstd.NewWriter(nil)
	if err != nil {
		t.Fatal(err)
	}
	other := enc.EncodeAll([]byte("not the leader's mirror"), nil)
	if _, err := obj.Put(
		ctx,
		jetstream.ObjectMeta{Name: genuine.Name, Metadata: info.Metadata},
		bytes.NewReader(other),
	); err != nil {
		t.Fatal(err)
	}
	fst, err := store.Open(ctx, filepath.Join(t.TempDir(), "tampered.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fst.Close() })
	var refused rejections
	tf := cluster.NewFollower(
		js,
		fst,
		cluster.FollowerConfig{
			Stream:         "EV",
			SubjectPrefix:  "ev",
			Consumer:       "tampered",
			MaxWait:        100 * time.Millisecond,
			SnapshotBucket: "snaps",
			Restore:        cluster.RestoreWhenEmpty,
			SnapshotDir:    t.TempDir(),
			Verifier:       v,
			OnReject:       refused.add,
		},
	)
	if err := tf.CatchUp(ctx); err != nil {
		t.Fatalf("a follower whose only snapshot is refused follows the stream instead: %v", err)
	}
	if got := tf.Restored(); got.Name != "" {
		t.Errorf(
			"restored %s, whose content was replaced under its signed manifest; want it refused for its digest",
			got.Name,
		)
	}
	if refused.get(cluster.RejectSnapshot) != 1 {
		t.Errorf("snapshot rejections = %d, want 1 (the replaced content)", refused.get(cluster.RejectSnapshot))
	}
}

// TestFollower_AGapBeforeForgeriesAlone: deliveries lost on the way, and
// then a batch of forged messages alone, which the follower rejects. The
// events before them are read from the stream all the same: before, the
// follower's position moved past the rejected messages and the events
// came only after the consumer's 30 s AckWait.
func TestFollower_AGapBeforeForgeriesAlone(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	js, leader := signedLeader(t, key)
	v, err := signing.NewVerifier([]string{key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	var rej rejections
	f, fst := verifyingFollower(t, js, "verifying", v, &rej)
	leader.change(2)
	leader.publish()
	catchUp(t, f)
	leader.change(2)
	leader.publish()
	cons, err := js.Consumer(ctx, "EV", "verifying")
	if err != nil {
		t.Fatal(err)
	}
	pending := pendingOnTheStream(t, js, cons)
	takeDeliveries(t, cons, pending, pending, "the change's events")
	attacker := attackerConn(t, js)
	for _, m := range forgeries(t)[:3] { // the events, not the checkpoint
		if _, err := attacker.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	catchUp(t, f)
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, fst); l != fo {
		t.Fatalf("the follower differs from the leader after its catch-up:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
	if n := rej.get(signing.ReasonUnsigned); n == 0 {
		t.Errorf("rejected %d unsigned messages, want the forgeries", n)
	}
}
