package cluster_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

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
	js, leader, relay, _ := newSnapshottingLeader(t, "leader")
	checkpoint := func() uint64 { return publishCheckpoint(t, relay) }
	leader.change(2)
	first := checkpoint()

	f, fst, path := runFollower(t, js)
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
	forgeTag(t, path)
	leader.change(1)
	second := checkpoint()
	testutil.WaitFor(
		t,
		10*time.Second,
		"the follower to find the divergence and repair it",
		func() bool { return f.Repairs() == 1 },
	)

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

// TestFollower_JoinedBeforeTheFirstSnapshot: a follower that starts before
// any snapshot exists builds what the stream carries, which here lacks the
// history the baseline read (a mirror whose baseline predates the
// replication records of reads made during it); the first checkpoint tells
// it, and it ends with the leader's whole history, from before and after
// the baseline, once the first snapshot exists.
func TestFollower_JoinedBeforeTheFirstSnapshot(t *testing.T) {
	ctx := context.Background()
	js := mustJetStream(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	lst, lpath, repo, old, recs := baselineRead(t, js)
	relay := publish.NewRelay(js, lst, pcfg, publish.WithCheckpoints(lst, time.Hour, "leader"))
	t0 := recs[0].Time
	if err := lst.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	// The baseline's reads, as an older syncd recorded them: without
	// replication records.
	db, err := sql.Open("sqlite", "file:"+lpath+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`DELETE FROM outbox WHERE seq IN (SELECT seq FROM event_log WHERE type = 'history.recorded')`,
		`DELETE FROM event_log WHERE type = 'history.recorded'`,
	} {
		if res, err := db.Exec(q); err != nil {
			t.Fatal(err)
		} else if n, _ := res.RowsAffected(); n != 1 {
			t.Fatalf("%s: %d rows, want the baseline's one", q, n)
		}
	}
	db.Close()
	if err := relay.Flush(ctx); err != nil {
		t.Fatal(err)
	}

	f, fst, _ := runFollower(t, js)
	testutil.WaitFor(t, 10*time.Second, "the follower to apply the baseline's events", func() bool {
		return queryCount(t, fst, `SELECT count(*) FROM tags`) == 1
	})
	if n := queryCount(t, fst, `SELECT count(*) FROM tag_history`); n != 0 {
		t.Fatalf("the follower has %d history rows before any snapshot; the stream carries none of the baseline's", n)
	}

	// After the baseline: the first snapshot, a new tag (its first record
	// is no move) and a move of the old one; then checkpoints.
	snaps := cluster.NewSnapshotter(
		js,
		lst,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 2, Dir: t.TempDir()},
	)
	if _, err := snaps.Write(ctx, nil); err != nil {
		t.Fatal(err)
	}
	fresh := store.Tag{
		UID:        "g/r1/new",
		Name:       "2.0",
		Digest:     "sha256:n",
		CreateTime: t0.Add(3 * time.Hour),
		UpdateTime: t0.Add(3 * time.Hour),
	}
	old.Digest, old.UpdateTime = "sha256:d", t0.Add(4*time.Hour)
	need, _, err := lst.ApplyTags(ctx, repo, []store.Tag{old, fresh})
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range need {
		r := []store.HistoryRecord{{Time: fresh.CreateTime, Digest: "sha256:n"}}
		if ref.UID == old.UID {
			r = append(recs, store.HistoryRecord{Time: old.UpdateTime, Digest: "sha256:d"})
		}
		if _, err := lst.ApplyHistory(ctx, ref, r, true); err != nil {
			t.Fatal(err)
		}
	}
	checkpoint := func() uint64 { return publishCheckpoint(t, relay) }
	checkpoint()
	testutil.WaitFor(
		t,
		10*time.Second,
		"the follower to repair its partial mirror",
		func() bool { return f.Repairs() == 1 },
	)
	fresh.Deprecated, fresh.UpdateTime = true, t0.Add(5*time.Hour)
	if _, _, err := lst.ApplyTags(ctx, repo, []store.Tag{old, fresh}); err != nil {
		t.Fatal(err)
	}
	last := checkpoint()
	testutil.WaitFor(t, 10*time.Second, "the follower to match the checkpoint", func() bool {
		r, ok := f.LastCheckpoint()
		return ok && r.Seq >= last && r.Diff == "" && !f.Diverged()
	})
	if n := queryCount(t, fst, `SELECT count(*) FROM tag_history`); n != 5 {
		t.Fatalf("the follower holds %d history rows, want 5", n)
	}
	sameHistory(t, lst, fst)
}

// TestFollower_GetsTheBaselinesReadsFromTheStream: the histories a leader
// reads during its baseline (in the places its listings leave free) reach a
// follower on the stream, as history.recorded, without a snapshot.
func TestFollower_GetsTheBaselinesReadsFromTheStream(t *testing.T) {
	ctx := context.Background()
	js := mustJetStream(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	lst, _, _, _, recs := baselineRead(t, js)
	relay := publish.NewRelay(js, lst, pcfg)
	if err := lst.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	if err := relay.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	_, fst, _ := runFollower(t, js)
	testutil.WaitFor(t, 10*time.Second, "the follower to hold the baseline's history", func() bool {
		return queryCount(t, fst, `SELECT count(*) FROM tag_history`) == len(recs)
	})
	sameHistory(t, lst, fst)
}

// baselineRead is a leader's mirror (file path lpath, stream EV made) in
// its baseline, with one repo and one tag whose three history records the
// baseline read.
func baselineRead(t *testing.T, js jetstream.JetStream) (lst *store.Store, lpath string, repo store.Repo,
	old store.Tag, recs []store.HistoryRecord,
) {
	t.Helper()
	ctx := context.Background()
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	if err := publish.EnsureStream(ctx, js, pcfg); err != nil {
		t.Fatal(err)
	}
	lpath = filepath.Join(t.TempDir(), "leader.db")
	lst, err := store.Open(ctx, lpath, store.Options{InitialEvents: "snapshot"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lst.Close() })
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	repo = store.Repo{UID: "g/r1", Name: "nginx", CreateTime: t0, UpdateTime: t0}
	if _, err := lst.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	old = store.Tag{UID: "g/r1/old", Name: "1.0", Digest: "sha256:c", CreateTime: t0, UpdateTime: t0.Add(2 * time.Hour)}
	need, _, err := lst.ApplyTags(ctx, repo, []store.Tag{old})
	if err != nil {
		t.Fatal(err)
	}
	recs = []store.HistoryRecord{
		{Time: t0, Digest: "sha256:a"},
		{Time: t0.Add(time.Hour), Digest: "sha256:b"},
		{Time: t0.Add(2 * time.Hour), Digest: "sha256:c"},
	}
	if _, err := lst.ApplyHistory(ctx, need[0], recs, true); err != nil {
		t.Fatal(err)
	}
	return lst, lpath, repo, old, recs
}

// sameHistory fails t unless the two mirrors hold the same tag_history.
func sameHistory(t *testing.T, leader, follower *store.Store) {
	t.Helper()
	q := `SELECT group_concat(tag_uid || ':' || seq || ':' || update_time || ':' || digest, ',') FROM (SELECT * FROM tag_history ORDER BY tag_uid, seq)`
	var l, fo string
	leader.Reader().QueryRow(q).Scan(&l)
	follower.Reader().QueryRow(q).Scan(&fo)
	if l != fo {
		t.Fatalf("history:\n leader:   %s\n follower: %s", l, fo)
	}
}

func queryCount(t *testing.T, st *store.Store, q string) int {
	t.Helper()
	var n int
	if err := st.Reader().QueryRow(q).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// runFollower runs a follower of stream EV into a new mirror, restoring
// from bucket snaps when it is empty, until the test ends.
func runFollower(t *testing.T, js jetstream.JetStream) (*cluster.Follower, *store.Store, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "follower.db")
	fst, err := store.Open(context.Background(), path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fst.Close() })
	f := cluster.NewFollower(
		js,
		fst,
		cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f", MaxWait: 100 * time.Millisecond,
			Meta: fst, SnapshotBucket: "snaps", Restore: cluster.RestoreWhenEmpty, SnapshotDir: t.TempDir()},
	)
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() { stop(); <-done })
	return f, fst, path
}

// publishCheckpoint publishes what the relay's outbox holds, then a
// checkpoint, and returns its stream sequence.
func publishCheckpoint(t *testing.T, relay *publish.Relay) uint64 {
	t.Helper()
	if err := relay.Flush(context.Background()); err != nil {
		t.Fatal(err)
	}
	seq, why, err := relay.PublishCheckpoint(context.Background())
	if err != nil || why != "" {
		t.Fatalf("checkpoint: %v %s", err, why)
	}
	return seq
}

// newSnapshottingLeader is newStreamLeader's stream and leader, with a
// relay that publishes checkpoints naming leaderName and a snapshotter
// keeping two snapshots in the bucket "snaps"; the leader has recorded
// three tags, published them and written a snapshot of them.
func newSnapshottingLeader(
	t *testing.T,
	leaderName string,
) (jetstream.JetStream, *leaderMirror, *publish.Relay, *cluster.Snapshotter) {
	t.Helper()
	js, leader := newStreamLeader(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	relay := publish.NewRelay(js, leader.st, pcfg, publish.WithCheckpoints(leader.st, time.Hour, leaderName))
	snaps := cluster.NewSnapshotter(
		js,
		leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 2, Dir: t.TempDir()},
	)
	leader.change(3)
	leader.publish()
	if _, err := snaps.Write(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	return js, leader, relay, snaps
}

// forgeTag changes a tag of the mirror at path behind its store's back, as
// a damaged file or a careless analyst would.
func forgeTag(t *testing.T, path string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if _, err := db.Exec(`UPDATE tags SET digest = 'sha256:forged' WHERE uid = 'g/r1/t1'`); err != nil {
		t.Fatal(err)
	}
}

// TestFollower_ABaselineReadOfATagListedAgain: during the leader's
// baseline (announced as a snapshot) a tag is listed, its history read is
// asked for, and a second listing shows it moved (which announces nothing)
// before the read is stored. The leader keeps the second listing's digest,
// with the move's record if the read found it (the listed digest just
// after the listing the read was asked for). The follower, which has only
// the first listing's tag.created and the read's history.recorded, must
// end with the same tag and history: the mirrors' digests equal.
func TestFollower_ABaselineReadOfATagListedAgain(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tag := store.Tag{UID: "g/r1/t", Name: "1.0", Digest: "sha256:a", CreateTime: t0, UpdateTime: t0.Add(time.Hour)}
	moved := tag
	moved.Digest, moved.UpdateTime = "sha256:b", t0.Add(2*time.Hour)
	read := []store.HistoryRecord{{Time: t0, Digest: "sha256:0"}, {Time: tag.UpdateTime, Digest: tag.Digest}}
	t.Run("TheMoveAmongTheRecords", func(t *testing.T) {
		recs := append(read, store.HistoryRecord{Time: moved.UpdateTime, Digest: moved.Digest})
		baselineReadOfATagListedAgain(t, tag, moved, recs)
	})
	t.Run("TheMoveAfterTheRecords", func(t *testing.T) {
		baselineReadOfATagListedAgain(t, tag, moved, read)
	})
}

func baselineReadOfATagListedAgain(t *testing.T, tag, moved store.Tag, recs []store.HistoryRecord) {
	ctx := context.Background()
	js := mustJetStream(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	if err := publish.EnsureStream(ctx, js, pcfg); err != nil {
		t.Fatal(err)
	}
	lst, err := store.Open(ctx, filepath.Join(t.TempDir(), "leader.db"), store.Options{InitialEvents: "snapshot"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lst.Close() })
	repo := store.Repo{UID: "g/r1", Name: "nginx", CreateTime: tag.CreateTime, UpdateTime: tag.CreateTime}
	if _, err := lst.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	need, _, err := lst.ApplyTags(ctx, repo, []store.Tag{tag})
	if err != nil || len(need) != 1 {
		t.Fatalf("first listing: %v, %d to read", err, len(need))
	}
	if _, _, err := lst.ApplyTags(ctx, repo, []store.Tag{moved}); err != nil {
		t.Fatal(err)
	}
	if _, err := lst.ApplyHistory(ctx, need[0], recs, true); err != nil {
		t.Fatal(err)
	}
	if err := lst.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	if err := publish.NewRelay(js, lst, pcfg).Flush(ctx); err != nil {
		t.Fatal(err)
	}
	_, fst, _ := runFollower(t, js)
	testutil.WaitFor(t, 10*time.Second, "the follower to hold the read's records", func() bool {
		const q = `SELECT count(*) FROM tag_history`
		return queryCount(t, fst, q) == queryCount(t, lst, q)
	})
	sameHistory(t, lst, fst)
	var digest string
	if err := fst.Reader().QueryRow(`SELECT digest FROM tags WHERE uid = ?`, tag.UID).Scan(&digest); err != nil {
		t.Fatal(err)
	}
	if digest != moved.Digest {
		t.Errorf("the follower's tag points at %s, want %s as the leader's second listing showed", digest, moved.Digest)
	}
	ld, lerr := lst.ReplicaDigest(ctx)
	fd, ferr := fst.ReplicaDigest(ctx)
	if lerr != nil || ferr != nil {
		t.Fatal(lerr, ferr)
	}
	if diff := ld.Diff(fd); diff != "" {
		t.Errorf("the mirrors' digests differ in %s", diff)
	}
}
