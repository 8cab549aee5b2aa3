package store_test

import (
	"context"
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// certManager is a repo below the subgroup charts (g1/g2).
func certManager() store.Repo {
	return store.Repo{UID: "g1/g2/r4", Name: "cert-manager", Path: "charts/cert-manager",
		CreateTime: ts("2025-01-01T00:00:00Z"), UpdateTime: ts("2025-01-01T00:00:00Z")}
}

// lastEvent returns the newest event.
func lastEvent(tb testing.TB, st *store.Store) store.Event {
	tb.Helper()
	evs := allEvents(tb, st)
	if len(evs) == 0 {
		tb.Fatal("no events")
	}
	return evs[len(evs)-1]
}

func TestRepoPaths(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	cm, top := certManager(), nginx()
	mustApplyRepos(t, st, cm, top)

	t.Run("RepoEventsAreScopedByPath", func(t *testing.T) {
		evs := allEvents(t, st)
		if got, want := []string{evs[0].Scope, evs[1].Scope}, []string{"charts/cert-manager", "nginx"}; !slices.Equal(
			got,
			want,
		) {
			t.Fatalf("scopes=%v, want %v: a nested repo's path, a top-level repo's name", got, want)
		}
		_, after := payload[store.Repo](t, evs[0])
		if got, want := after.Path, "charts/cert-manager"; got != want {
			t.Fatalf("repo.created after.path=%q, want %q", got, want)
		}
		// An empty Path is the name, in the row and in the event.
		_, after = payload[store.Repo](t, evs[1])
		if got, want := after.Path, "nginx"; got != want {
			t.Fatalf("path of a repo given none=%q, want its name %q", got, want)
		}
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT group_concat(path, ' ') FROM (SELECT path FROM repos ORDER BY uid)`,
		),
			"charts/cert-manager nginx"; got != want {
			t.Fatalf("repos.path=%q, want %q", got, want)
		}
		if got := mustApplyRepos(t, st, cm, top); got != 0 {
			t.Fatalf("events after reapplying=%d, want 0", got)
		}
	})
	var ref store.TagRef
	t.Run("TagEventsCarryThePath", func(t *testing.T) {
		// The crawler may name the repo without its path (a refresh by
		// uid): the store knows it.
		need, n, err := st.ApplyTags(ctx, store.Repo{UID: cm.UID, Name: cm.Name}, []store.Tag{tag(cm.UID+"/t1", "v1.16", 1)})
		if err != nil || n != 0 || len(need) != 1 {
			t.Fatalf("ApplyTags: need=%v events=%d err=%v, want one tag to read and no event yet", need, n, err)
		}
		ref = need[0]
		if got, want := ref.Path, "charts/cert-manager"; got != want {
			t.Fatalf("TagRef.Path=%q, want %q", got, want)
		}
		if got, want := ref.Repo, "cert-manager"; got != want {
			t.Fatalf("TagRef.Repo=%q, want %q", got, want)
		}
		recs := []store.HistoryRecord{
			{Time: ts("2025-02-01T00:00:00Z"), Digest: digest(0)},
			{Time: ts("2025-02-01T00:00:00Z"), Digest: digest(1)},
		}
		if n, err := st.ApplyHistory(ctx, ref, recs, true); err != nil || n != 2 {
			t.Fatalf("ApplyHistory: events=%d err=%v, want 2 (the creation, the move) and nil", n, err)
		}
		evs := allEvents(t, st)
		e := evs[len(evs)-2]
		_, after := payload[store.Tag](t, e)
		if e.Type != store.TagCreated || e.Scope != "charts/cert-manager" || after.Path != "charts/cert-manager" ||
			after.Repo != "cert-manager" {
			t.Fatalf("%s scope=%q path=%q repo=%q, want tag.created with the path twice and the name", e.Type, e.Scope,
				after.Path, after.Repo)
		}
		e = lastEvent(t, st)
		_, after = payload[store.Tag](t, e)
		if e.Type != store.TagMoved || e.Scope != "charts/cert-manager" || after.Path != "charts/cert-manager" {
			t.Fatalf("%s scope=%q path=%q, want tag.moved in charts/cert-manager", e.Type, e.Scope, after.Path)
		}
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT path || ':' || tag FROM current_tags WHERE repo_uid = ?`,
			cm.UID,
		), "charts/cert-manager:v1.16"; got != want {
			t.Fatalf("current_tags=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT path FROM tag_moves WHERE tag_uid = ?`,
			ref.UID,
		), "charts/cert-manager"; got != want {
			t.Fatalf("tag_moves.path=%q, want %q", got, want)
		}
	})
	t.Run("RepoByPath", func(t *testing.T) {
		r, ok, err := st.RepoByPath(ctx, "charts/cert-manager")
		if err != nil || !ok || r.UID != cm.UID || r.Name != cm.Name || r.Path != cm.Path {
			t.Fatalf("RepoByPath(charts/cert-manager)=%+v, %v, %v", r, ok, err)
		}
		if r, ok, err := st.RepoByPath(ctx, "nginx"); err != nil || !ok || r.UID != top.UID {
			t.Fatalf("RepoByPath(nginx)=%+v, %v, %v", r, ok, err)
		}
		// A name alone is not the path of a nested repo.
		if _, ok, err := st.RepoByPath(ctx, "cert-manager"); err != nil || ok {
			t.Fatalf("RepoByPath(cert-manager) found=%v err=%v, want nothing", ok, err)
		}
	})
	t.Run("PathChangeIsAnUpdate", func(t *testing.T) {
		moved := cm
		moved.Path = "helm/cert-manager"
		if got, want := mustApplyRepos(t, st, moved), 1; got != want {
			t.Fatalf("events after a path change=%d, want %d", got, want)
		}
		e := lastEvent(t, st)
		before, after := payload[store.Repo](t, e)
		if e.Type != store.RepoUpdated || before.Path != "charts/cert-manager" || after.Path != "helm/cert-manager" ||
			e.Scope != "helm/cert-manager" {
			t.Fatalf("%s scope=%q before.path=%q after.path=%q", e.Type, e.Scope, before.Path, after.Path)
		}
		if _, ok, _ := st.RepoByPath(ctx, "charts/cert-manager"); ok {
			t.Fatal("the old path still resolves")
		}
		// Its tags' events follow the new path.
		clk.Advance(time.Hour)
		if n, err := st.MarkTagsDeleted(ctx, []string{ref.UID}); err != nil || n != 1 {
			t.Fatalf("MarkTagsDeleted: events=%d err=%v", n, err)
		}
		e = lastEvent(t, st)
		if deleted, _ := payload[store.Tag](t, e); e.Scope != "helm/cert-manager" || deleted.Path != "helm/cert-manager" {
			t.Fatalf("tag.deleted scope=%q before.path=%q, want helm/cert-manager", e.Scope, deleted.Path)
		}
		if n, err := st.MarkReposDeleted(ctx, []string{cm.UID}); err != nil || n != 1 {
			t.Fatalf("MarkReposDeleted: events=%d err=%v", n, err)
		}
		if e := lastEvent(t, st); e.Type != store.RepoDeleted || e.Scope != "helm/cert-manager" {
			t.Fatalf("%s scope=%q, want repo.deleted in helm/cert-manager", e.Type, e.Scope)
		}
		if _, ok, err := st.RepoByPath(ctx, "helm/cert-manager"); err != nil || ok {
			t.Fatalf("RepoByPath of a deleted repo: found=%v err=%v, want nothing", ok, err)
		}
	})
}

// TestApplyStreamEvents_Paths: a follower ends up with the leader's paths
// and scopes, also when a tag's event arrives before its repo's, and takes
// an event from a syncd that did not know paths as scoped by the name.
func TestApplyStreamEvents_Paths(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	follower, _ := openTemp(t, clk, false, store.Options{})
	cm := certManager()
	mustApplyRepos(t, leader, cm)
	need := mustApplyTags(t, leader, cm, tag(cm.UID+"/t1", "v1.16", 1))
	recs := []store.HistoryRecord{
		{Time: ts("2025-02-01T00:00:00Z"), Digest: digest(0)},
		{Time: ts("2025-02-02T00:00:00Z"), Digest: digest(1)},
	}
	if _, err := leader.ApplyHistory(ctx, need[0], recs, true); err != nil {
		t.Fatal(err)
	}
	evs := stream(t, leader)
	slices.Reverse(evs) // the tag's events before the repo's
	if _, err := follower.ApplyStreamEvents(ctx, evs); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{
		`SELECT group_concat(uid || ':' || name || ':' || path, ',') FROM (SELECT * FROM repos ORDER BY uid)`,
		`SELECT group_concat(id || ':' || scope, ',') FROM (SELECT * FROM events ORDER BY id)`,
		`SELECT group_concat(path || ':' || tag, ',') FROM current_tags`,
	} {
		if l, f := queryString(t, leader.Reader(), q), queryString(t, follower.Reader(), q); l != f {
			t.Errorf("%s\n leader:   %s\n follower: %s", q, l, f)
		}
	}
	refs, err := follower.UnresolvedTags(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(refs) != 0 {
		t.Fatalf("unresolved tags=%+v: the move placed the tag's history", refs)
	}

	t.Run("EventWithoutPath", func(t *testing.T) {
		old := store.StreamEvent{ID: "old-1", Type: store.TagCreated, Subject: "g1/r9/t1", Time: clk.Now(),
			Data: json.RawMessage(
				`{"before": null, "after": {"uid": "g1/r9/t1", "repoUid": "g1/r9", "repo": "redis", "name": "7", "digest": "` +
					digest(
						7,
					) + `"}}`,
			)}
		if _, err := follower.ApplyStreamEvents(ctx, []store.StreamEvent{old}); err != nil {
			t.Fatal(err)
		}
		if got, want := queryString(
			t,
			follower.Reader(),
			`SELECT path FROM repos WHERE uid = 'g1/r9'`,
		), "redis"; got != want {
			t.Fatalf("path of a repo known from an old event=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			follower.Reader(),
			`SELECT scope FROM events WHERE id = 'old-1'`,
		), "redis"; got != want {
			t.Fatalf("scope=%q, want %q", got, want)
		}
		refs, err := follower.UnresolvedTags(ctx)
		if err != nil || len(refs) != 1 || refs[0].Path != "redis" {
			t.Fatalf("unresolved=%+v err=%v, want g1/r9/t1 at path redis", refs, err)
		}
	})
}

// stream returns every event of st as a follower receives them.
func stream(tb testing.TB, st *store.Store) []store.StreamEvent {
	tb.Helper()
	evs, err := st.Unpublished(context.Background(), 0, 10000)
	if err != nil {
		tb.Fatal(err)
	}
	out := make([]store.StreamEvent, len(evs))
	for i, e := range evs {
		out[i] = store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data}
	}
	return out
}
