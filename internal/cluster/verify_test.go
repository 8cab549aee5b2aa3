package cluster_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestFollower_RepairsADivergence: a row of a following mirror changed
// behind its back (an UPDATE on the file) is found at the next checkpoint:
// the follower reports the divergence, naming the table, repairs its
// mirror from the newest snapshot and the stream after it, and matches the
// leader's checkpoints again, with the leader's rows.
func TestFollower_RepairsADivergence(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	relay := publish.NewRelay(js, leader.st, pcfg, publish.WithCheckpoints(leader.st, time.Hour, "leader"))
	checkpoint := func() uint64 {
		t.Helper()
		if err := relay.Flush(ctx); err != nil {
			t.Fatal(err)
		}
		seq, why, err := relay.PublishCheckpoint(ctx)
		if err != nil || why != "" {
			t.Fatalf("checkpoint: %v %s", err, why)
		}
		return seq
	}
	snaps := cluster.NewSnapshotter(js, leader.st, cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 2, Dir: t.TempDir()})
	leader.change(3)
	leader.publish()
	if _, err := snaps.Write(ctx, nil); err != nil {
		t.Fatal(err)
	}
	leader.change(2)
	first := checkpoint()

	path := filepath.Join(t.TempDir(), "follower.db")
	fst, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fst.Close() })
	f := cluster.NewFollower(js, fst, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f", MaxWait: 100 * time.Millisecond,
		Meta: fst, SnapshotBucket: "snaps", Restore: cluster.RestoreWhenEmpty, SnapshotDir: t.TempDir()})
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	waitCheckpoint := func(seq uint64, diff string) {
		t.Helper()
		testutil.WaitFor(t, 10*time.Second, "the follower to compare the checkpoint", func() bool {
			r, ok := f.LastCheckpoint()
			return ok && r.Seq >= seq && (r.Diff == "") == (diff == "")
		})
	}
	waitCheckpoint(first, "")
	testutil.WaitFor(t, 10*time.Second, "the follower to be ready", func() bool { return f.Err() == nil })
	if f.Diverged() {
		t.Fatal("diverged after a matching checkpoint")
	}

	// Behind the follower's back.
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE tags SET digest = 'sha256:forged' WHERE uid = 'g/r1/t1'`); err != nil {
		t.Fatal(err)
	}
	leader.change(1)
	second := checkpoint()
	testutil.WaitFor(t, 10*time.Second, "the follower to find the divergence and repair it", func() bool { return f.Repairs() == 1 })

	leader.change(1)
	third := checkpoint()
	waitCheckpoint(third, "")
	testutil.WaitFor(t, 10*time.Second, "the divergence to clear", func() bool { return !f.Diverged() && f.Err() == nil })
	if got, want := mirrorRows(t, fst), mirrorRows(t, leader.st); got != want {
		t.Fatalf("repaired mirror:\n%s\nleader's:\n%s", got, want)
	}
	ld, _ := leader.st.ReplicaDigest(ctx)
	fd, _ := fst.ReplicaDigest(ctx)
	if diff := fd.Diff(ld); diff != "" {
		t.Fatalf("digests differ after the repair in %s", diff)
	}
	if got := metaValue(t, fst, "checkpoint_result"); got != "match" {
		t.Errorf("checkpoint_result = %q, want match", got)
	}
	if f.Repairs() != 1 {
		t.Errorf("repairs = %d, want 1", f.Repairs())
	}
	t.Logf("checkpoints at %d, %d (diverged), %d; repairs %d", first, second, third, f.Repairs())
}

func metaValue(t *testing.T, st *store.Store, key string) string {
	t.Helper()
	v, err := st.Meta(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	return v
}
