package cluster_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// leaderMirror is a leader's mirror whose events a relay publishes.
type leaderMirror struct {
	t     *testing.T
	st    *store.Store
	relay *publish.Relay
	repo  store.Repo
	n     int
}

func newLeaderMirror(t *testing.T, js jetstream.JetStream, pcfg publish.Config) *leaderMirror {
	st, err := store.Open(
		context.Background(),
		filepath.Join(t.TempDir(), "leader.db"),
		store.Options{InitialEvents: "snapshot"},
	)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	l := &leaderMirror{
		t:     t,
		st:    st,
		relay: publish.NewRelay(js, st, pcfg),
		repo:  store.Repo{UID: "g/r1", Name: "nginx", CreateTime: now, UpdateTime: now},
	}
	if _, err := st.ApplyRepos(context.Background(), []store.Repo{l.repo}); err != nil {
		t.Fatal(err)
	}
	if err := st.EndBaseline(context.Background()); err != nil {
		t.Fatal(err)
	}
	return l
}

// newStreamLeader starts JetStream with the stream EV and a leader's mirror
// publishing to it.
func newStreamLeader(t *testing.T) (jetstream.JetStream, *leaderMirror) {
	js := mustJetStream(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	if err := publish.EnsureStream(context.Background(), js, pcfg); err != nil {
		t.Fatal(err)
	}
	return js, newLeaderMirror(t, js, pcfg)
}

// change records n new tags.
func (l *leaderMirror) change(n int) {
	l.t.Helper()
	var tags []store.Tag
	for range n {
		l.n++
		at := time.Date(2026, 1, 2, 0, 0, l.n, 0, time.UTC)
		tags = append(
			tags,
			store.Tag{
				UID:        fmt.Sprintf("g/r1/t%d", l.n),
				Name:       fmt.Sprintf("v%d", l.n),
				Digest:     fmt.Sprintf("sha256:%064d", l.n),
				CreateTime: at,
				UpdateTime: at,
			},
		)
	}
	testutil.AnnounceTags(l.t, l.st, l.repo, tags)
}

func (l *leaderMirror) publish() {
	l.t.Helper()
	if err := l.relay.Flush(context.Background()); err != nil {
		l.t.Fatal(err)
	}
}

// mirrorRows renders the resources of a mirror, one line each.
func mirrorRows(t *testing.T, st *store.Store) string {
	t.Helper()
	var b strings.Builder
	for _, q := range []string{`SELECT uid || ' ' || name || ' ' || (deleted_time IS NULL) FROM repos ORDER BY uid`,
		`SELECT uid || ' ' || digest || ' ' || deprecated || ' ' || (deleted_time IS NULL) FROM tags ORDER BY uid`,
		`SELECT id FROM event_log ORDER BY id`} {
		rows, err := st.Reader().Query(q)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var s string
			rows.Scan(&s)
			b.WriteString(s + "\n")
		}
		rows.Close()
	}
	return b.String()
}

// TestSnapshot_FollowerAfterStreamDroppedEvents: a follower that starts
// after the stream dropped its oldest events restores the newest snapshot,
// follows the stream after the sequence it covers, and ends with the
// leader's mirror, including the events the leader had committed but not
// published when it copied the mirror (published after the copy, before
// the snapshot is put). Older snapshots beyond keep are deleted.
func TestSnapshot_FollowerAfterStreamDroppedEvents(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	snaps := cluster.NewSnapshotter(
		js,
		markingSource{SnapshotSource: leader.st, newer: leader.publish},
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 2, Dir: t.TempDir()},
	)
	var info cluster.SnapshotInfo
	for range 3 {
		leader.change(3)
		leader.publish()
		leader.change(2) // committed, not yet published
		var err error
		if info, err = snaps.Write(ctx, nil); err != nil {
			t.Fatal(err)
		}
		leader.publish()
	}
	stream, err := js.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	si, _ := stream.Info(ctx)
	// The last change's two tags are two messages each (tag.created,
	// history.recorded).
	if got, want := info.Seq, si.State.LastSeq-4; got != want {
		t.Errorf("the snapshot covers stream seq %d, want %d: the last published before it", got, want)
	}
	if info.Bytes <= 0 || info.RawBytes <= info.Bytes {
		t.Errorf("snapshot sizes: %d compressed of %d", info.Bytes, info.RawBytes)
	}
	// Prune by running the snapshotter: it writes none (the newest is
	// fresh) but keeps two.
	obj, err := js.ObjectStore(ctx, "snaps")
	if err != nil {
		t.Fatal(err)
	}
	list, _ := obj.List(ctx)
	if len(list) != 3 {
		t.Fatalf("%d snapshots before pruning, want 3", len(list))
	}
	leader.change(4)
	leader.publish()
	// The stream drops everything up to the newest snapshot's sequence.
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(info.Seq+1)); err != nil {
		t.Fatal(err)
	}

	f, follower := restoringFollower(t, js)
	if got := f.Restored(); got.Name != info.Name || got.Seq != info.Seq {
		t.Errorf("restored %+v, want the newest snapshot %+v", got, info)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Errorf("follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
	// Restarted with a mirror that is not empty, a follower resumes: the
	// durable consumer's start stays the same.
	leader.change(1)
	leader.publish()
	f2 := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond, SnapshotBucket: "snaps", SnapshotDir: t.TempDir()})
	if err := f2.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if f2.Restored().Name != "" {
		t.Error("a mirror that is not empty was restored again")
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Errorf("after a restart, follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}

	// The snapshotter keeps two; its Run finds the newest and writes none.
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- snaps.Run(rctx) }()
	testutil.Eventually(t, 5*time.Second, func() error {
		lctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		list, err := obj.List(lctx)
		if err != nil || len(list) != 2 {
			return fmt.Errorf("%d snapshots (%v), want 2", len(list), err)
		}
		return nil
	})
	cancel()
	<-done
}

// failingPut is a bucket whose Put reads a little of the snapshot and
// fails, as a Put a shutdown cancels does: a real bucket cannot be made to
// stop halfway on demand.
type failingPut struct {
	jetstream.ObjectStore
}

var errPutStopped = errors.New("put stopped")

func (failingPut) Put(_ context.Context, _ jetstream.ObjectMeta, r io.Reader) (*jetstream.ObjectInfo, error) {
	if _, err := io.ReadFull(r, make([]byte, 64)); err != nil {
		return nil, err
	}
	return nil, errPutStopped
}

// TestSnapshot_WriteStoppedEarly: when the upload stops halfway, Write
// returns its error and leaves no file behind. (It also waits for the
// compressor to stop reading the copy before it closes it: make
// cluster-test's race detector once caught the compressor reading the
// copy Write had closed at a shutdown, an interleaving this test cannot
// force.)
func TestSnapshot_WriteStoppedEarly(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(500)
	leader.publish()
	dir := t.TempDir()
	snaps := cluster.NewSnapshotter(
		js,
		leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 2, Dir: dir},
	)
	for range 5 {
		if _, err := snaps.Write(ctx, failingPut{}); !errors.Is(err, errPutStopped) {
			t.Fatalf("Write = %v, want the Put's error", err)
		}
		if left, err := os.ReadDir(dir); err != nil || len(left) != 0 {
			t.Fatalf("left behind in the snapshot directory: %v (%v)", left, err)
		}
	}
}

// TestSnapshotter_NeverHoldsMoreThanKeep: a leader's snapshotter writing
// every few milliseconds with keep 2 makes room before each write, so
// the bucket never holds more than two snapshots. A subscriber to the
// bucket's object records sees every put and delete in the order the
// leader made them, and counts the snapshots live after each. Deleting
// the oldest only after the write, the bucket held three for as long as
// that deletion's listing took (up to its 10 s deadline, when the listing
// missed its last entry), and TestCluster_ThreeNodes, counting at one
// instant, found three.
func TestSnapshotter_NeverHoldsMoreThanKeep(t *testing.T) {
	js, leader := newStreamLeader(t)
	leader.publish()
	records, err := js.Conn().SubscribeSync("$O.snaps.M.>")
	if err != nil {
		t.Fatal(err)
	}
	if err := js.Conn().Flush(); err != nil {
		t.Fatal(err)
	}
	snaps := cluster.NewSnapshotter(
		js,
		leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: 10 * time.Millisecond, Keep: 2, Dir: t.TempDir()},
	)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- snaps.Run(ctx) }()
	live, written, most := map[string]bool{}, 0, 0
	deadline := time.Now().Add(30 * time.Second)
	for written < 6 {
		m, err := records.NextMsg(time.Until(deadline))
		if err != nil {
			t.Fatalf("%d snapshots written, then: %v", written, err)
		}
		var rec jetstream.ObjectInfo
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			t.Fatalf("object record %s: %v", m.Subject, err)
		}
		if rec.Deleted {
			delete(live, rec.Name)
		} else {
			live[rec.Name] = true
			written++
		}
		most = max(most, len(live))
	}
	stop()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if most > 2 {
		t.Errorf("the bucket held %d snapshots at once, want at most 2 ([snapshot] keep)", most)
	}
}

// deleteFailsOnce is a JetStream whose first DeleteConsumer fails, as one
// lost in a partition does: a real server cannot be made to fail it on
// demand.
type deleteFailsOnce struct {
	jetstream.JetStream
	failed atomic.Bool
}

func (d *deleteFailsOnce) DeleteConsumer(ctx context.Context, stream, consumer string) error {
	if d.failed.CompareAndSwap(false, true) {
		return errors.New("delete consumer: no response from stream")
	}
	return d.JetStream.DeleteConsumer(ctx, stream, consumer)
}

// TestSnapshot_RestoreRecordedBeforeTheConsumerIsDeleted: a follower
// records its restore as soon as it committed. When deleting the old
// consumer after it failed, the restored mirror (no longer empty, so not
// restored again) said it had never been restored, and a consumer of its
// name that started elsewhere was then in the way (replaced when created).
func TestSnapshot_RestoreRecordedBeforeTheConsumerIsDeleted(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	snaps := cluster.NewSnapshotter(
		js,
		leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 2, Dir: t.TempDir()},
	)
	leader.change(3)
	leader.publish()
	info, err := snaps.Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	leader.change(2)
	leader.publish()
	// A consumer of the follower's name, left from before, starting at
	// the stream's first message.
	if _, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{Durable: "f1",
		Description: "syncd follower mirror", AckPolicy: jetstream.AckExplicitPolicy}); err != nil {
		t.Fatal(err)
	}
	follower, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer follower.Close()
	f := cluster.NewFollower(&deleteFailsOnce{JetStream: js}, follower, cluster.FollowerConfig{Stream: "EV",
		SubjectPrefix: "ev", Consumer: "f1", MaxWait: 200 * time.Millisecond, SnapshotBucket: "snaps",
		SnapshotDir: t.TempDir()})
	if err := f.CatchUp(ctx); err == nil {
		t.Fatal("the first catch-up succeeded; want the failed deletion's error")
	}
	if got := f.Restored(); got.Name != info.Name {
		t.Fatalf("after the failed deletion the follower says it restored %q, want %q", got.Name, info.Name)
	}
	if err := f.CatchUp(ctx); err != nil {
		t.Fatalf("the second catch-up: %v", err)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Errorf("follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
}

// TestSnapshot_NotPutWithUnpublishedEvents: a snapshot whose copy holds
// events its leader has not published is not put until they are: a
// replica restoring it counts them as published, so had the leader died
// first they would never reach the stream (TestCluster_ThreeNodes lost two
// moves that way in a failover). Unpublished past PublishWait, the write
// fails (ErrUnpublished) and the bucket holds nothing; published meanwhile,
// the snapshot is put, and a follower restoring it finds every one of its
// events on the stream.
func TestSnapshot_NotPutWithUnpublishedEvents(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.publish()
	leader.change(2) // committed, not yet published
	cfg := cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 2, Dir: t.TempDir(),
		PublishWait: 200 * time.Millisecond}
	if _, err := cluster.NewSnapshotter(js, leader.st, cfg).Write(ctx, nil); !errors.Is(err, cluster.ErrUnpublished) {
		t.Fatalf("Write with unpublished events = %v, want ErrUnpublished", err)
	}
	if obj, err := js.ObjectStore(ctx, "snaps"); err == nil {
		if list, _ := obj.List(ctx); len(list) != 0 {
			t.Fatalf("the bucket holds %d snapshots, want none", len(list))
		}
	}
	cfg.PublishWait = 30 * time.Second
	info, err := cluster.NewSnapshotter(js, markingSource{SnapshotSource: leader.st, newer: leader.publish}, cfg).
		Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	f, follower := restoringFollower(t, js)
	if got := f.Restored(); got.Name != info.Name {
		t.Fatalf("restored %q, want %s", got.Name, info.Name)
	}
	onStream := map[string]bool{}
	stream, err := js.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	si, _ := stream.Info(ctx)
	for seq := si.State.FirstSeq; seq <= si.State.LastSeq; seq++ {
		if m, err := stream.GetMsg(ctx, seq); err == nil {
			onStream[m.Header.Get(jetstream.MsgIDHeader)] = true
		}
	}
	rows, err := follower.Reader().QueryContext(ctx, `SELECT id FROM event_log`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var id string
		if err := rows.Scan(&id); err != nil {
			t.Fatal(err)
		}
		n++
		if !onStream[id] {
			t.Errorf("event %s is in the restored mirror, counted published, and not on the stream", id)
		}
	}
	if n == 0 {
		t.Fatal("the restored mirror holds no event")
	}
}

// restoringFollower is a follower, consumer f1, of stream EV into a new
// mirror, restoring it from bucket snaps; caught up.
func restoringFollower(t *testing.T, js jetstream.JetStream) (*cluster.Follower, *store.Store) {
	t.Helper()
	follower, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	f := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond, SnapshotBucket: "snaps", SnapshotDir: t.TempDir()})
	if err := f.CatchUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f, follower
}

// TestSnapshot_ATruncatedSnapshotIsPassedOver: the newest snapshot in the
// bucket has its object's description but none of its chunks (lost, or
// purged: nothing of it can ever be read). A follower with an empty
// mirror passes it over for the older genuine one, as it does a damaged
// one, instead of failing on it at every attempt, never restoring the
// older one nor following the stream.
func TestSnapshot_ATruncatedSnapshotIsPassedOver(t *testing.T) {
	defer cluster.SetDownloadStall(500 * time.Millisecond)()
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(3)
	leader.publish()
	snaps := cluster.NewSnapshotter(js, leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 10, Dir: t.TempDir()})
	genuine, err := snaps.Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	leader.change(2)
	leader.publish()
	newer, err := snaps.Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	// The newer one's chunks are gone; its description stays.
	obj, err := js.ObjectStore(ctx, "snaps")
	if err != nil {
		t.Fatal(err)
	}
	oi, err := obj.GetInfo(ctx, newer.Name)
	if err != nil {
		t.Fatal(err)
	}
	objStream, err := js.Stream(ctx, "OBJ_snaps")
	if err != nil {
		t.Fatal(err)
	}
	if err := objStream.Purge(ctx, jetstream.WithPurgeSubject("$O.snaps.C."+oi.NUID)); err != nil {
		t.Fatal(err)
	}

	follower := openFollowerStore(t, store.Options{})
	var rej reasonCounts
	f := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond, SnapshotBucket: "snaps", SnapshotDir: t.TempDir(), OnReject: rej.add})
	// A standby's catch-up, or Run, tries again and again; a few attempts
	// show whether one ever gets past the truncated snapshot.
	var errs []error
	for range 3 {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := f.CatchUp(cctx)
		cancel()
		if err == nil {
			break
		}
		errs = append(errs, err)
	}
	if len(errs) == 3 {
		t.Fatalf("every catch-up failed on the truncated snapshot: %v", errs)
	}
	if got := f.Restored().Name; got != genuine.Name {
		t.Errorf("restored %q, want the older genuine %q", got, genuine.Name)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Errorf("the follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
	if got := rej.get(); got[cluster.RejectSnapshot] != 1 {
		t.Errorf("reasonCounts %v, want one snapshot", got)
	}
}
