package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestApplyStreamEvents_FollowerEqualsLeader: a follower that applies the
// leader's events holds the same repos, tags and advisories, and applying
// them a second time (a redelivery) changes nothing.
func TestApplyStreamEvents_FollowerEqualsLeader(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	follower, _ := openTemp(t, clk, false, store.Options{})

	repo := store.Repo{UID: "org1/r1", Name: "nginx", Description: "web", CreateTime: clk.Now(), UpdateTime: clk.Now()}
	if _, err := leader.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	t0 := clk.Now()
	tag := store.Tag{UID: "org1/r1/t1", Name: "latest", Digest: d("a"), CreateTime: t0, UpdateTime: t0}
	need, _, err := leader.ApplyTags(ctx, repo, []store.Tag{tag})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leader.ApplyHistory(ctx, need[0], []store.HistoryRecord{{Time: t0, Digest: d("a")}}, true); err != nil {
		t.Fatal(err)
	}
	// Two moves and a deprecation, then an advisory and a deleted tag.
	t1, t2 := t0.Add(time.Second), t0.Add(2*time.Second)
	tag.Digest, tag.UpdateTime, tag.Deprecated = d("c"), t2, true
	need, _, err = leader.ApplyTags(
		ctx,
		repo,
		[]store.Tag{tag, {UID: "org1/r1/t2", Name: "old", Digest: d("e"), CreateTime: t0, UpdateTime: t0}},
	)
	if err != nil {
		t.Fatal(err)
	}
	for _, ref := range need {
		recs := []store.HistoryRecord{{Time: t0, Digest: d("e")}}
		if ref.UID == tag.UID {
			recs = []store.HistoryRecord{{Time: t0, Digest: d("a")}, {Time: t1, Digest: d("b")}, {Time: t2, Digest: d("c")}}
		}
		if _, err := leader.ApplyHistory(ctx, ref, recs, true); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := leader.ApplyAdvisories(
		ctx,
		[]store.Advisory{{UID: "a1", AdvisoryID: "CVE-1", ArtifactName: "nginx", UpdateTime: t1}},
	); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.MarkTagsDeleted(ctx, []string{"org1/r1/t2"}); err != nil {
		t.Fatal(err)
	}

	evs, err := leader.Unpublished(ctx, 0, 1000)
	if err != nil {
		t.Fatal(err)
	}
	stream := make([]store.StreamEvent, len(evs))
	for i, e := range evs {
		stream[i] = store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data}
	}
	n, err := follower.ApplyStreamEvents(ctx, stream)
	if err != nil {
		t.Fatal(err)
	}
	if n != len(stream) {
		t.Fatalf("applied %d of %d events", n, len(stream))
	}
	again, err := follower.ApplyStreamEvents(ctx, stream)
	if err != nil || again != 0 {
		t.Fatalf("redelivery applied %d events (%v), want 0", again, err)
	}
	for _, q := range []string{
		`SELECT group_concat(uid || ':' || name || ':' || description || ':' || (deleted_time IS NULL), ',') FROM (SELECT * FROM repos ORDER BY uid)`,
		`SELECT group_concat(uid || ':' || digest || ':' || deprecated || ':' || (deleted_time IS NULL), ',') FROM (SELECT * FROM tags ORDER BY uid)`,
		`SELECT group_concat(uid || ':' || advisory_id || ':' || artifact_name, ',') FROM (SELECT * FROM advisories ORDER BY uid)`,
		`SELECT group_concat(id, ',') FROM (SELECT id FROM events ORDER BY seq)`,
	} {
		if l, f := queryString(t, leader.Reader(), q), queryString(t, follower.Reader(), q); l != f {
			t.Errorf("%s\n leader:   %s\n follower: %s", q, l, f)
		}
	}
	// The follower has the moves the stream carried, in order.
	if got := queryString(
		t,
		follower.Reader(),
		`SELECT group_concat(digest, ',') FROM (SELECT digest FROM tag_history WHERE tag_uid = 'org1/r1/t1' AND seq > 0 ORDER BY seq)`,
	); got != d(
		"b",
	)+","+d(
		"c",
	) {
		t.Errorf("follower's moves of t1 = %s", got)
	}
	if n := queryInt(t, follower.Reader(), `SELECT count(*) FROM events WHERE published_time IS NULL`); n != 0 {
		t.Errorf("%d followed events left unpublished in the follower's outbox", n)
	}
	// The whole history, the records no move announced included (each
	// tag's first, carried by history.recorded): the replicas' digests are
	// equal.
	q := `SELECT group_concat(tag_uid || ':' || seq || ':' || update_time || ':' || digest, ',') FROM (SELECT * FROM tag_history ORDER BY tag_uid, seq)`
	if l, f := queryString(t, leader.Reader(), q), queryString(t, follower.Reader(), q); l != f {
		t.Errorf("history:\n leader:   %s\n follower: %s", l, f)
	}
	if recs := replicationRecords(t, leader); len(recs) != 2 {
		t.Errorf("leader recorded %d history.recorded events, want 2 (each tag's first record)", len(recs))
	}
	ld, err := leader.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := follower.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if diff := fd.Diff(ld); diff != "" {
		t.Errorf("follower's digest differs from the leader's in %s:\n leader:   %v\n follower: %v", diff, ld, fd)
	}
}

// TestFollow_RecordedHistoryIsRead: the histories the leader's backfill
// read reach a follower in history.recorded records, and the follower
// holds them as read, as the leader does: a follower that becomes the
// leader has no history pending, and its first crawl reads none of them
// again. Before, the follower left them unread (history_update_time
// unset), and a promoted standby read every such history once more.
func TestFollow_RecordedHistoryIsRead(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, true, store.Options{InitialEvents: "snapshot"})
	repo := nginx()
	mustApplyRepos(t, leader, repo)
	mustApplyTags(t, leader, repo, tag("g1/r1/t1", "latest", 1), tag("g1/r1/t2", "1.0", 2))
	if err := leader.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	refs, err := leader.BackfillNext(ctx, 10, func(string) bool { return false })
	if err != nil || len(refs) != 2 {
		t.Fatalf("backfill: %+v, %v", refs, err)
	}
	for i, ref := range refs {
		recs := []store.HistoryRecord{{Time: ts("2025-01-15T00:00:00Z"), Digest: digest(10 + i)},
			{Time: ref.UpdateTime, Digest: digest(i + 1)}}
		if _, err := leader.ApplyHistory(ctx, ref, recs, true); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(replicationRecords(t, leader)); n != 2 {
		t.Fatalf("%d history.recorded records, want 2", n)
	}
	follower, _ := openTemp(t, clk, false, store.Options{})
	if _, err := follower.ApplyStreamEvents(ctx, stream(t, leader)); err != nil {
		t.Fatal(err)
	}
	for name, st := range map[string]*store.Store{"leader": leader, "follower": follower} {
		pending, err := st.PendingHistories(ctx, "g1")
		if err != nil {
			t.Fatal(err)
		}
		if len(pending) != 0 {
			t.Errorf("%s: histories pending %+v, want none", name, pending)
		}
	}
}

// TestApplyStreamEvents_MarkedPublishedWhenStored: a follower marks the
// events it applies published when the stream stored them (the batch's
// earliest), not when it applied them, which for a standby catching up
// can be hours later: the stream audit of a replica that leads reads the
// stream from an event's publication time, and found nothing of an event
// marked later than its message.
func TestApplyStreamEvents_MarkedPublishedWhenStored(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	follower, _ := openTemp(t, clk, false, store.Options{})
	at := clk.Now()
	repos := []store.Repo{
		{UID: "org1/r1", Name: "a", CreateTime: at, UpdateTime: at},
		{UID: "org1/r2", Name: "b", CreateTime: at, UpdateTime: at},
		{UID: "org1/r3", Name: "c", CreateTime: at, UpdateTime: at},
	}
	if _, err := leader.ApplyRepos(ctx, repos); err != nil {
		t.Fatal(err)
	}
	evs, err := leader.Unpublished(ctx, 0, 1000)
	if err != nil || len(evs) != 3 {
		t.Fatalf("leader's events = %d (%v), want 3", len(evs), err)
	}
	stored := []time.Time{at.Add(-2 * time.Hour), at.Add(-3 * time.Hour), {}}
	stream := make([]store.StreamEvent, len(evs))
	for i, e := range evs {
		stream[i] = store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data,
			Seq: uint64(i + 1), Stored: stored[i]}
	}
	// The first applied alone, then the others: each batch at its
	// earliest stored time, or now when none is known.
	for _, batch := range [][]store.StreamEvent{stream[:1], stream[1:]} {
		if _, err := follower.ApplyStreamEvents(ctx, batch); err != nil {
			t.Fatal(err)
		}
	}
	got, err := follower.AuditEvents(ctx, 0, 10)
	if err != nil || len(got) != 3 {
		t.Fatalf("follower's events = %d (%v), want 3", len(got), err)
	}
	want := []time.Time{stored[0], stored[1], stored[1]}
	for i, e := range got {
		if !e.Published.Equal(want[i].Truncate(time.Millisecond)) {
			t.Errorf("event %d published %v, want %v (applied at %v)", i, e.Published, want[i], clk.Now())
		}
	}
	// A message stored after the follower's now (a server clock ahead)
	// is published now.
	r4 := store.Repo{UID: "org1/r4", Name: "d", CreateTime: at, UpdateTime: at}
	if _, err := leader.ApplyRepos(ctx, []store.Repo{r4}); err != nil {
		t.Fatal(err)
	}
	more, err := leader.Unpublished(ctx, evs[len(evs)-1].Seq, 10)
	if err != nil || len(more) != 1 {
		t.Fatalf("leader's new events = %d (%v), want 1", len(more), err)
	}
	e := more[0]
	if _, err := follower.ApplyStreamEvents(ctx, []store.StreamEvent{{ID: e.ID, Type: e.Type, Subject: e.Subject,
		Time: e.Time, Data: e.Data, Seq: 4, Stored: clk.Now().Add(time.Hour)}}); err != nil {
		t.Fatal(err)
	}
	if got, err := follower.AuditEvents(ctx, got[2].Seq, 10); err != nil || len(got) != 1 ||
		!got[0].Published.Equal(clk.Now().Truncate(time.Millisecond)) {
		t.Fatalf("event stored in the future published %+v (%v), want now %v", got, err, clk.Now())
	}
}
