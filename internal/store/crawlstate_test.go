package store_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestApplyRepos_PathLearntIsNoChange: a mirror upgraded to schema 6 holds
// every repo's name as its path; learning a nested repo's real path is no
// change upstream and records no event, while a later rename of its group
// is one.
func TestApplyRepos_PathLearntIsNoChange(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	ut := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	r := store.Repo{UID: "org1/g/r", Name: "cert-manager", UpdateTime: ut}
	if _, err := st.ApplyRepos(ctx, []store.Repo{r}); err != nil { // the baseline
		t.Fatal(err)
	}
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	r.Path = "charts/cert-manager"
	if n, err := st.ApplyRepos(ctx, []store.Repo{r}); err != nil || n != 0 {
		t.Fatalf("learning the path: %d events, %v; want none", n, err)
	}
	got, ok, err := st.RepoByPath(ctx, "charts/cert-manager")
	if err != nil || !ok || got.UID != r.UID {
		t.Fatalf("RepoByPath after learning: %+v %v %v", got, ok, err)
	}
	r.Path = "helm/cert-manager"
	if n, err := st.ApplyRepos(ctx, []store.Repo{r}); err != nil || n != 1 {
		t.Errorf("a renamed group: %d events, %v; want one repo.updated", n, err)
	}
}

func TestPendingHistoriesAndWatermark(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	repo := store.Repo{UID: "org1/r", Name: "nginx"}
	if _, err := st.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	t1 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	t2 := t1.Add(time.Hour)
	need, _, err := st.ApplyTags(ctx, repo, []store.Tag{
		{UID: "org1/r/a", Name: "a", Digest: "sha256:aa", UpdateTime: t1},
		{UID: "org1/r/b", Name: "b", Digest: "sha256:bb", UpdateTime: t2},
	})
	if err != nil || len(need) != 2 {
		t.Fatalf("need %d, %v", len(need), err)
	}
	if w, err := st.NewestTagUpdate(ctx, "org1"); err != nil || !w.Equal(t2) {
		t.Errorf("watermark %v, %v; want %v", w, err, t2)
	}
	if w, err := st.NewestTagUpdate(ctx, "org2"); err != nil || !w.IsZero() {
		t.Errorf("watermark of another group %v, %v; want zero", w, err)
	}
	// Both histories are pending until read; one read completes.
	if _, err := st.ApplyHistory(ctx, need[1], []store.HistoryRecord{{Time: t2, Digest: "sha256:bb"}}, true); err != nil {
		t.Fatal(err)
	}
	p, err := st.PendingHistories(ctx, "org1")
	if err != nil || len(p) != 1 || p[0].UID != "org1/r/a" || p[0].Path != "nginx" || p[0].Name != "a" {
		t.Fatalf("pending %+v, %v; want tag a of nginx", p, err)
	}
	if c, err := st.FailureCounts(ctx); err != nil || len(c) != 0 {
		t.Errorf("failure counts %v, %v; want none", c, err)
	}
}

// TestApplyHistory_MoveCarriesThePreviousRecordsTime: a tag.moved event's
// before is the tag as the previous history record left it, its time
// included, not the tag's newest time.
func TestApplyHistory_MoveCarriesThePreviousRecordsTime(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	repo := store.Repo{UID: "org1/r", Name: "nginx"}
	t0 := time.Date(2026, 11, 1, 0, 0, 0, 0, time.UTC)
	t1, t2 := t0.Add(time.Hour), t0.Add(2*time.Hour)
	if _, err := st.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	need, _, err := st.ApplyTags(
		ctx,
		repo,
		[]store.Tag{{UID: "org1/r/t", Name: "latest", Digest: "sha256:a0", UpdateTime: t0}},
	)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.ApplyHistory(ctx, need[0], []store.HistoryRecord{{Time: t0, Digest: "sha256:a0"}}, true); err != nil {
		t.Fatal(err)
	}
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	need, _, err = st.ApplyTags(
		ctx,
		repo,
		[]store.Tag{{UID: "org1/r/t", Name: "latest", Digest: "sha256:a2", UpdateTime: t2}},
	)
	if err != nil || len(need) != 1 {
		t.Fatalf("need %v, %v", need, err)
	}
	recs := []store.HistoryRecord{
		{Time: t0, Digest: "sha256:a0"},
		{Time: t1, Digest: "sha256:a1"},
		{Time: t2, Digest: "sha256:a2"},
	}
	if n, err := st.ApplyHistory(ctx, need[0], recs, true); err != nil || n != 2 {
		t.Fatalf("moves recorded %d, %v; want 2", n, err)
	}
	rows, err := st.Reader().
		Query(
			`SELECT json_extract(data, '$.before.updateTime'), json_extract(data, '$.after.updateTime') FROM events WHERE type = 'tag.moved' ORDER BY seq`,
		)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var got []string
	for rows.Next() {
		var b, a string
		rows.Scan(&b, &a)
		got = append(got, b+" -> "+a)
	}
	f := func(t time.Time) string { return t.Format(time.RFC3339Nano) }
	want := []string{f(t0) + " -> " + f(t1), f(t1) + " -> " + f(t2)}
	if len(got) != 2 || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("moves' times %q, want %q", got, want)
	}
}
