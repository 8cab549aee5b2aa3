package store_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestSnapshot_BackupRestore: a mirror restored from a leader's backup
// holds the leader's tables row for row, with every event published and the
// stream sequence recorded; the leader's events, delivered again from the
// stream, change nothing, and a later one applies on top. Both ways of
// restoring: an empty mirror adopts the snapshot's file, one with rows of
// its own gets the snapshot's tables copied over them.
func TestSnapshot_BackupRestore(t *testing.T) {
	t.Run("verified, into an empty mirror: adopted", func(t *testing.T) { testBackupRestore(t, store.Verified, false) })
	t.Run("unverified, into an empty mirror: copied", func(t *testing.T) { testBackupRestore(t, store.Unverified, false) })
	t.Run("verified, over a mirror's own rows: copied", func(t *testing.T) { testBackupRestore(t, store.Verified, true) })
}

func testBackupRestore(t *testing.T, from store.Provenance, own bool) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{InitialEvents: "snapshot"})
	repo := nginx()
	mustApplyRepos(t, leader, repo)
	need := mustApplyTags(t, leader, repo, tag("g1/r1/t1", "latest", 1), tag("g1/r1/t2", "1.0", 2))
	for _, ref := range need {
		if _, err := leader.ApplyHistory(
			ctx,
			ref,
			[]store.HistoryRecord{{Time: ts("2025-02-01T00:00:00Z"), Digest: digest(1)}},
			true,
		); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := leader.ApplyAdvisories(
		ctx,
		[]store.Advisory{{UID: "a1", AdvisoryID: "CVE-1", ArtifactName: "nginx", UpdateTime: clk.Now()}},
	); err != nil {
		t.Fatal(err)
	}
	// The leader's failures come too, none held back beyond
	// MaxFailureBackoff.
	failing := store.Failure{Kind: store.FailureTag, UID: "g1/r1/t2", Path: "nginx", Tag: "1.0", Error: "403"}
	if _, err := leader.RecordFailure(ctx, failing, doubling); err != nil {
		t.Fatal(err)
	}
	far := store.Failure{Kind: store.FailureRepo, UID: "g1/r9", Path: "far", Error: "404"}
	if _, err := leader.RecordFailure(ctx, far, func(int) time.Duration { return 1000 * time.Hour }); err != nil {
		t.Fatal(err)
	}
	evs, err := leader.Unpublished(ctx, 0, 1000)
	if err != nil || len(evs) < 3 {
		t.Fatalf("leader's events: %d, %v", len(evs), err)
	}
	// Half published: the snapshot holds events the stream does not yet.
	half := make([]int64, 0, len(evs)/2)
	for _, e := range evs[:len(evs)/2] {
		half = append(half, e.Seq)
	}
	if err := leader.MarkPublished(ctx, half); err != nil {
		t.Fatal(err)
	}

	path := backupTo(t, leader)
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("backup file: %v, %v; want mode 0600", fi, err)
	}
	follower, _ := openTemp(t, clk, true, store.Options{})
	if empty, err := follower.Empty(ctx); err != nil || !empty {
		t.Fatalf("fresh mirror empty=%v, %v", empty, err)
	}
	if own {
		mustApplyRepos(t, follower, store.Repo{UID: "g1/r7", Name: "its-own", CreateTime: clk.Now()})
	}
	adopted := store.Adoptions()
	if err := follower.Restore(ctx, path, store.SnapshotAt{Seq: 42}, from); err != nil {
		t.Fatal(err)
	}
	if wantAdopted := from == store.Verified && !own; (store.Adoptions() > adopted) != wantAdopted {
		t.Errorf("adopted the snapshot: %v, want %v", store.Adoptions() > adopted, wantAdopted)
	}
	want, err := leader.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, err := follower.ReplicaDigest(ctx); err != nil || got.Diff(want) != "" {
		t.Errorf("the restored mirror's replica digest differs from the leader's in %q (%v)", got.Diff(want), err)
	}
	for _, check := range []string{
		`PRAGMA integrity_check`,
		`SELECT count(*) || ' foreign key violations' FROM pragma_foreign_key_check`,
	} {
		if got := queryString(t, follower.Reader(), check); got != "ok" && got != "0 foreign key violations" {
			t.Errorf("%s of the restored mirror: %s", check, got)
		}
	}
	if empty, err := follower.Empty(ctx); err != nil || empty {
		t.Fatalf("restored mirror empty=%v, %v", empty, err)
	}
	if seq, err := follower.SnapshotSeq(ctx); err != nil || seq != 42 {
		t.Errorf("snapshot seq = %d, %v; want 42", seq, err)
	}
	if in, err := follower.InBaseline(ctx); err != nil || in {
		t.Errorf("restored mirror in baseline = %v, %v; want past it, as the leader", in, err)
	}
	// The restore drops the tables' indexes while it copies and builds them
	// again: the schema is the leader's, every index included.
	schema := `SELECT group_concat(type || ' ' || name || ': ' || COALESCE(sql, ''), char(10)) FROM (SELECT * FROM sqlite_schema ORDER BY type, name)`
	if l, f := queryString(t, leader.Reader(), schema), queryString(t, follower.Reader(), schema); l != f ||
		!strings.Contains(f, "index tag_history_digest") {
		t.Errorf("restored schema differs from the leader's:\n leader:   %s\n follower: %s", l, f)
	}
	for _, table := range store.SnapshotTables() {
		if table == "event_publishes" {
			continue
		}
		q := `SELECT group_concat(r, char(10)) FROM (SELECT ` + rowText(t, leader, table) + ` AS r FROM ` + table + ` t`
		if table == "crawl_failures" {
			q += ` WHERE uid != '` + far.UID + `'`
		}
		q += `)`
		if l, f := queryString(t, leader.Reader(), q), queryString(t, follower.Reader(), q); l != f {
			t.Errorf("table %s differs:\n leader:   %s\n follower: %s", table, l, f)
		}
	}
	if got, want := queryString(t, follower.Reader(), `SELECT next_attempt_time FROM crawl_failures WHERE uid = ?`,
		far.UID), store.FormatTime(clk.Now().Add(store.MaxFailureBackoff)); got != want {
		t.Errorf("a failure held back 1000h came back held until %s, want %s", got, want)
	}
	if n := queryInt(t, follower.Reader(), `SELECT count(*) FROM events WHERE published_time IS NULL`); n != 0 {
		t.Errorf("%d restored events unpublished, want 0", n)
	}
	stream := make([]store.StreamEvent, len(evs))
	for i, e := range evs {
		stream[i] = store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data}
	}
	if n, err := follower.ApplyStreamEvents(ctx, stream); err != nil || n != 0 {
		t.Errorf("the snapshot's events again from the stream: applied %d (%v), want 0", n, err)
	}
	// A move after the snapshot lands at the leader's position.
	moved := tag("g1/r1/t1", "latest", 3)
	moved.UpdateTime = ts("2025-03-01T00:00:00Z")
	need = mustApplyTags(t, leader, repo, moved)
	if _, err := leader.ApplyHistory(
		ctx,
		need[0],
		[]store.HistoryRecord{
			{Time: ts("2025-02-01T00:00:00Z"), Digest: digest(1)},
			{Time: moved.UpdateTime, Digest: digest(3)},
		},
		true,
	); err != nil {
		t.Fatal(err)
	}
	later, err := leader.Unpublished(ctx, evs[len(evs)-1].Seq, 1000)
	if err != nil {
		t.Fatal(err)
	}
	stream = stream[:0]
	for _, e := range later {
		stream = append(stream, store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data})
	}
	if n, err := follower.ApplyStreamEvents(ctx, stream); err != nil || n != len(stream) || n == 0 {
		t.Fatalf("later events: applied %d of %d (%v)", n, len(stream), err)
	}
	q := `SELECT group_concat(tag_uid || ':' || seq || ':' || digest, ',') FROM (SELECT * FROM tag_history ORDER BY tag_uid, seq)`
	if l, f := queryString(t, leader.Reader(), q), queryString(t, follower.Reader(), q); l != f {
		t.Errorf("history after a later move:\n leader:   %s\n follower: %s", l, f)
	}
}

// rowText is an expression rendering every column of a row of table but
// those that say when the row was written here.
func rowText(t *testing.T, st *store.Store, table string) string {
	var cols []string
	for _, c := range columns(t, st.Reader(), table) {
		if c != "first_seen_time" && (c != "created_time" || table != "event_log") {
			cols = append(cols, "quote(t."+c+")")
		}
	}
	return strings.Join(cols, " || '|' || ")
}

// TestSnapshot_Tables: every table of the schema is either copied by a
// restore or deliberately left out.
func TestSnapshot_Tables(t *testing.T) {
	st, _ := openTemp(t, newClock(), false, store.Options{})
	rows, err := st.Reader().Query(`SELECT name FROM sqlite_schema WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	for rows.Next() {
		var name string
		rows.Scan(&name)
		if !slices.Contains(store.SnapshotTables(), name) && !slices.Contains(store.SnapshotSkippedTables, name) {
			t.Errorf("table %s: add it to the tables a restore copies, or to those it leaves out (store/snapshot.go)", name)
		}
	}
}

// TestSnapshot_BetweenAPushedMoveAndTheListing is the late follower's
// divergence (TestCluster_Failover, 2 runs in 5): a push makes the leader
// read a tag's history, which records the move and its tag.moved event,
// before the next listing shows the tag's new digest. A snapshot written in
// between holds the event in its log; a follower that restores it skips
// the event when the stream delivers it, so the tag row the snapshot holds
// is all it will ever have. That row must already be the moved one.
func TestSnapshot_BetweenAPushedMoveAndTheListing(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{InitialEvents: "snapshot"})
	repo := nginx()
	mustApplyRepos(t, leader, repo)
	t1 := tag("g1/r1/t1", "latest", 1)
	need := mustApplyTags(t, leader, repo, t1)
	first := store.HistoryRecord{Time: t1.UpdateTime, Digest: digest(1)}
	if _, err := leader.ApplyHistory(ctx, need[0], []store.HistoryRecord{first}, true); err != nil {
		t.Fatal(err)
	}
	// The push: the tag's history read before any listing saw the move.
	pushed := need[0]
	pushed.UpdateTime = ts("2025-03-01T00:00:00Z")
	pushed.Bookmark = store.Bookmark{LastTime: first.Time, LastCount: 1, Count: 1}
	move := store.HistoryRecord{Time: pushed.UpdateTime, Digest: digest(2)}
	if n, err := leader.ApplyHistory(ctx, pushed, []store.HistoryRecord{first, move}, true); err != nil || n != 1 {
		t.Fatalf("pushed history read: %d events, %v; want the move", n, err)
	}
	evs, err := leader.Unpublished(ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	seqs := make([]int64, len(evs))
	stream := make([]store.StreamEvent, len(evs))
	for i, e := range evs {
		seqs[i] = e.Seq
		stream[i] = store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data}
	}
	if err := leader.MarkPublished(ctx, seqs); err != nil {
		t.Fatal(err)
	}
	path := backupTo(t, leader)
	// The listing catches up with the push after the snapshot.
	t1.Digest, t1.UpdateTime = digest(2), move.Time
	mustApplyTags(t, leader, repo, t1)

	follower, _ := openTemp(t, clk, true, store.Options{})
	if err := follower.Restore(ctx, path, store.SnapshotAt{Seq: uint64(len(evs))}, store.Unverified); err != nil {
		t.Fatal(err)
	}
	if _, err := follower.ApplyStreamEvents(ctx, stream); err != nil {
		t.Fatal(err)
	}
	q := `SELECT digest FROM tags WHERE uid = 'g1/r1/t1'`
	if l, f := queryString(t, leader.Reader(), q), queryString(t, follower.Reader(), q); l != f || f != digest(2) {
		t.Errorf("tag's digest after the stream: leader %s, follower %s; want both %s", l, f, digest(2))
	}
}

// TestSnapshot_RestoreOverUnpublishedEvents: a restarted ex-leader's mirror
// holds events it recorded and never published, under seqs the snapshot's
// events hold too. Dropping them empties the outbox and keeps them in the
// log; a restore over them (dropped or not) gives the snapshot's log with
// nothing to publish.
func TestSnapshot_RestoreOverUnpublishedEvents(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{InitialEvents: "snapshot"})
	repo := nginx()
	mustApplyRepos(t, leader, repo)
	mustApplyTags(t, leader, repo, tag("g1/r1/t1", "latest", 1))
	path := backupTo(t, leader)

	for _, drop := range []bool{false, true} {
		ex, _ := openTemp(t, clk, false, store.Options{InitialEvents: "snapshot"})
		mustApplyRepos(t, ex, repo)
		testutil.AnnounceTags(t, ex, repo, []store.Tag{tag("g1/r1/t1", "latest", 7), tag("g1/r1/t2", "1.0", 8)})
		n, _, err := ex.UnpublishedCount(ctx)
		if err != nil || n < 3 {
			t.Fatalf("ex-leader's unpublished events: %d, %v", n, err)
		}
		if drop {
			got, first, last, err := ex.DropUnpublished(ctx)
			if err != nil || got != n || first != 1 || last != int64(n) {
				t.Fatalf("DropUnpublished = %d, %d..%d, %v; want %d, 1..%d", got, first, last, err, n, n)
			}
			if left, _, _ := ex.UnpublishedCount(ctx); left != 0 {
				t.Fatalf("%d events unpublished after the drop", left)
			}
			if logged := queryInt(t, ex.Reader(), `SELECT count(*) FROM event_log`); logged != n {
				t.Fatalf("event_log holds %d events after the drop, want the %d dropped", logged, n)
			}
		}
		// Its own unpublished events that the snapshot holds unpublished
		// too stay to publish (see Restore); the rest of the snapshot's
		// count as published.
		own := `SELECT group_concat(id, ',') FROM (SELECT e.id FROM event_log e JOIN outbox o ON o.seq = e.seq ORDER BY e.id)`
		leaderOwn := map[string]bool{}
		for id := range strings.SplitSeq(queryString(t, leader.Reader(), own), ",") {
			leaderOwn[id] = true
		}
		var shared []string
		for id := range strings.SplitSeq(queryString(t, ex.Reader(), own), ",") {
			if id != "" && leaderOwn[id] {
				shared = append(shared, id)
			}
		}
		if err := ex.Restore(ctx, path, store.SnapshotAt{Seq: 9}, store.Unverified); err != nil {
			t.Fatalf("restore over unpublished events (dropped first: %v): %v", drop, err)
		}
		if drop && len(shared) != 0 {
			t.Fatalf("after the drop the ex-leader still holds unpublished %v", shared)
		}
		if got := queryString(t, ex.Reader(), own); got != strings.Join(shared, ",") {
			t.Errorf("dropped first %v: unpublished after the restore %q, want %q (its own the snapshot holds unpublished too)",
				drop, got, strings.Join(shared, ","))
		}
		q := `SELECT group_concat(id || ':' || type, ',') FROM (SELECT * FROM event_log ORDER BY seq)`
		if l, f := queryString(t, leader.Reader(), q), queryString(t, ex.Reader(), q); l != f {
			t.Errorf("dropped first %v: event log after the restore:\n leader: %s\n ex:     %s", drop, l, f)
		}
		q = `SELECT group_concat(uid || ':' || digest, ',') FROM (SELECT * FROM tags ORDER BY uid)`
		if l, f := queryString(t, leader.Reader(), q), queryString(t, ex.Reader(), q); l != f {
			t.Errorf("dropped first %v: tags after the restore:\n leader: %s\n ex:     %s", drop, l, f)
		}
	}
}

// TestSnapshot_LeaderRestoringItsOwnKeepsItsUnpublishedEvents: a leader
// that restores a snapshot it wrote itself (a replica that regained the
// lease after a partition and found its mirror unproven) keeps to publish
// the events it had not published, which the snapshot holds unpublished
// too; marked published, they never reached the stream. A fresh mirror
// restoring the same snapshot has nothing to publish.
func TestSnapshot_LeaderRestoringItsOwnKeepsItsUnpublishedEvents(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{InitialEvents: "snapshot"})
	repo := nginx()
	mustApplyRepos(t, leader, repo)
	testutil.AnnounceTags(t, leader, repo, []store.Tag{tag("g1/r1/t1", "latest", 1), tag("g1/r1/t2", "1.0", 2)})
	evs, err := leader.Unpublished(ctx, 0, 1000)
	if err != nil || len(evs) < 3 {
		t.Fatalf("leader's events: %d, %v", len(evs), err)
	}
	if err := leader.MarkPublished(ctx, []int64{evs[0].Seq}); err != nil {
		t.Fatal(err)
	}
	path := backupTo(t, leader)
	unpublished := `SELECT group_concat(id, ',') FROM (SELECT e.id FROM event_log e JOIN outbox o ON o.seq = e.seq ORDER BY e.seq)`
	want := queryString(t, leader.Reader(), unpublished)
	if err := leader.Restore(ctx, path, store.SnapshotAt{Seq: 5}, store.Unverified); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, leader.Reader(), unpublished); got != want || got == "" {
		t.Errorf("the leader's unpublished events after restoring its own snapshot: %q, want %q", got, want)
	}
	fresh, _ := openTemp(t, clk, true, store.Options{})
	if err := fresh.Restore(ctx, path, store.SnapshotAt{Seq: 5}, store.Verified); err != nil {
		t.Fatal(err)
	}
	if got := queryString(t, fresh.Reader(), unpublished); got != "" {
		t.Errorf("a fresh mirror's unpublished events after the restore: %q, want none", got)
	}
}

// TestSnapshot_AdoptKeepsTheMirrorsOwn: an empty mirror that adopts a
// verified snapshot's file keeps what a restore leaves alone (its meta,
// its subscriptions: none, its file header's free fields) and none of the bytes
// of the leader's own rows; it has the leader's replica digest, a sound
// file, and its readers, open before, see the snapshot after; the file
// holds it all once reopened, with no write-ahead log left the size of
// the snapshot. A restore canceled before the copy commits leaves the
// mirror as it was, empty; one canceled once it committed finishes.
func TestSnapshot_AdoptKeepsTheMirrorsOwn(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{InitialEvents: "snapshot"})
	tags := leaderWithTags(t, leader, 200)
	if err := leader.SetMeta(ctx, "owner", "leader"); err != nil {
		t.Fatal(err)
	}
	const secret = "https://leader-only.example/sink"
	sub := store.Subscription{UID: "sub-leader", GroupUID: "g1", Sink: secret}
	if err := leader.UpsertSubscription(ctx, sub); err != nil {
		t.Fatal(err)
	}
	path := backupTo(t, leader)
	// Header fields no migration sets, as a planted file would have them.
	setPragmas(t, path, "user_version = 77", "application_id = 5", "default_cache_size = 777777")
	want, err := leader.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}

	follower, fpath := openTemp(t, clk, true, store.Options{})
	if err := follower.SetMeta(ctx, "owner", "follower"); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, follower.Reader(), `SELECT count(*) FROM tags`); n != 0 {
		t.Fatalf("the empty mirror has %d tags", n)
	}
	// A restore changes the file it adopts: each attempt gets a copy, as
	// each download is one.
	copyOf := func() string {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		p := filepath.Join(t.TempDir(), "copy.db")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}

	// Canceled after the first of many steps.
	cctx, cancel := context.WithCancel(ctx)
	steps := 0
	store.SetAdoptSteps(t, 1, func(bool) { steps++; cancel() })
	err = follower.Restore(cctx, copyOf(), store.SnapshotAt{Seq: 7}, store.Verified)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("canceled restore: %v, want context.Canceled", err)
	}
	if steps != 1 {
		t.Fatalf("the canceled restore took %d steps, want 1", steps)
	}
	if empty, err := follower.Empty(ctx); err != nil || !empty {
		t.Fatalf("after a canceled restore the mirror is empty=%v (%v), want as it was", empty, err)
	}
	if seq, err := follower.SnapshotSeq(ctx); err != nil || seq != 0 {
		t.Fatalf("a canceled restore recorded snapshot seq %d (%v)", seq, err)
	}

	// Canceled as the step that commits returns: the rest is done.
	cctx, cancel = context.WithCancel(ctx)
	defer cancel()
	committed := false
	store.SetAdoptSteps(t, 4, func(c bool) {
		if c {
			committed = true
			cancel()
		}
	})
	adopted := store.Adoptions()
	if err := follower.Restore(cctx, copyOf(), store.SnapshotAt{Seq: 7}, store.Verified); err != nil {
		t.Fatalf("a restore canceled once its copy committed: %v, want it finished", err)
	}
	if !committed || store.Adoptions() != adopted+1 {
		t.Fatalf("committed %v, adoptions %d, want one more than %d", committed, store.Adoptions(), adopted)
	}
	check := func(st *store.Store, when string) {
		t.Helper()
		if got, err := st.ReplicaDigest(ctx); err != nil || got.Diff(want) != "" {
			t.Errorf("%s: replica digest differs from the leader's in %q (%v)", when, got.Diff(want), err)
		}
		if n := queryInt(t, st.Reader(), `SELECT count(*) FROM tags`); n != len(tags) {
			t.Errorf("%s: the readers see %d tags, want %d", when, n, len(tags))
		}
		if v, err := st.Meta(ctx, "owner"); err != nil || v != "follower" {
			t.Errorf("%s: meta owner = %q (%v), want the mirror's own", when, v, err)
		}
		if seq, err := st.SnapshotSeq(ctx); err != nil || seq != 7 {
			t.Errorf("%s: snapshot seq %d (%v), want 7", when, seq, err)
		}
		if subs, err := st.Subscriptions(ctx); err != nil || len(subs) != 0 {
			t.Errorf("%s: subscriptions %+v (%v), want the mirror's own: none", when, subs, err)
		}
		checkAdoptedFile(t, st, when)
	}
	check(follower, "restored")
	if fi, err := os.Stat(fpath + "-wal"); err == nil && fi.Size() > 0 {
		t.Errorf("the write-ahead log holds %d bytes after the restore, want it truncated", fi.Size())
	}
	if err := follower.Close(); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(fpath); err != nil || bytes.Contains(b, []byte(secret)) {
		t.Errorf("the adopted file holds the leader's own subscription's sink (%v)", err)
	}
	reopened := mustOpen(t, fpath, store.Options{Now: clk.Now})
	check(reopened, "reopened")
	if got := queryString(t, reopened.Reader(), `PRAGMA cache_size`); got == "-777777" || got == "777777" {
		t.Errorf("a reader of the adopted file has the planted cache size %s", got)
	}
}

// TestSnapshot_AdoptRefusedWhenTheDigestFails: a snapshot whose rows the
// digest beside the copy cannot read is refused before the copy commits:
// the mirror stays empty, its write-ahead log truncated, and the writer
// free (before, the restore waited for ever on the digest's result, which
// the copy's last step had taken, holding the writer).
func TestSnapshot_AdoptRefusedWhenTheDigestFails(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	leaderWithTags(t, leader, 100)
	path := backupTo(t, leader)
	follower, fpath := openTemp(t, clk, true, store.Options{})
	unreadable := errors.New("unreadable row")
	store.SetAdoptDigestFault(t, unreadable)
	store.SetAdoptSteps(t, 2, nil)
	restored := make(chan error, 1)
	go func() { restored <- follower.Restore(ctx, path, store.SnapshotAt{Seq: 7}, store.Verified) }()
	select {
	case err := <-restored:
		if !errors.Is(err, unreadable) {
			t.Fatalf("restore: %v, want the digest's failure", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the restore did not return within 10 s of a failed digest")
	}
	if empty, err := follower.Empty(ctx); err != nil || !empty {
		t.Fatalf("after a refused restore the mirror is empty=%v (%v), want as it was", empty, err)
	}
	if fi, err := os.Stat(fpath + "-wal"); err == nil && fi.Size() > 0 {
		t.Errorf("the write-ahead log holds %d bytes after the refused copy, want it truncated", fi.Size())
	}
	if err := follower.SetMeta(ctx, "after", "1"); err != nil {
		t.Fatalf("a write after the refused restore: %v", err)
	}
}

// TestSnapshot_AdoptOnlyTheSamePageSize: a verified snapshot whose pages
// are of another size than the mirror's (which SQLite's backup API cannot
// copy into a database in WAL mode) has its tables copied instead.
func TestSnapshot_AdoptOnlyTheSamePageSize(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	mustApplyRepos(t, leader, nginx())
	path := backupTo(t, leader)
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	db.SetMaxOpenConns(1)
	for _, q := range []string{`PRAGMA journal_mode = DELETE`, `PRAGMA page_size = 8192`, `VACUUM`} {
		if _, err := db.Exec(q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	if got := queryString(t, db, `PRAGMA page_size`); got != "8192" {
		t.Fatalf("the snapshot's page size is %s", got)
	}
	db.Close()
	follower, _ := openTemp(t, clk, true, store.Options{})
	adopted := store.Adoptions()
	if err := follower.Restore(ctx, path, store.SnapshotAt{Seq: 3}, store.Verified); err != nil {
		t.Fatal(err)
	}
	if store.Adoptions() != adopted {
		t.Error("adopted a snapshot of 8 KiB pages")
	}
	if got := queryString(t, follower.Reader(), `SELECT group_concat(name) FROM repos`); got != "nginx" {
		t.Errorf("restored repos %q, want nginx", got)
	}
	if got := queryString(t, follower.Reader(), `PRAGMA page_size`); got != "4096" {
		t.Errorf("the mirror's page size is %s after the restore", got)
	}
}

// setPragmas sets pragmas on the database file at path.
func setPragmas(t *testing.T, path string, pragmas ...string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(1)
	for _, p := range pragmas {
		if _, err := db.Exec(`PRAGMA ` + p); err != nil {
			t.Fatalf("PRAGMA %s: %v", p, err)
		}
	}
}

// leaderWithTags gives st the repo nginx with n tags, and returns them.
func leaderWithTags(t *testing.T, st *store.Store, n int) []store.Tag {
	t.Helper()
	repo := nginx()
	mustApplyRepos(t, st, repo)
	tags := make([]store.Tag, 0, n)
	for i := range n {
		tags = append(tags, tag(fmt.Sprintf("g1/r1/t%d", i), fmt.Sprintf("1.%d", i), i))
	}
	mustApplyTags(t, st, repo, tags...)
	return tags
}

// checkAdoptedFile checks what a mirror that took a snapshot's file must
// be: every event published, in WAL mode, sound, and with the header
// fields of a mirror of its own.
func checkAdoptedFile(t *testing.T, st *store.Store, when string) {
	t.Helper()
	for q, want := range map[string]string{
		`SELECT count(*) FROM events WHERE published_time IS NULL`: "0",
		`PRAGMA journal_mode`:                           "wal",
		`PRAGMA integrity_check`:                        "ok",
		`SELECT count(*) FROM pragma_foreign_key_check`: "0",
		`SELECT user_version || ' ' || application_id FROM pragma_user_version, pragma_application_id`: "0 0",
	} {
		if got := queryString(t, st.Reader(), q); got != want {
			t.Errorf("%s: %s = %s, want %s", when, q, got, want)
		}
	}
}
