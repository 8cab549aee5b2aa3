package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

func TestMarkTagsDeleted(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	repo := nginx()
	mustApplyRepos(t, st, repo)
	latest, stable := tag("g1/r1/t1", "latest", 1), tag("g1/r1/t2", "stable", 2)
	for _, ref := range mustApplyTags(t, st, repo, latest, stable) {
		d := map[string]string{latest.UID: latest.Digest, stable.UID: stable.Digest}[ref.UID]
		if _, err := st.ApplyHistory(ctx, ref, []store.HistoryRecord{{Time: ref.UpdateTime, Digest: d}}, true); err != nil {
			t.Fatal(err)
		}
	}

	t.Run("TombstoneKeepsRowAndRecordsLastState", func(t *testing.T) {
		clk.Advance(time.Hour)
		n, err := st.MarkTagsDeleted(ctx, []string{latest.UID, "g1/r1/unknown"})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n, 1; got != want {
			t.Fatalf("events=%d, want %d", got, want)
		}
		evs := allEvents(t, st)
		e := evs[len(evs)-1]
		if got, want := e.Type, store.TagDeleted; got != want {
			t.Fatalf("type=%s, want %s", got, want)
		}
		if got, want := e.Scope, "nginx"; got != want {
			t.Fatalf("scope=%s, want %s", got, want)
		}
		if got, want := e.Time, clk.Now(); !got.Equal(want) {
			t.Fatalf("time=%v, want %v", got, want)
		}
		before, after := payload[store.Tag](t, e)
		if after != nil || before == nil || before.Digest != digest(1) || before.Repo != "nginx" {
			t.Fatalf("before=%+v after=%+v, want the last known tag and null", before, after)
		}
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT deleted_time FROM tags WHERE uid = ?`,
			latest.UID,
		), store.FormatTime(clk.Now()); got != want {
			t.Fatalf("deleted_time=%q, want %q", got, want)
		}
		if got, want := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM current_tags WHERE repo = 'nginx'`), 1; got != want {
			t.Fatalf("current tags=%d, want %d", got, want)
		}
		live, err := st.LiveTagUIDs(ctx, repo.UID)
		if err != nil {
			t.Fatal(err)
		}
		if want := []string{stable.UID}; !slices.Equal(live, want) {
			t.Fatalf("live tags=%v, want %v", live, want)
		}
	})
	t.Run("DeletingAgainDoesNothing", func(t *testing.T) {
		n, err := st.MarkTagsDeleted(ctx, []string{latest.UID})
		if err != nil || n != 0 {
			t.Fatalf("events=%d err=%v, want 0 and nil", n, err)
		}
	})
	t.Run("RevivedNotDuplicated", func(t *testing.T) {
		clk.Advance(time.Hour)
		need, n, err := st.ApplyTags(ctx, repo, []store.Tag{latest})
		if err != nil {
			t.Fatal(err)
		}
		if got, want := n, 1; got != want {
			t.Fatalf("events=%d, want %d", got, want)
		}
		// The upstream times are those of the first creation; the revival
		// is still a new event, not a duplicate of the first tag.created.
		created := 0
		for _, e := range allEvents(t, st) {
			if e.Type == store.TagCreated && e.Subject == latest.UID {
				created++
			}
		}
		if got, want := created, 2; got != want {
			t.Fatalf("tag.created events for the tag=%d, want %d", got, want)
		}
		if got, want := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM tags WHERE uid = ?`, latest.UID), 1; got != want {
			t.Fatalf("rows=%d, want %d", got, want)
		}
		if got := queryString(t, st.Reader(), `SELECT deleted_time FROM tags WHERE uid = ?`, latest.UID); got != "" {
			t.Fatalf("deleted_time=%q after revival, want NULL", got)
		}
		if len(need) != 0 {
			t.Fatalf("need=%v: a revived tag with an unchanged digest needs no history read", need)
		}
	})
	t.Run("DeletedTwiceIsTwoEvents", func(t *testing.T) {
		n, err := st.MarkTagsDeleted(ctx, []string{latest.UID})
		if err != nil || n != 1 {
			t.Fatalf("events=%d err=%v, want 1 and nil", n, err)
		}
		if got, want := queryInt(
			t,
			st.Reader(),
			`SELECT COUNT(*) FROM events WHERE type = 'tag.deleted' AND subject = ?`,
			latest.UID,
		), 2; got != want {
			t.Fatalf("tag.deleted events=%d, want %d", got, want)
		}
		if got, want := queryInt(t, st.Reader(), `SELECT deletions FROM tags WHERE uid = ?`, latest.UID), 2; got != want {
			t.Fatalf("deletions=%d, want %d", got, want)
		}
	})
}

func TestMarkReposDeleted(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	repo := nginx()
	other := store.Repo{UID: "g2/r9", Name: "redis"}
	mustApplyRepos(t, st, repo, other)
	mustApplyTags(t, st, repo, tag("g1/r1/t1", "latest", 1), tag("g1/r1/t2", "stable", 2))
	if _, err := st.MarkTagsDeleted(ctx, []string{"g1/r1/t2"}); err != nil {
		t.Fatal(err)
	}
	seq := len(allEvents(t, st))

	live, err := st.LiveRepoUIDs(ctx, "g1")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{repo.UID}; !slices.Equal(live, want) {
		t.Fatalf("live repos below g1=%v, want %v", live, want)
	}
	n, err := st.MarkReposDeleted(ctx, []string{repo.UID})
	if err != nil {
		t.Fatal(err)
	}
	if got, want := n, 2; got != want {
		t.Fatalf("events=%d, want %d (its live tag, then the repo)", got, want)
	}
	evs := allEvents(t, st)[seq:]
	if got, want := types(evs), []string{store.TagDeleted, store.RepoDeleted}; !slices.Equal(got, want) {
		t.Fatalf("types=%v, want %v", got, want)
	}
	before, after := payload[store.Repo](t, evs[1])
	if after != nil || before.Name != "nginx" {
		t.Fatalf("before=%+v after=%+v", before, after)
	}
	if got := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM current_tags`); got != 0 {
		t.Fatalf("current tags=%d, want 0", got)
	}
	all, err := st.LiveRepoUIDs(ctx, "")
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{other.UID}; !slices.Equal(all, want) {
		t.Fatalf("live repos=%v, want %v", all, want)
	}

	t.Run("Revived", func(t *testing.T) {
		if got, want := mustApplyRepos(t, st, repo), 1; got != want {
			t.Fatalf("events=%d, want %d", got, want)
		}
		e := allEvents(t, st)
		if got, want := e[len(e)-1].Type, store.RepoCreated; got != want {
			t.Fatalf("type=%s, want %s", got, want)
		}
		if got, want := queryInt(
			t,
			st.Reader(),
			`SELECT COUNT(*) FROM repos WHERE uid = ? AND deleted_time IS NULL`,
			repo.UID,
		), 1; got != want {
			t.Fatalf("live rows=%d, want %d", got, want)
		}
	})
}

func TestMarkAdvisoriesWithdrawn(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), false, store.Options{})
	a := store.Advisory{UID: "g1/a1", AdvisoryID: "CGA-1111", ArtifactName: "openssl"}
	if _, err := st.ApplyAdvisories(ctx, []store.Advisory{a}); err != nil {
		t.Fatal(err)
	}
	n, err := st.MarkAdvisoriesWithdrawn(ctx, []string{a.UID})
	if err != nil || n != 1 {
		t.Fatalf("events=%d err=%v, want 1 and nil", n, err)
	}
	evs := allEvents(t, st)
	e := evs[len(evs)-1]
	if e.Type != store.AdvisoryWithdrawn || e.Scope != "openssl" {
		t.Fatalf("event %s scope %s, want %s scope openssl", e.Type, e.Scope, store.AdvisoryWithdrawn)
	}
	before, after := payload[store.Advisory](t, e)
	if after != nil || before.AdvisoryID != "CGA-1111" {
		t.Fatalf("before=%+v after=%+v", before, after)
	}
	live, err := st.LiveAdvisoryUIDs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(live) != 0 {
		t.Fatalf("live advisories=%v, want none", live)
	}
	if got, want := queryInt(
		t,
		st.Reader(),
		`SELECT withdrawn_advisories FROM advisories_by_artifact WHERE artifact_name = 'openssl'`,
	), 1; got != want {
		t.Fatalf("withdrawn=%d, want %d", got, want)
	}
	if n, err := st.ApplyAdvisories(ctx, []store.Advisory{a}); err != nil || n != 1 {
		t.Fatalf("revival events=%d err=%v, want 1 and nil", n, err)
	}
}
