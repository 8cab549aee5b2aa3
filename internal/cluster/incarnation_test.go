package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// The stream lost whole and created again counts its sequences from 1:
// a position of the old stream (a snapshot's, a mirror's) names nothing
// in the new one. These tests give the new stream more messages than the
// old one's positions, so that taking them for positions of the new
// stream passes over messages it holds.

var evConfig = publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute}

// snapshotThenRecreate writes a snapshot of leader's mirror after three
// changes, then loses the stream and has the leader publish six changes
// (twelve messages) on the new one; it returns the snapshot.
func snapshotThenRecreate(t *testing.T, js jetstream.JetStream, leader *leaderMirror) cluster.SnapshotInfo {
	t.Helper()
	info := writeSnapshot(t, js, leader)
	if info.Seq == 0 || info.StreamCreated.IsZero() {
		t.Fatalf("snapshot %+v: want its stream sequence and the stream's creation time", info)
	}
	testutil.RecreateStream(t, js, evConfig)
	leader.change(6)
	leader.publish()
	if last := streamInfo(t, js).State.LastSeq; last <= info.Seq {
		t.Fatalf("the new stream's last sequence %d, want past the snapshot's %d", last, info.Seq)
	}
	return info
}

// writeSnapshot writes a snapshot of leader's mirror after three changes
// into the bucket snaps.
func writeSnapshot(t *testing.T, js jetstream.JetStream, leader *leaderMirror) cluster.SnapshotInfo {
	t.Helper()
	snaps := cluster.NewSnapshotter(js, leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 2, Dir: t.TempDir()})
	leader.change(3)
	leader.publish()
	info, err := snaps.Write(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return info
}

func streamInfo(t *testing.T, js jetstream.JetStream) *jetstream.StreamInfo {
	t.Helper()
	s, err := js.Stream(context.Background(), "EV")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info
}

// wantPosition fails unless st's position is the stream's last sequence,
// of the stream as it is now.
func wantPosition(t *testing.T, js jetstream.JetStream, st *store.Store, what string) {
	t.Helper()
	info := streamInfo(t, js)
	pos, _, err := st.StreamPosition(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	created, err := st.StreamIncarnation(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if pos != info.State.LastSeq || !created.Equal(info.Created) {
		t.Errorf("%s's position: %d of the stream created at %s; want %d of the stream created at %s",
			what, pos, created, info.State.LastSeq, info.Created)
	}
}

// TestSnapshot_OfAStreamCreatedAgainIsFollowedFromItsStart: a follower
// restores a snapshot of the stream before it was lost, and follows the
// new stream from its first message. Before, it followed it after the
// snapshot's sequence, passing over the new stream's first messages: the
// leader's changes published there were in neither.
func TestSnapshot_OfAStreamCreatedAgainIsFollowedFromItsStart(t *testing.T) {
	js, leader := newStreamLeader(t)
	info := snapshotThenRecreate(t, js, leader)
	f, follower := restoringFollower(t, js)
	if got := f.Restored(); got.Name != info.Name || got.After != 0 {
		t.Errorf("restored %s, following after %d; want %s, after 0", got.Name, got.After, info.Name)
	}
	if err := sameRows(t, leader.st, follower); err != nil {
		t.Error(err)
	}
	wantPosition(t, js, follower, "the follower")
	wantPosition(t, js, leader.st, "the leader")
}

// TestSnapshot_OfAnOlderSyncdBeforeTheStreamIsFollowedFromItsStart: a
// snapshot that does not say which stream its sequence counts (an older
// syncd's) but was created before the stream was is of an earlier one;
// so is one created by a clock ahead of the server's, within a minute
// after the stream by that clock.
func TestSnapshot_OfAnOlderSyncdBeforeTheStreamIsFollowedFromItsStart(t *testing.T) {
	for _, ahead := range []time.Duration{0, 2 * time.Second} {
		t.Run(fmt.Sprintf("its clock %s ahead", ahead), func(t *testing.T) { testOlderSyncdSnapshot(t, ahead) })
	}
}

func testOlderSyncdSnapshot(t *testing.T, ahead time.Duration) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	info := snapshotThenRecreate(t, js, leader)
	obj, err := js.ObjectStore(ctx, "snaps")
	if err != nil {
		t.Fatal(err)
	}
	oi, err := obj.GetInfo(ctx, info.Name)
	if err != nil {
		t.Fatal(err)
	}
	md := maps.Clone(oi.Metadata)
	delete(md, "stream_created")
	if ahead > 0 {
		md["created"] = streamInfo(t, js).Created.Add(ahead).Format(time.RFC3339Nano)
	}
	if err := obj.UpdateMeta(ctx, info.Name, jetstream.ObjectMeta{Name: info.Name, Description: oi.Description,
		Metadata: md, Opts: oi.Opts}); err != nil {
		t.Fatal(err)
	}
	f, follower := restoringFollower(t, js)
	if got := f.Restored(); got.Name != info.Name || !got.StreamCreated.IsZero() || got.After != 0 {
		t.Errorf("restored %s (stream %s), following after %d; want %s, unrecorded, after 0",
			got.Name, got.StreamCreated, got.After, info.Name)
	}
	if err := sameRows(t, leader.st, follower); err != nil {
		t.Error(err)
	}
}

// TestFollower_ARestoredMirrorRestartsOnAStreamCreatedAgain: a follower
// restored from a snapshot, stopped while the stream is lost and created
// again, follows the new stream from its first message when it starts
// again. Before, its consumer, lost with the stream, was made again
// after the snapshot's sequence, which counted the old stream.
func TestFollower_ARestoredMirrorRestartsOnAStreamCreatedAgain(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	info := writeSnapshot(t, js, leader)
	f, follower := restoringFollower(t, js)
	if got := f.Restored(); got.Name != info.Name || got.After != info.Seq {
		t.Fatalf("restored %s, following after %d; want %s, after %d", got.Name, got.After, info.Name, info.Seq)
	}
	testutil.RecreateStream(t, js, evConfig)
	leader.change(6)
	leader.publish()
	f2 := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond, SnapshotBucket: "snaps", SnapshotDir: t.TempDir()})
	if err := f2.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if f2.Restored().Name != "" {
		t.Error("a mirror that is not empty was restored again")
	}
	if err := sameRows(t, leader.st, follower); err != nil {
		t.Error(err)
	}
	wantPosition(t, js, follower, "the follower")
	// It stays a restored mirror, which holds what the stream does not
	// carry: it leads without a repair.
	if restored, err := follower.Restored(ctx); err != nil || !restored {
		t.Errorf("Restored = %v, %v; want true", restored, err)
	}
	if err := f2.Complete(ctx); err != nil || f2.RepairDue() {
		t.Errorf("Complete: %v, repair due %v; want neither", err, f2.RepairDue())
	}
}

// unanswered is a JetStream whose stream lookups time out while fail is
// above 0, as a stream just lost electing its leader answers nothing: a
// real server cannot be made to do that on demand.
type unanswered struct {
	jetstream.JetStream
	fail atomic.Int32
}

func (u *unanswered) Stream(ctx context.Context, name string) (jetstream.Stream, error) {
	if u.fail.Add(-1) >= 0 {
		return nil, fmt.Errorf("stream %s: %w", name, context.DeadlineExceeded)
	}
	return u.JetStream.Stream(ctx, name)
}

// TestFollower_MakesNoConsumerWhileTheStreamIsNotKnown: a follower that
// cannot look the stream up does not make its consumer at its position,
// which may be another stream's: it fails, and follows the stream from
// its start once it knows it is another. Before, it made the consumer
// after the restored snapshot's sequence of the old stream.
func TestFollower_MakesNoConsumerWhileTheStreamIsNotKnown(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	writeSnapshot(t, js, leader)
	_, follower := restoringFollower(t, js)
	testutil.RecreateStream(t, js, evConfig)
	leader.change(6)
	leader.publish()
	u := &unanswered{JetStream: js}
	u.fail.Store(2) // the gap check's lookup, then the one before the consumer
	f := cluster.NewFollower(u, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond, SnapshotBucket: "snaps", SnapshotDir: t.TempDir()})
	if err := f.CatchUp(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("catch-up while the stream does not answer: %v, want its timeout", err)
	}
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sameRows(t, leader.st, follower); err != nil {
		t.Error(err)
	}
}

// TestFollower_AMirrorStartedOnAStreamCreatedAgainComparesItsCheckpoints:
// a follower stopped while the stream is lost and created again records
// its position in the new stream, and compares the checkpoints there
// (the leader's first after its audit published the log there again).
// Before, its position stayed the old stream's: a checkpoint of the new
// stream below it was passed over as telling nothing.
func TestFollower_AMirrorStartedOnAStreamCreatedAgainComparesItsCheckpoints(t *testing.T) {
	ctx := context.Background()
	js := mustJetStream(t)
	pcfg := evConfig
	pcfg.Source = "test"
	if err := publish.EnsureStream(ctx, js, pcfg); err != nil {
		t.Fatal(err)
	}
	leader := newLeaderMirror(t, js, pcfg)
	relay := publish.NewRelay(js, leader.st, pcfg, publish.WithCheckpoints(leader.st, time.Hour, "a"))
	leader.change(6)
	if err := relay.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	_, follower := caughtUpFollower(t, js, leader)
	testutil.RecreateStream(t, js, evConfig)
	leader.change(2)
	if err := relay.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	// The leader's audit publishes the log into the new stream again;
	// until then the leader publishes no checkpoint.
	au := publish.NewAuditor(js, leader.st, relay.Message, publish.AuditConfig{Stream: "EV", SubjectPrefix: "ev",
		Every: time.Hour, Now: func() time.Time { return time.Now().Add(3 * time.Minute) }})
	testutil.WaitFor(t, 10*time.Second, "the leader's checkpoint after the refill", func() bool {
		if _, err := au.Audit(ctx); err != nil {
			t.Fatal(err)
		}
		_, why, err := relay.PublishCheckpoint(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return why == ""
	})
	f2 := cluster.NewFollower(js, follower, gapFollowerConfig)
	if err := f2.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	res, ok := f2.LastCheckpoint()
	if !ok || res.Diff != "" {
		t.Fatalf("last checkpoint compared: %+v, %v; want a match", res, ok)
	}
	if err := sameRows(t, leader.st, follower); err != nil {
		t.Error(err)
	}
	wantPosition(t, js, follower, "the follower")
}
