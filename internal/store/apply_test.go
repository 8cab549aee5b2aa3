package store_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

func TestApplyRepos(t *testing.T) {
	t.Run("CreatedUpdatedUnchanged", func(t *testing.T) {
		clk := newClock()
		st, _ := openTemp(t, clk, false, store.Options{})
		r := nginx()
		if got, want := mustApplyRepos(t, st, r), 1; got != want {
			t.Fatalf("events after first sight=%d, want %d", got, want)
		}
		if got := mustApplyRepos(t, st, r); got != 0 {
			t.Fatalf("events after unchanged page=%d, want 0", got)
		}
		r2 := r
		r2.Description, r2.UpdateTime = "the web server", ts("2025-03-01T00:00:00Z")
		if got, want := mustApplyRepos(t, st, r2), 1; got != want {
			t.Fatalf("events after update=%d, want %d", got, want)
		}
		// A field upstream changes without bumping updateTime is still an
		// update, with its own event.
		r3 := r2
		r3.ActiveTags = []string{"latest"}
		if got, want := mustApplyRepos(t, st, r3), 1; got != want {
			t.Fatalf("events after activeTags change=%d, want %d", got, want)
		}
		evs := allEvents(t, st)
		if got, want := types(evs), []string{store.RepoCreated, store.RepoUpdated, store.RepoUpdated}; !slices.Equal(
			got,
			want,
		) {
			t.Fatalf("event types=%v, want %v", got, want)
		}
		before, after := payload[store.Repo](t, evs[1])
		if got, want := before.Description, "web server"; got != want {
			t.Fatalf("before.description=%q, want %q", got, want)
		}
		if got, want := after.Description, "the web server"; got != want {
			t.Fatalf("after.description=%q, want %q", got, want)
		}
		if got, want := evs[1].Scope, "nginx"; got != want {
			t.Fatalf("scope=%q, want %q", got, want)
		}
		if got, want := evs[1].Time, r2.UpdateTime; !got.Equal(want) {
			t.Fatalf("update event time=%v, want %v", got, want)
		}
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT active_tags FROM repos WHERE uid = ?`,
			r.UID,
		), `["latest"]`; got != want {
			t.Fatalf("active_tags=%s, want %s", got, want)
		}
	})
	t.Run("PageRepeatingAUID", func(t *testing.T) {
		st, _ := openTemp(t, newClock(), false, store.Options{})
		a, b := nginx(), nginx()
		b.Description = "later copy"
		if got, want := mustApplyRepos(t, st, a, b), 1; got != want {
			t.Fatalf("events=%d, want %d", got, want)
		}
		if got, want := queryString(t, st.Reader(), `SELECT description FROM repos`), "later copy"; got != want {
			t.Fatalf("description=%q, want the last copy %q", got, want)
		}
	})
	t.Run("ManyRowsInOnePage", func(t *testing.T) {
		st, _ := openTemp(t, newClock(), false, store.Options{})
		// More rows than one multi-row statement and one uid lookup carry.
		var repos []store.Repo
		for i := range 1234 {
			repos = append(repos, store.Repo{UID: fmt.Sprintf("g1/r%d", i), Name: fmt.Sprintf("repo-%d", i)})
		}
		if got, want := mustApplyRepos(t, st, repos...), 1234; got != want {
			t.Fatalf("events=%d, want %d", got, want)
		}
		if got := mustApplyRepos(t, st, repos...); got != 0 {
			t.Fatalf("events after reapplying=%d, want 0", got)
		}
		if got, want := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM repos`), 1234; got != want {
			t.Fatalf("repos=%d, want %d", got, want)
		}
	})
}

func TestApplyTags(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	repo := nginx()
	mustApplyRepos(t, st, repo)

	latest := tag("g1/r1/t1", "latest", 1)
	need, n, err := st.ApplyTags(ctx, repo, []store.Tag{latest})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := n, 0; got != want {
		t.Fatalf("events=%d, want %d (a new tag is announced by its first history read)", got, want)
	}
	if got, want := len(need), 1; got != want {
		t.Fatalf("tags needing history=%d, want %d", got, want)
	}
	if n, err := st.ApplyHistory(
		ctx,
		need[0],
		[]store.HistoryRecord{{Time: latest.UpdateTime, Digest: latest.Digest}},
		true,
	); err != nil || n != 1 {
		t.Fatalf("first history read: %d events, %v; want the tag.created", n, err)
	}
	if e := allEvents(t, st); e[len(e)-1].Type != store.TagCreated {
		t.Fatalf("last event %s, want %s", e[len(e)-1].Type, store.TagCreated)
	}

	t.Run("UnchangedNeedsNoHistory", func(t *testing.T) {
		need, n, err := st.ApplyTags(ctx, repo, []store.Tag{latest})
		if err != nil {
			t.Fatal(err)
		}
		if n != 0 || len(need) != 0 {
			t.Fatalf("events=%d need=%d, want 0 and 0", n, len(need))
		}
	})
	t.Run("DigestChangeNeedsHistoryAndIsNoEventYet", func(t *testing.T) {
		moved := latest
		moved.Digest, moved.UpdateTime = digest(2), ts("2025-02-02T00:00:00Z")
		need, n, err := st.ApplyTags(ctx, repo, []store.Tag{moved})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n, 0; got != want {
			t.Fatalf("events=%d, want %d (moves come from history)", got, want)
		}
		if got, want := len(need), 1; got != want {
			t.Fatalf("need=%d, want %d", got, want)
		}
		if got, want := need[0].Bookmark.Count, 1; got != want {
			t.Fatalf("bookmark count=%d, want %d", got, want)
		}
		// The digest moves with the history read, with its event.
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT digest FROM tags WHERE uid = ?`,
			latest.UID,
		), digest(1); got != want {
			t.Fatalf("stored digest before the history read=%s, want %s", got, want)
		}
		recs := []store.HistoryRecord{
			{Time: latest.UpdateTime, Digest: latest.Digest},
			{Time: moved.UpdateTime, Digest: moved.Digest},
		}
		if n, err := st.ApplyHistory(ctx, need[0], recs, true); err != nil || n != 1 {
			t.Fatalf("history read: %d events, %v; want the move", n, err)
		}
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT digest FROM tags WHERE uid = ?`,
			latest.UID,
		), digest(2); got != want {
			t.Fatalf("stored digest after the history read=%s, want %s", got, want)
		}
		latest = moved
	})
	t.Run("Deprecated", func(t *testing.T) {
		dep := latest
		dep.Deprecated, dep.UpdateTime = true, ts("2025-02-03T00:00:00Z")
		_, n, err := st.ApplyTags(ctx, repo, []store.Tag{dep})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n, 1; got != want {
			t.Fatalf("events=%d, want %d", got, want)
		}
		evs := allEvents(t, st)
		e := evs[len(evs)-1]
		if got, want := e.Type, store.TagDeprecated; got != want {
			t.Fatalf("type=%s, want %s", got, want)
		}
		before, after := payload[store.Tag](t, e)
		if before.Deprecated || !after.Deprecated || after.Repo != "nginx" {
			t.Fatalf("before=%+v after=%+v, want deprecated false then true in repo nginx", before, after)
		}
		if got, want := queryInt(
			t,
			st.Reader(),
			`SELECT COUNT(*) FROM deprecated_tags WHERE repo = 'nginx' AND tag = 'latest'`,
		), 1; got != want {
			t.Fatalf("deprecated_tags rows=%d, want %d", got, want)
		}
	})
}

func TestApplyHistory(t *testing.T) {
	ctx := context.Background()
	setup := func(t *testing.T) (*store.Store, store.TagRef) {
		st, _ := openTemp(t, newClock(), false, store.Options{})
		repo := nginx()
		mustApplyRepos(t, st, repo)
		need := mustApplyTags(t, st, repo, tag("g1/r1/t1", "latest", 1))
		return st, need[0]
	}
	t0 := ts("2025-02-01T00:00:00Z")
	rec := func(sec, d int) store.HistoryRecord {
		return store.HistoryRecord{Time: t0.Add(time.Duration(sec) * time.Second), Digest: digest(d)}
	}

	t.Run("TwoMovesBetweenCrawlsAreTwoEventsInOrder", func(t *testing.T) {
		st, ref := setup(t)
		n, err := st.ApplyHistory(ctx, ref, []store.HistoryRecord{rec(0, 1), rec(10, 2), rec(20, 3)}, true)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n, 3; got != want {
			t.Fatalf("events=%d, want %d (the tag's creation and two moves)", got, want)
		}
		evs0 := allEvents(t, st)
		created := evs0[len(evs0)-3]
		if _, after := payload[store.Tag](t, created); created.Type != store.TagCreated || after.Digest != digest(1) {
			t.Fatalf("first event %s with digest %s, want the tag.created at its first record's digest %s",
				created.Type, after.Digest, digest(1))
		}
		evs := allEvents(t, st)
		moves := evs[len(evs)-2:]
		for i, e := range moves {
			if got, want := e.Type, store.TagMoved; got != want {
				t.Fatalf("type=%s, want %s", got, want)
			}
			before, after := payload[store.Tag](t, e)
			if got, want := before.Digest, digest(i+1); got != want {
				t.Fatalf("move %d before=%s, want %s", i, got, want)
			}
			if got, want := after.Digest, digest(i+2); got != want {
				t.Fatalf("move %d after=%s, want %s", i, got, want)
			}
			if got, want := e.Time, rec(10*(i+1), 0).Time; !got.Equal(want) {
				t.Fatalf("move %d time=%v, want the history time %v", i, got, want)
			}
		}
		if got, want := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM tag_moves WHERE tag = 'latest'`), 2; got != want {
			t.Fatalf("tag_moves=%d, want %d", got, want)
		}
	})
	t.Run("OverlappingWindowsWithSharedTimestamps", func(t *testing.T) {
		st, ref := setup(t)
		// Three records share second 10. The first read ends in the middle
		// of them; the next read starts at that time again, so it repeats
		// the first two, and must add only the third and what follows.
		first := []store.HistoryRecord{rec(0, 1), rec(10, 2), rec(10, 3)}
		if _, err := st.ApplyHistory(ctx, ref, first, false); err != nil {
			t.Fatal(err)
		}
		ref.Bookmark = store.Bookmark{LastTime: rec(10, 0).Time, LastCount: 2, Count: 3}
		second := []store.HistoryRecord{rec(10, 2), rec(10, 3), rec(10, 4), rec(20, 5)}
		n, err := st.ApplyHistory(ctx, ref, second, true)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n, 2; got != want {
			t.Fatalf("events from second window=%d, want %d", got, want)
		}
		// The same window read again adds nothing.
		if n, err := st.ApplyHistory(ctx, ref, second, true); err != nil || n != 0 {
			t.Fatalf("reapplying: events=%d err=%v, want 0 and nil", n, err)
		}
		rows, err := st.Reader().Query(`SELECT seq, digest FROM tag_history WHERE tag_uid = ? ORDER BY seq`, ref.UID)
		if err != nil {
			t.Fatal(err)
		}
		defer rows.Close()
		var got []string
		for rows.Next() {
			var seq int
			var d string
			if err := rows.Scan(&seq, &d); err != nil {
				t.Fatal(err)
			}
			if seq != len(got) {
				t.Fatalf("seq=%d at position %d", seq, len(got))
			}
			got = append(got, d)
		}
		if want := []string{digest(1), digest(2), digest(3), digest(4), digest(5)}; !slices.Equal(got, want) {
			t.Fatalf("history=%v, want %v", got, want)
		}
		if got, want := len(allEvents(t, st)), 2+4; got != want {
			t.Fatalf("events=%d, want %d (repo.created, tag.created and four moves)", got, want)
		}
	})
	t.Run("UnknownTag", func(t *testing.T) {
		st, ref := setup(t)
		ref.UID = "g1/r1/missing"
		if _, err := st.ApplyHistory(ctx, ref, []store.HistoryRecord{rec(0, 1)}, true); err == nil {
			t.Fatal("history of an unknown tag was accepted")
		}
		if got := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM tag_history`); got != 0 {
			t.Fatalf("history rows=%d, want 0", got)
		}
	})
}

func TestApplyAdvisories(t *testing.T) {
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	a := store.Advisory{UID: "g1/a1", AdvisoryID: "CGA-1111", ArtifactName: "openssl",
		CreateTime: ts("2025-04-01T00:00:00Z"), UpdateTime: ts("2025-04-01T00:00:00Z")}
	b := store.Advisory{UID: "g1/a2", AdvisoryID: "CGA-2222", ArtifactName: "curl",
		CreateTime: ts("2025-04-01T00:00:00Z"), UpdateTime: ts("2025-04-01T00:00:00Z")}
	apply := func(advs ...store.Advisory) int {
		t.Helper()
		n, err := st.ApplyAdvisories(context.Background(), advs)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	if got, want := apply(a, b), 2; got != want {
		t.Fatalf("events=%d, want %d", got, want)
	}
	if got := apply(a, b); got != 0 {
		t.Fatalf("events after unchanged page=%d, want 0", got)
	}
	a2 := a
	a2.AdvisoryID, a2.UpdateTime = "CGA-1112", ts("2025-04-02T00:00:00Z")
	if got, want := apply(a2), 1; got != want {
		t.Fatalf("events after update=%d, want %d", got, want)
	}
	evs := allEvents(t, st)
	if got, want := types(
		evs,
	), []string{store.AdvisoryCreated, store.AdvisoryCreated, store.AdvisoryUpdated}; !slices.Equal(
		got,
		want,
	) {
		t.Fatalf("types=%v, want %v", got, want)
	}
	if got, want := evs[2].Scope, "openssl"; got != want {
		t.Fatalf("scope=%q, want the artifact %q", got, want)
	}
	before, after := payload[store.Advisory](t, evs[2])
	if before.AdvisoryID != "CGA-1111" || after.AdvisoryID != "CGA-1112" {
		t.Fatalf("before=%+v after=%+v", before, after)
	}
	if got, want := queryString(
		t,
		st.Reader(),
		`SELECT create_time FROM advisories WHERE uid = ?`,
		a.UID,
	), "2025-04-01T00:00:00.000Z"; got != want {
		t.Fatalf("create_time=%s, want %s", got, want)
	}
}

// TestApplyHistory_EmptyFirstReadAnnouncesOnce: a new tag whose first
// history read finds no record is announced as listed; a later read that
// finds records announces it no second time, and records its moves.
func TestApplyHistory_EmptyFirstReadAnnouncesOnce(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), false, store.Options{})
	repo := nginx()
	mustApplyRepos(t, st, repo)
	need := mustApplyTags(t, st, repo, tag("g1/r1/t1", "latest", 1))
	if n, err := st.ApplyHistory(ctx, need[0], nil, true); err != nil || n != 1 {
		t.Fatalf("an empty first read: %d events, %v; want the tag.created", n, err)
	}
	t0 := ts("2025-02-01T00:00:00Z")
	recs := []store.HistoryRecord{{Time: t0, Digest: digest(1)}, {Time: t0.Add(time.Minute), Digest: digest(2)}}
	if _, err := st.ApplyHistory(ctx, need[0], recs, true); err != nil {
		t.Fatal(err)
	}
	created := 0
	for _, e := range allEvents(t, st) {
		if e.Type == store.TagCreated {
			created++
		}
	}
	if created != 1 {
		t.Errorf("%d tag.created events, want 1; events %v", created, types(allEvents(t, st)))
	}
}

// TestApplyTags_DeprecationWithAMoveComesAfterTheMoves: a listing that
// shows a tag moved and deprecated (both since the last history read)
// holds the deprecation and the listing's update time back with the
// digest; the history read records the moves first, each at its own time
// and not deprecated, then the deprecation at the digest they left. So
// the tag's states on the stream (and in a KV bucket written from them)
// never go back in time, and none of them is one the tag never had.
func TestApplyTags_DeprecationWithAMoveComesAfterTheMoves(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), false, store.Options{})
	repo := nginx()
	mustApplyRepos(t, st, repo)
	first := tag("g1/r1/t1", "latest", 1)
	need := mustApplyTags(t, st, repo, first)
	if _, err := st.ApplyHistory(ctx, need[0], []store.HistoryRecord{{Time: first.UpdateTime, Digest: first.Digest}},
		true); err != nil {
		t.Fatal(err)
	}
	at := func(m int) time.Time { return first.UpdateTime.Add(time.Duration(m) * time.Minute) }
	t1, t2, t3 := at(1), at(2), at(3)
	listed := first
	listed.Digest, listed.Deprecated, listed.UpdateTime = digest(3), true, t3
	before := len(allEvents(t, st))
	need, n, err := st.ApplyTags(ctx, repo, []store.Tag{listed})
	if err != nil {
		t.Fatal(err)
	}
	if n != 0 || len(need) != 1 || need[0].Listed == nil {
		t.Fatalf("listing: %d events, need %+v; want none, and one read carrying the listed state", n, need)
	}
	dep, upd := deprecation(t, st, first.UID)
	if dep != 0 || upd != store.FormatTime(t3) {
		t.Fatalf("before the read the mirror holds deprecated=%d update_time=%s; want 0 (held back) and %s",
			dep, upd, store.FormatTime(t3))
	}
	recs := []store.HistoryRecord{
		{Time: first.UpdateTime, Digest: first.Digest},
		{Time: t1, Digest: digest(2)},
		{Time: t2, Digest: digest(3)},
	}
	if n, err := st.ApplyHistory(ctx, need[0], recs, true); err != nil || n != 3 {
		t.Fatalf("history read: %d events, %v; want two moves and the deprecation", n, err)
	}
	evs := allEvents(t, st)[before:]
	var got []string
	var last time.Time
	for _, e := range evs {
		if e.Type == store.HistoryRecorded {
			continue
		}
		b, a := payload[store.Tag](t, e)
		got = append(got, fmt.Sprintf("%s %s dep=%v", e.Type, a.Digest, a.Deprecated))
		if a.UpdateTime.Before(last) {
			t.Errorf("%s after=%+v: its update time goes back from %s", e.Type, a, last)
		}
		if e.Type == store.TagDeprecated && (b.Digest != digest(3) || b.Deprecated) {
			t.Errorf("deprecation before=%+v; want the digest the moves left, not deprecated", b)
		}
		last = a.UpdateTime
	}
	want := []string{
		fmt.Sprintf("%s %s dep=false", store.TagMoved, digest(2)),
		fmt.Sprintf("%s %s dep=false", store.TagMoved, digest(3)),
		fmt.Sprintf("%s %s dep=true", store.TagDeprecated, digest(3)),
	}
	if !slices.Equal(got, want) {
		t.Fatalf("events after the read:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	dep, upd = deprecation(t, st, first.UID)
	if dep != 1 || upd != store.FormatTime(t3) {
		t.Fatalf("after the read the mirror holds deprecated=%d update_time=%s; want 1 and %s",
			dep, upd, store.FormatTime(t3))
	}
	if need, n, err := st.ApplyTags(ctx, repo, []store.Tag{listed}); err != nil || n != 0 || len(need) != 0 {
		t.Fatalf("the same listing again: %d events, need %d, %v; want nothing", n, len(need), err)
	}
	// An older listing's read committed after it (a push and a crawl of
	// the same tag) takes nothing back.
	older := need[0]
	stale := first
	stale.Digest, stale.UpdateTime = digest(2), t1
	older.Listed = &stale
	if _, err := st.ApplyHistory(ctx, older, recs, true); err != nil {
		t.Fatal(err)
	}
	dep, upd = deprecation(t, st, first.UID)
	if dep != 1 || upd != store.FormatTime(t3) {
		t.Fatalf("after an older listing's read the mirror holds deprecated=%d update_time=%s; want 1 and %s",
			dep, upd, store.FormatTime(t3))
	}
}

// deprecation reads tag uid's deprecated flag and update time as the mirror
// holds them.
func deprecation(t *testing.T, st *store.Store, uid string) (deprecated int, updated string) {
	t.Helper()
	if err := st.Reader().QueryRow(`SELECT deprecated, update_time FROM tags WHERE uid = ?`, uid).
		Scan(&deprecated, &updated); err != nil {
		t.Fatal(err)
	}
	return deprecated, updated
}

// TestApplyTagPage_OneTransaction: a page's repos are applied together, and
// a tag that cannot be stored fails the page naming its repo and tag, with
// nothing of the page applied.
func TestApplyTagPage_OneTransaction(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), false, store.Options{})
	r1, r2 := nginx(), store.Repo{UID: "g1/r2", Name: "redis", CreateTime: ts("2025-01-01T00:00:00Z"),
		UpdateTime: ts("2025-01-01T00:00:00Z")}
	mustApplyRepos(t, st, r1, r2)
	bad := tag("g1/r2/t9", "broken", 9)
	bad.Raw = []byte(`{"name": `)
	_, _, err := st.ApplyTagPage(ctx, []store.RepoTags{
		{Repo: r1, Tags: []store.Tag{tag("g1/r1/t1", "latest", 1)}},
		{Repo: r2, Tags: []store.Tag{tag("g1/r2/t1", "7", 2), bad}},
	})
	if err == nil || !strings.Contains(err.Error(), "repo redis") || !strings.Contains(err.Error(), "g1/r2/t9") {
		t.Fatalf("err = %v, want one naming repo redis and tag g1/r2/t9", err)
	}
	if n := queryInt(t, st.Reader(), `SELECT count(*) FROM tags`); n != 0 {
		t.Fatalf("%d tags stored from a failed page, want none", n)
	}
	need, _, err := st.ApplyTagPage(ctx, []store.RepoTags{
		{Repo: r1, Tags: []store.Tag{tag("g1/r1/t1", "latest", 1)}},
		{Repo: r2, Tags: []store.Tag{tag("g1/r2/t1", "7", 2)}},
	})
	if err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, st.Reader(), `SELECT count(*) FROM tags`); n != 2 || len(need) != 2 {
		t.Fatalf("%d tags stored, %d histories to read; want 2 and 2", n, len(need))
	}
}
