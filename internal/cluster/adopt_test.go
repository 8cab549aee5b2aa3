package cluster_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/signing"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestAdoptSnapshot_ANewFollowersMirrorIsTheSnapshotsFile: a follower
// with no mirror yet, which verifies the leader's key, makes the newest
// signed snapshot its mirror's file, passing over a newer one planted
// unsigned; opened, its follower starts from the snapshot's sequence
// (the events before it are not applied again, those after it are), ends
// with the leader's rows and digest, and the file passes CheckAdopted.
// Without a verify key nothing is adopted, and a path that exists is
// refused with the file as it was. What a crash left of the follower's
// restores is removed, and nothing of another's.
func TestAdoptSnapshot_ANewFollowersMirrorIsTheSnapshotsFile(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	js, leader := signedLeader(t, key)
	leader.change(3)
	leader.publish()
	snaps := cluster.NewSnapshotter(js, leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 5, Dir: t.TempDir(), Signer: key})
	genuine, err := snaps.Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	leader.change(2)
	leader.publish()
	// A newer snapshot, unsigned, planted by another client.
	obj, err := attackerConn(t, js).ObjectStore(ctx, "snaps")
	if err != nil {
		t.Fatal(err)
	}
	body, err := obj.GetBytes(ctx, genuine.Name)
	if err != nil {
		t.Fatal(err)
	}
	gi, err := obj.GetInfo(ctx, genuine.Name)
	if err != nil {
		t.Fatal(err)
	}
	planted := "mirror-" + time.Now().UTC().Add(time.Second).Format("20060102T150405.000Z")
	md := map[string]string{}
	for k, v := range gi.Metadata {
		if k != "signature" {
			md[k] = v
		}
	}
	if _, err := obj.Put(ctx, jetstream.ObjectMeta{Name: planted, Metadata: md}, bytes.NewReader(body)); err != nil {
		t.Fatal(err)
	}

	v, err := signing.NewVerifier([]string{key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	var rej rejections
	dir := t.TempDir()
	path := filepath.Join(dir, "follower.db")
	fc := cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "adopting", MaxWait: 100 * time.Millisecond,
		SnapshotBucket: "snaps", Restore: cluster.RestoreWhenEmpty, SnapshotDir: dir, Verifier: v, OnRejected: rej.add}
	// What a crash left of this follower's restores goes; another
	// follower's beside it stays.
	mine, others := filepath.Join(dir, ".restore-adopting-1234"), filepath.Join(dir, ".restore-adopting-2-1234")
	crashLeft(t, "mirror.db", mine, others)
	info, found, err := cluster.AdoptSnapshot(ctx, js, fc, path, store.Options{})
	if err != nil || !found {
		t.Fatalf("AdoptSnapshot: found %v, %v", found, err)
	}
	if info.Name != genuine.Name || info.Seq != genuine.Seq {
		t.Errorf("adopted %s (stream_seq %d), want %s (%d)", info.Name, info.Seq, genuine.Name, genuine.Seq)
	}
	if rej.get(signing.ReasonUnsigned) != 1 {
		t.Errorf("unsigned snapshots passed over: %d, want 1 (the planted one)", rej.get(signing.ReasonUnsigned))
	}
	if left, _ := filepath.Glob(filepath.Join(dir, "*")); len(left) != 2 || left[0] != others || left[1] != path {
		t.Errorf("the snapshot directory holds %v, want the mirror and the other follower's download", left)
	}

	fst, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fst.Close() })
	fc.Adopted, fc.Meta = &info, fst
	var applied int
	fc.OnBatch = func(n int, _ uint64) { applied += n }
	f := cluster.NewFollower(js, fst, fc)
	catchUp(t, f)
	if got := f.Restored(); got.Name != genuine.Name {
		t.Errorf("the follower says it started from %q, want %s", got.Name, genuine.Name)
	}
	if want, got := mirrorRows(t, leader.st), mirrorRows(t, fst); got != want {
		t.Errorf("follower's mirror:\n%s\nwant the leader's:\n%s", got, want)
	}
	want, err := leader.st.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := fst.ReplicaDigest(ctx); err != nil || got.Diff(want) != "" {
		t.Errorf("replica digest differs from the leader's in %q (%v)", got.Diff(want), err)
	}
	if err := fst.CheckAdopted(ctx); err != nil {
		t.Errorf("CheckAdopted: %v", err)
	}
	if applied == 0 {
		t.Errorf("the follower applied nothing after the snapshot; the leader changed two tags since")
	}

	// Without a verify key, nothing becomes the file.
	fc.Verifier, fc.Adopted = nil, nil
	other := filepath.Join(t.TempDir(), "unverified.db")
	if _, found, err := cluster.AdoptSnapshot(ctx, js, fc, other, store.Options{}); err != nil || found {
		t.Errorf("without a verify key: found %v, %v; want nothing adopted", found, err)
	}
	if _, err := os.Stat(other); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("without a verify key a mirror was made at %s (%v)", other, err)
	}
	// A mirror that exists is never replaced.
	fc.Verifier = v
	existing := filepath.Join(t.TempDir(), "existing.db")
	if err := os.WriteFile(existing, []byte("the mirror's own"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, found, err := cluster.AdoptSnapshot(ctx, js, fc, existing, store.Options{}); !errors.Is(err,
		store.ErrMirrorExists) || found {
		t.Errorf("over a mirror that exists: found %v, %v; want store.ErrMirrorExists", found, err)
	}
	if b, err := os.ReadFile(existing); err != nil || string(b) != "the mirror's own" {
		t.Errorf("the existing mirror was changed: %q (%v)", b, err)
	}
}

// TestSnapshot_TheObjectIsCheckedAgainstItsSignedDigest: a follower that
// verifies the leader's key takes the compressed object's signed digest
// on trust only because the object store's client checks the object's
// chunks against it as it reads them. An attacker who puts an older
// genuine snapshot's content under the newest one's name and signed
// metadata gets the newest refused (its object's digest is not the signed
// one), and so does one who then forges the object's info to claim the
// signed digest (the content is not what the digest says); the follower
// restores the older one, as signed. So it does when the forged info says
// the object is empty (its chunks, none, are not checked then). A snapshot without the object's manifest (an
// older leader's, or one whose object signature was stripped or spoiled)
// is checked by its file's manifest and restored.
func TestSnapshot_TheObjectIsCheckedAgainstItsSignedDigest(t *testing.T) {
	ctx := context.Background()
	key := newKey(t)
	js, leader := signedLeader(t, key)
	snaps := cluster.NewSnapshotter(js, leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 5, Dir: t.TempDir(), Signer: key})
	leader.change(2)
	leader.publish()
	older, err := snaps.Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	leader.change(2)
	leader.publish()
	// Object names have millisecond times: the two must differ.
	for ms := older.Created.Truncate(time.Millisecond); !time.Now().UTC().Truncate(time.Millisecond).After(ms); {
		runtime.Gosched()
	}
	newest, err := snaps.Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	v, err := signing.NewVerifier([]string{key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	var logs *testutil.Buffer // the last restore's
	restore := func(consumer string) (*cluster.Follower, *rejections) {
		t.Helper()
		logs = &testutil.Buffer{}
		var refused rejections
		fst, err := store.Open(ctx, filepath.Join(t.TempDir(), consumer+".db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fst.Close() })
		f := cluster.NewFollower(js, fst, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: consumer,
			MaxWait: 100 * time.Millisecond, SnapshotBucket: "snaps", Restore: cluster.RestoreWhenEmpty,
			SnapshotDir: t.TempDir(), Verifier: v, OnReject: refused.add,
			Logger: slog.New(slog.NewTextHandler(logs, nil))})
		catchUp(t, f)
		return f, &refused
	}
	attacker := attackerConn(t, js)
	obj, err := attacker.ObjectStore(ctx, "snaps")
	if err != nil {
		t.Fatal(err)
	}
	info, err := obj.GetInfo(ctx, newest.Name)
	if err != nil {
		t.Fatal(err)
	}

	// Stripped of its object signature, then with a spoiled one: checked
	// by the file's manifest, and restored.
	for _, sig := range []string{"", info.Metadata["object_signature"] + "x"} {
		md := map[string]string{}
		for k, v := range info.Metadata {
			md[k] = v
		}
		md["object_signature"] = sig
		if err := obj.UpdateMeta(ctx, newest.Name, jetstream.ObjectMeta{Name: newest.Name, Metadata: md}); err != nil {
			t.Fatal(err)
		}
		if f, refused := restore("fallback" + strconv.Itoa(len(sig))); f.Restored().Name != newest.Name ||
			refused.get(cluster.RejectSnapshot) != 0 {
			t.Errorf("object signature %q: restored %q (%d refused), want %s by its file's manifest", sig,
				f.Restored().Name, refused.get(cluster.RejectSnapshot), newest.Name)
		}
	}
	err = obj.UpdateMeta(ctx, newest.Name, jetstream.ObjectMeta{Name: newest.Name, Metadata: info.Metadata})
	if err != nil {
		t.Fatal(err)
	}

	// The older content under the newest's name and signed metadata, and
	// then the info forged to claim the signed digest.
	body, err := obj.GetBytes(ctx, older.Name)
	if err != nil {
		t.Fatal(err)
	}
	replaced, err := obj.Put(ctx, jetstream.ObjectMeta{Name: newest.Name, Metadata: info.Metadata},
		bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	if replaced.Digest == info.Digest {
		t.Fatal("the two snapshots' objects have the same digest")
	}
	restoredOlder := func(consumer, why string) {
		t.Helper()
		f, refused := restore(consumer)
		if !strings.Contains(logs.String(), why) {
			t.Errorf("%s: the refusal does not say %q:\n%s", consumer, why, logs.String())
		}
		if got := f.Restored(); got.Name != older.Name {
			t.Errorf("%s: restored %q, want the older snapshot %s: the newest's content is not what it signed",
				consumer, got.Name, older.Name)
		}
		if refused.get(cluster.RejectSnapshot) != 1 {
			t.Errorf("%s: snapshots refused: %d, want 1", consumer, refused.get(cluster.RejectSnapshot))
		}
	}
	restoredOlder("replaced", "is not the signed")
	forge := func(size uint64) {
		t.Helper()
		forged := *replaced
		forged.Digest, forged.Size = info.Metadata["object_digest"], size
		data, err := json.Marshal(forged)
		if err != nil {
			t.Fatal(err)
		}
		m := nats.NewMsg("$O.snaps.M." + base64.URLEncoding.EncodeToString([]byte(newest.Name)))
		m.Header.Set(jetstream.MsgRollup, jetstream.MsgRollupSubject)
		m.Data = data
		if _, err := attacker.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
		if got, err := obj.GetInfo(ctx, newest.Name); err != nil || got.Digest != forged.Digest || got.Size != size {
			t.Fatalf("the forged info: %v (%v)", got, err)
		}
	}
	forge(replaced.Size)
	restoredOlder("forged", "digests do not match")
	// An object said to be empty is read without its digest checked.
	forge(0)
	restoredOlder("empty", "is not the signed")
}

// TestSnapshotter_RemovesWhatACrashLeft: a leader's snapshotter removes,
// when it starts, the temporary copies a crash left of its mirror's
// snapshots (a full copy of the mirror and its compressed file each), and
// no other mirror's.
func TestSnapshotter_RemovesWhatACrashLeft(t *testing.T) {
	dir := t.TempDir()
	mine := filepath.Join(dir, ".snapshot-leader.db-99")
	// Another mirror's, whose name begins like this one's.
	others := filepath.Join(dir, ".snapshot-leader.db-2.db-99")
	crashLeft(t, "mirror.db.zst", mine, others)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	js, leader := newStreamLeader(t)
	s := cluster.NewSnapshotter(js, leader.st, cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour,
		Keep: 1, Dir: dir, Mirror: "leader.db"})
	if err := s.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if _, err := os.Stat(mine); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the crash's copy of this mirror's snapshot is still there (%v)", err)
	}
	if _, err := os.Stat(filepath.Join(others, "mirror.db.zst")); err != nil {
		t.Errorf("another mirror's copy was removed: %v", err)
	}
}

// crashLeft makes each of dirs with a file name in it, as a crash in a
// snapshot's write or restore leaves them.
func crashLeft(t *testing.T, name string, dirs ...string) {
	t.Helper()
	for _, d := range dirs {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(d, name), []byte("what a crash left"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}
