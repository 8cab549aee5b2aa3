package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// firstCrawl applies what a first crawl of one repo with two tags, one of
// which moved once before syncd existed, would, and returns the events.
func firstCrawl(t *testing.T, st *store.Store) int {
	t.Helper()
	ctx := context.Background()
	repo := nginx()
	total := mustApplyRepos(t, st, repo)
	need, n, err := st.ApplyTags(ctx, repo, []store.Tag{tag("g1/r1/t1", "latest", 2), tag("g1/r1/t2", "stable", 3)})
	if err != nil {
		t.Fatal(err)
	}
	total += n
	for _, ref := range need {
		recs := []store.HistoryRecord{
			{Time: ts("2025-01-01T00:00:00Z"), Digest: digest(1)},
			{Time: ts("2025-01-02T00:00:00Z"), Digest: digest(2)},
		}
		n, err := st.ApplyHistory(ctx, ref, recs, true)
		if err != nil {
			t.Fatal(err)
		}
		total += n
	}
	if _, err := st.MarkTagsDeleted(ctx, []string{"g1/r1/t2"}); err != nil {
		t.Fatal(err)
	}
	return total
}

func TestBaseline(t *testing.T) {
	ctx := context.Background()
	t.Run("NoneIsSilent", func(t *testing.T) {
		st, _ := openTemp(t, newClock(), true, store.Options{})
		if got := firstCrawl(t, st); got != 0 {
			t.Fatalf("events reported=%d, want 0", got)
		}
		if got := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM events WHERE type != 'history.recorded'`); got != 0 {
			t.Fatalf("event rows=%d, want 0", got)
		}
		// The records read go on the stream as replication records, not
		// news: followers hold the whole history.
		q := `SELECT COUNT(DISTINCT subject) FROM events WHERE type = 'history.recorded'`
		if got := queryInt(t, st.Reader(), q); got != 2 {
			t.Fatalf("history.recorded for %d tags, want 2", got)
		}
		if got, want := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM tag_history`), 4; got != want {
			t.Fatalf("history rows=%d, want %d: the baseline still mirrors everything", got, want)
		}
		if got, want := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM tags WHERE deleted_time IS NOT NULL`), 1; got != want {
			t.Fatalf("tombstones=%d, want %d", got, want)
		}
		if err := st.EndBaseline(ctx); err != nil {
			t.Fatal(err)
		}
		if b, err := st.InBaseline(ctx); err != nil || b {
			t.Fatalf("InBaseline=%v err=%v after EndBaseline", b, err)
		}
		// After the baseline, the next change is news.
		d := tag("g1/r1/t3", "dev", 4)
		if n := testutil.AnnounceTags(t, st, nginx(), []store.Tag{d}); n != 1 {
			t.Fatalf("events=%d after baseline, want 1", n)
		}
	})
	t.Run("SnapshotEmitsOneCreatedPerResource", func(t *testing.T) {
		st, _ := openTemp(t, newClock(), true, store.Options{InitialEvents: "snapshot"})
		firstCrawl(t, st)
		got := types(allEvents(t, st))
		// Past moves are history, not news, even in a snapshot; the deletion
		// of a resource the snapshot announced is.
		want := []string{store.RepoCreated, store.TagCreated, store.TagCreated, store.TagDeleted}
		if !slices.Equal(got, want) {
			t.Fatalf("types=%v, want %v", got, want)
		}
	})
	t.Run("TagFoundByBaselineHasNoPastMovesLater", func(t *testing.T) {
		st, _ := openTemp(t, newClock(), true, store.Options{})
		repo := nginx()
		mustApplyRepos(t, st, repo)
		need := mustApplyTags(t, st, repo, tag("g1/r1/t1", "latest", 2))
		if err := st.EndBaseline(ctx); err != nil {
			t.Fatal(err)
		}
		// The history read of a baseline tag happens after the baseline
		// ended (a crawl interrupted and resumed): its past is still not news.
		recs := []store.HistoryRecord{
			{Time: ts("2025-01-01T00:00:00Z"), Digest: digest(1)},
			{Time: ts("2025-01-02T00:00:00Z"), Digest: digest(2)},
		}
		if n, err := st.ApplyHistory(ctx, need[0], recs, true); err != nil || n != 0 {
			t.Fatalf("events=%d err=%v, want 0 and nil", n, err)
		}
		ref := need[0]
		ref.Bookmark = store.Bookmark{LastTime: recs[1].Time, LastCount: 1, Count: 2}
		recs = append(recs[1:], store.HistoryRecord{Time: ts("2025-03-01T00:00:00Z"), Digest: digest(3)})
		if n, err := st.ApplyHistory(ctx, ref, recs, true); err != nil || n != 1 {
			t.Fatalf("events for a new move=%d err=%v, want 1 and nil", n, err)
		}
	})
}

func TestEventIDs(t *testing.T) {
	ctx := context.Background()
	run := func(t *testing.T) []store.Event {
		st, _ := openTemp(t, newClock(), false, store.Options{})
		repo := nginx()
		mustApplyRepos(t, st, repo)
		need := mustApplyTags(t, st, repo, tag("g1/r1/t1", "latest", 1))
		recs := []store.HistoryRecord{
			{Time: ts("2025-02-01T00:00:00Z"), Digest: digest(1)},
			{Time: ts("2025-02-02T00:00:00Z"), Digest: digest(2)},
		}
		for range 2 {
			// The same history applied again, as if the bookmark had been
			// lost (a crash before the crawler saw the commit), is one event.
			ref := need[0]
			ref.Bookmark = store.Bookmark{}
			if _, err := st.ApplyHistory(ctx, ref, recs, true); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := st.MarkTagsDeleted(ctx, []string{"g1/r1/t1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.ApplyAdvisories(
			ctx,
			[]store.Advisory{{UID: "g1/a1", AdvisoryID: "CGA-1", ArtifactName: "zlib"}},
		); err != nil {
			t.Fatal(err)
		}
		return allEvents(t, st)
	}
	a, b := run(t), run(t)
	want := []string{store.RepoCreated, store.TagCreated, store.TagMoved, store.TagDeleted, store.AdvisoryCreated}
	if got := types(a); !slices.Equal(got, want) {
		t.Fatalf("types=%v, want %v", got, want)
	}
	if len(a) != len(b) {
		t.Fatalf("two fresh databases recorded %d and %d events", len(a), len(b))
	}
	seen := map[string]bool{}
	for i := range a {
		if a[i].ID != b[i].ID {
			t.Fatalf("event %d (%s): ids %s and %s differ across databases", i, a[i].Type, a[i].ID, b[i].ID)
		}
		if seen[a[i].ID] {
			t.Fatalf("id %s used twice", a[i].ID)
		}
		seen[a[i].ID] = true
	}
	t.Run("SameChangeTwiceIsOneRow", func(t *testing.T) {
		st, _ := openTemp(t, newClock(), false, store.Options{})
		r := nginx()
		mustApplyRepos(t, st, r)
		u := r
		u.Description = "changed"
		mustApplyRepos(t, st, u)
		mustApplyRepos(t, st, r) // back, then the same change again
		mustApplyRepos(t, st, u)
		got := types(allEvents(t, st))
		want := []string{store.RepoCreated, store.RepoUpdated, store.RepoUpdated}
		if !slices.Equal(got, want) {
			t.Fatalf("types=%v, want %v: a repeated change must reuse its id", got, want)
		}
	})
}

// TestBaseline_FailedRepos: the baseline ends although some repos failed.
// What the recovered repos hold when their tags are first listed, in full
// or in part, is the starting point as the baseline would have taken it;
// once a repo's failure is cleared, its changes are news again.
func TestBaseline_FailedRepos(t *testing.T) {
	ctx := context.Background()
	twoRecords := []store.HistoryRecord{
		{Time: ts("2025-01-01T00:00:00Z"), Digest: digest(1)},
		{Time: ts("2025-01-02T00:00:00Z"), Digest: digest(2)},
	}
	failRepo := func(t *testing.T, st *store.Store, r store.Repo) {
		t.Helper()
		if _, err := st.RecordFailure(
			ctx,
			store.Failure{Kind: store.FailureRepo, UID: r.UID, Path: r.Name, Status: 403, Error: "forbidden"},
			nil,
		); err != nil {
			t.Fatal(err)
		}
	}
	// listAndRead applies tags of r and their two-record histories, and
	// returns the events recorded.
	listAndRead := func(t *testing.T, st *store.Store, r store.Repo, tags ...store.Tag) int {
		t.Helper()
		need, total, err := st.ApplyTags(ctx, r, tags)
		if err != nil {
			t.Fatal(err)
		}
		for _, ref := range need {
			n, err := st.ApplyHistory(ctx, ref, twoRecords, true)
			if err != nil {
				t.Fatal(err)
			}
			total += n
		}
		return total
	}
	ok := store.Repo{UID: "g1/ok", Name: "ok"}
	unlisted := store.Repo{UID: "g1/unlisted", Name: "unlisted"}
	halfListed := store.Repo{UID: "g1/half", Name: "half"}
	setup := func(t *testing.T, opts store.Options) *store.Store {
		t.Helper()
		st, _ := openTemp(t, newClock(), true, opts)
		mustApplyRepos(t, st, ok, unlisted, halfListed)
		listAndRead(t, st, ok, tag("g1/ok/t1", "latest", 2))
		// unlisted's tag listing failed; half's failed after its first page.
		failRepo(t, st, unlisted)
		listAndRead(t, st, halfListed, tag("g1/half/t1", "page1", 2))
		failRepo(t, st, halfListed)
		if err := st.EndBaseline(ctx); err != nil {
			t.Fatal(err)
		}
		return st
	}

	t.Run("RecoveredReposAreNotNews", func(t *testing.T) {
		st := setup(t, store.Options{})
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT group_concat(name || '=' || baseline_pending, ' ') FROM (SELECT * FROM repos ORDER BY name)`,
		),
			"half=1 ok=0 unlisted=1"; got != want {
			t.Fatalf("baseline_pending=%s, want %s", got, want)
		}
		// Next crawl: both repos answer. Their tags and past moves are
		// the starting point.
		if got := listAndRead(
			t,
			st,
			unlisted,
			tag("g1/unlisted/t1", "latest", 2),
			tag("g1/unlisted/t2", "dev", 2),
		); got != 0 {
			t.Fatalf("events for the first listing of a repo the baseline missed=%d, want 0", got)
		}
		if got := listAndRead(t, st, halfListed, tag("g1/half/t2", "page2", 2)); got != 0 {
			t.Fatalf("events for the rest of a half-listed repo=%d, want 0", got)
		}
		// A repo that was fine: a new tag is news, with its past moves.
		if got, want := listAndRead(t, st, ok, tag("g1/ok/t2", "new", 2)), 2; got != want {
			t.Fatalf("events for a new tag of a complete repo=%d, want %d (tag.created, tag.moved)", got, want)
		}
		for _, r := range []store.Repo{unlisted, halfListed} {
			if ok, err := st.ClearFailure(ctx, r.UID); err != nil || !ok {
				t.Fatalf("ClearFailure(%s)=%v, %v", r.UID, ok, err)
			}
		}
		if got := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM repos WHERE baseline_pending = 1`); got != 0 {
			t.Fatalf("repos pending after recovery=%d, want 0", got)
		}
		// From now on the recovered repos are like any other.
		if got, want := listAndRead(t, st, unlisted, tag("g1/unlisted/t3", "newer", 2)), 2; got != want {
			t.Fatalf("events for a new tag after recovery=%d, want %d", got, want)
		}
		ref := store.TagRef{
			UID:        "g1/unlisted/t1",
			RepoUID:    unlisted.UID,
			Repo:       unlisted.Name,
			Name:       "latest",
			UpdateTime: ts("2025-03-01T00:00:00Z"),
		}
		moved := append(twoRecords, store.HistoryRecord{Time: ts("2025-03-01T00:00:00Z"), Digest: digest(3)})
		if n, err := st.ApplyHistory(ctx, ref, moved, true); err != nil || n != 1 {
			t.Fatalf("events for a move after recovery=%d err=%v, want 1", n, err)
		}
		got := types(allEvents(t, st))
		want := []string{store.TagCreated, store.TagMoved, store.TagCreated, store.TagMoved, store.TagMoved}
		if !slices.Equal(got, want) {
			t.Fatalf("types=%v, want %v", got, want)
		}
	})
	t.Run("ADeprecationInAPendingRepoIsNews", func(t *testing.T) {
		st := setup(t, store.Options{})
		listAndRead(t, st, unlisted, tag("g1/unlisted/t1", "latest", 2))
		dep := tag("g1/unlisted/t1", "latest", 2)
		dep.Deprecated = true
		if _, n, err := st.ApplyTags(ctx, unlisted, []store.Tag{dep}); err != nil || n != 1 {
			t.Fatalf("events for a deprecation after the baseline, in a repo whose own is pending = %d (%v), want 1",
				n, err)
		}
		if got := types(allEvents(t, st)); !slices.Equal(got, []string{store.TagDeprecated}) {
			t.Fatalf("types=%v, want one tag.deprecated", got)
		}
	})
	t.Run("SnapshotAnnouncesThemAsTheBaselineWould", func(t *testing.T) {
		st := setup(t, store.Options{InitialEvents: "snapshot"})
		before := len(allEvents(t, st))
		// One tag.created each, as in the snapshot; their past moves are not news.
		if got, want := listAndRead(t, st, unlisted, tag("g1/unlisted/t1", "latest", 2)), 1; got != want {
			t.Fatalf("events=%d, want %d", got, want)
		}
		if got := types(allEvents(t, st)[before:]); !slices.Equal(got, []string{store.TagCreated}) {
			t.Fatalf("types=%v, want one tag.created", got)
		}
	})
	t.Run("FailureAfterTheBaselineIsNotPending", func(t *testing.T) {
		st := setup(t, store.Options{})
		late := store.Repo{UID: "g1/late", Name: "late"}
		mustApplyRepos(t, st, late)
		failRepo(t, st, late)
		if got, want := listAndRead(t, st, late, tag("g1/late/t1", "latest", 2)), 2; got != want {
			t.Fatalf("events for a repo created after the baseline=%d, want %d", got, want)
		}
	})
}
