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
