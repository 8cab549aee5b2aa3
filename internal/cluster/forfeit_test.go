package cluster_test

import (
	"context"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestReplica_ExLeaderForfeitsItsUnpublishedEvents: a replica restarts
// after it led and recorded changes it never published, and another
// replica leads now. It drops those events (the new leader records the
// changes again), repairs its mirror from the newest snapshot, and ends
// with the leader's mirror row for row and a matching checkpoint, without
// leading. Before, it kept its own records, never compared a checkpoint
// (its outbox was not empty), and stayed different from the leader's.
func TestReplica_ExLeaderForfeitsItsUnpublishedEvents(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	js, leader, relay, _ := newSnapshottingLeader(t, "b")
	leaseB, _ := runLease(t, js, "b")
	testutil.WaitFor(t, 5*ttl, "b to lead", leaseB.IsLeader)

	// a's mirror: what it recorded itself while it led, never published;
	// tag t1 at another digest than the one b recorded.
	ex, err := store.Open(ctx, filepath.Join(t.TempDir(), "a.db"), store.Options{InitialEvents: "snapshot"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ex.Close() })
	if _, err := ex.ApplyRepos(ctx, []store.Repo{leader.repo}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 3, 0, 0, 0, 0, time.UTC)
	if _, _, err := ex.ApplyTags(
		ctx,
		leader.repo,
		[]store.Tag{{UID: "g/r1/t1", Name: "v1", Digest: "sha256:aa11", CreateTime: at, UpdateTime: at}},
	); err != nil {
		t.Fatal(err)
	}
	if n, _, err := ex.UnpublishedCount(ctx); err != nil || n < 2 {
		t.Fatalf("a's unpublished events: %d, %v", n, err)
	}

	leaseA, err := cluster.NewLease(ctx, js, cluster.LeaseConfig{Bucket: "lease", Key: "leader", Node: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	f := cluster.NewFollower(
		js,
		ex,
		cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "a", MaxWait: 100 * time.Millisecond,
			Meta: ex, SnapshotBucket: "snaps", Restore: cluster.RestoreWhenEmpty, SnapshotDir: t.TempDir()},
	)
	var led atomic.Bool
	r := &cluster.Replica{Lease: leaseA, Follower: f, Meta: ex,
		Lead: func(ctx context.Context) error { led.Store(true); <-ctx.Done(); return nil }}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	testutil.WaitFor(
		t,
		10*time.Second,
		"a to repair its mirror from the snapshot",
		func() bool { return f.Repairs() == 1 },
	)
	leader.change(2)
	cp := publishCheckpoint(t, relay)
	testutil.WaitFor(t, 10*time.Second, "a to compare b's checkpoint", func() bool {
		res, ok := f.LastCheckpoint()
		return ok && res.Seq >= cp
	})
	if res, _ := f.LastCheckpoint(); res.Diff != "" {
		t.Fatalf("a's mirror differs from b's checkpoint at %d in table %s", res.Seq, res.Diff)
	}
	if got, want := mirrorRows(t, ex), mirrorRows(t, leader.st); got != want {
		t.Fatalf("a's mirror:\n%s\nb's:\n%s", got, want)
	}
	if n, _, err := ex.UnpublishedCount(ctx); err != nil || n != 0 {
		t.Errorf("a's unpublished events after the repair: %d, %v; want 0", n, err)
	}
	if led.Load() || r.Role() != cluster.RoleStandby {
		t.Errorf("a led (%v) or is %s while b holds the lease", led.Load(), r.Role())
	}
}
