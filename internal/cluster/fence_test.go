package cluster_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// markingSource is a snapshot source that calls newer once its backup is
// done: another replica's term begins (the snapshot's upload and record
// come after the newer term's markers, as when the leader paused while it
// copied), or the relay publishes what the copy holds unpublished.
type markingSource struct {
	cluster.SnapshotSource
	newer func()
}

func (s markingSource) Backup(ctx context.Context, path string) error {
	err := s.SnapshotSource.Backup(ctx, path)
	s.newer()
	return err
}

// TestFence_SnapshotRefusedAfterNewTerm: a snapshot the deposed leader
// finished after another replica's term began gets no record on the stream
// and is deleted from the bucket; one written within its term stays, with
// its record.
func TestFence_SnapshotRefusedAfterNewTerm(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	format := publish.Format{SubjectPrefix: "ev", Source: "test"}
	stepDowns := 0
	a := publish.NewFence(js, publish.FenceConfig{Node: "a", Format: format, OnFenced: func() { stepDowns++ }})
	b := publish.NewFence(js, publish.FenceConfig{Node: "b", Format: format})
	if err := a.Mark(ctx); err != nil {
		t.Fatal(err)
	}
	leader.change(2)
	leader.publish()
	cfg := cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 5, Dir: t.TempDir(), Fence: a}
	kept, err := cluster.NewSnapshotter(js, leader.st, cfg).Write(ctx, nil)
	if err != nil {
		t.Fatalf("a snapshot within the term: %v", err)
	}
	record := lastOn(t, js, "ev."+publish.SnapshotToken)
	if record == nil || record.Sequence == 0 {
		t.Fatal("no record of the snapshot written within the term")
	}

	newer := markingSource{SnapshotSource: leader.st, newer: func() {
		if err := b.Mark(ctx); err != nil {
			t.Error(err)
		}
	}}
	_, err = cluster.NewSnapshotter(js, newer, cfg).Write(ctx, nil)
	if !errors.Is(err, publish.ErrFenced) {
		t.Fatalf("the deposed leader's snapshot: %v, want it fenced", err)
	}
	if got := lastOn(t, js, "ev."+publish.SnapshotToken); got.Sequence != record.Sequence {
		t.Errorf("a record of the fenced snapshot reached the stream at seq %d", got.Sequence)
	}
	obj, err := js.ObjectStore(ctx, "snaps")
	if err != nil {
		t.Fatal(err)
	}
	objs, err := obj.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(objs) != 1 || objs[0].Name != kept.Name {
		var names []string
		for _, o := range objs {
			names = append(names, o.Name)
		}
		t.Errorf("bucket holds %v, want only the snapshot of the term, %s", names, kept.Name)
	}
	if a.Refused() != 1 || stepDowns != 1 {
		t.Errorf("refused %d writes and stepped down %d times, want 1 and 1", a.Refused(), stepDowns)
	}
	// Outside a term, nothing is even uploaded.
	if _, err := cluster.NewSnapshotter(js, leader.st, cfg).Write(ctx, nil); !errors.Is(err, publish.ErrFenced) {
		t.Errorf("a snapshot after the refusal: %v, want ErrFenced", err)
	}
}

// lastOn is the stream EV's last message on subject; nil when none.
func lastOn(t *testing.T, js jetstream.JetStream, subject string) *jetstream.RawStreamMsg {
	t.Helper()
	s, err := js.Stream(context.Background(), "EV")
	if err != nil {
		t.Fatal(err)
	}
	m, err := s.GetLastMsgForSubject(context.Background(), subject)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// TestSnapshot_UnrecordedSnapshotPassedOver: a follower restores only a
// snapshot whose record is on the stream. The newest snapshot's record is
// deleted from the stream, as nats-server lost a deposed leader's
// acknowledged writes in a minority partition (docs/cluster.md): the
// follower passes over that snapshot for the older one, and follows the
// stream from there to the leader's mirror.
func TestSnapshot_UnrecordedSnapshotPassedOver(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	fence := publish.NewFence(js, publish.FenceConfig{Node: "a", Format: publish.Format{SubjectPrefix: "ev",
		Source: "test"}})
	if err := fence.Mark(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 5, Dir: t.TempDir(),
		Fence: fence}
	write := func() cluster.SnapshotInfo {
		leader.change(2)
		leader.publish()
		info, err := cluster.NewSnapshotter(js, leader.st, cfg).Write(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		return info
	}
	older, newest := write(), write()
	leader.change(1)
	leader.publish()
	restoredBy := func(consumer string) (cluster.SnapshotInfo, *store.Store, int) {
		var rej rejections
		fst, err := store.Open(ctx, filepath.Join(t.TempDir(), consumer+".db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fst.Close() })
		f := cluster.NewFollower(js, fst, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: consumer,
			MaxWait: 100 * time.Millisecond, Meta: fst, SnapshotBucket: "snaps", Restore: cluster.RestoreWhenEmpty,
			SnapshotDir: t.TempDir(), OnReject: rej.add})
		catchUp(t, f)
		return f.Restored(), fst, rej.get(cluster.RejectSnapshot)
	}
	if got, _, refused := restoredBy("with-record"); got.Name != newest.Name || refused != 0 {
		t.Fatalf("restored %q (%d refused), want the newest, %q", got.Name, refused, newest.Name)
	}

	record := lastOn(t, js, "ev."+publish.SnapshotToken)
	stream, err := js.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.DeleteMsg(ctx, record.Sequence); err != nil {
		t.Fatal(err)
	}
	got, fst, refused := restoredBy("without-record")
	if got.Name != older.Name || refused != 1 {
		t.Fatalf("restored %q (%d refused), want the older, %q, the newest refused", got.Name, refused, older.Name)
	}
	if a, b := mirrorRows(t, fst), mirrorRows(t, leader.st); a != b {
		t.Errorf("the follower's mirror:\n%s\nthe leader's:\n%s", a, b)
	}
}
