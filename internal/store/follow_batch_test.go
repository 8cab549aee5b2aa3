package store_test

import (
	"context"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestApplyStreamEvents_BatchSizes: a follower ends with the same mirror
// whether the stream comes one event at a time or in batches that hold a
// resource's creation, changes and deletion together: batching the upserts
// never lets an event see, or undo, another out of order.
func TestApplyStreamEvents_BatchSizes(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	repo, other := nginx(), store.Repo{
		UID:        "g1/r2",
		Name:       "redis",
		CreateTime: ts("2025-01-01T00:00:00Z"),
		UpdateTime: ts("2025-01-01T00:00:00Z"),
	}
	mustApplyRepos(t, leader, repo, other)
	t1, t2 := tag("g1/r1/t1", "latest", 1), tag("g1/r1/t2", "1.0", 2)
	for _, ref := range mustApplyTags(t, leader, repo, t1, t2) {
		d := digest(1)
		if ref.UID == t2.UID {
			d = digest(2)
		}
		if _, err := leader.ApplyHistory(
			ctx,
			ref,
			[]store.HistoryRecord{{Time: t1.UpdateTime, Digest: d}},
			true,
		); err != nil {
			t.Fatal(err)
		}
	}
	// t1 moves twice, t2 goes and comes back, the repo changes.
	for i := 3; i <= 4; i++ {
		t1.Digest, t1.UpdateTime = digest(i), t1.UpdateTime.Add(time.Hour)
		for _, ref := range mustApplyTags(t, leader, repo, t1, t2) {
			recs := []store.HistoryRecord{{Time: ts("2025-02-01T00:00:00Z"), Digest: digest(1)}}
			for j := 3; j <= i; j++ {
				recs = append(
					recs,
					store.HistoryRecord{Time: ts("2025-02-01T00:00:00Z").Add(time.Duration(j-2) * time.Hour), Digest: digest(j)},
				)
			}
			if ref.UID == t1.UID {
				if _, err := leader.ApplyHistory(ctx, ref, recs, true); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if _, err := leader.MarkTagsDeleted(ctx, []string{t2.UID}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Hour)
	t2.Digest, t2.UpdateTime = digest(9), t2.UpdateTime.Add(2*time.Hour)
	mustApplyTags(t, leader, repo, t1, t2)
	repo.Description = "changed"
	repo.UpdateTime = repo.UpdateTime.Add(time.Hour)
	mustApplyRepos(t, leader, repo, other)
	// An advisory with a step, then withdrawn; another created.
	a := openssl()
	if _, err := leader.ApplyAdvisories(ctx, []store.Advisory{a}); err != nil {
		t.Fatal(err)
	}
	a.Events = append(a.Events, step("e2", store.StepFixed, "2026-01-05T00:00:00Z"))
	a.UpdateTime = ts("2026-01-05T00:00:00Z")
	b := openssl()
	b.UID, b.AdvisoryID = "g1/a2", "CGA-other"
	if _, err := leader.ApplyAdvisories(ctx, []store.Advisory{a, b}); err != nil {
		t.Fatal(err)
	}
	a.DeleteTime, a.UpdateTime = ts("2026-01-06T00:00:00Z"), ts("2026-01-06T00:00:00Z")
	if _, err := leader.ApplyAdvisories(ctx, []store.Advisory{a, b}); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.MarkReposDeleted(ctx, []string{other.UID}); err != nil {
		t.Fatal(err)
	}

	evs := stream(t, leader)
	if len(evs) < 15 {
		t.Fatalf("only %d events: %v", len(evs), types(allEvents(t, leader)))
	}
	render := func(st *store.Store) []string {
		var out []string
		for _, q := range []string{
			`SELECT group_concat(uid || ':' || name || ':' || description || ':' || (deleted_time IS NULL) || ':' || deletions, ',') FROM (SELECT * FROM repos ORDER BY uid)`,
			`SELECT group_concat(uid || ':' || digest || ':' || (deleted_time IS NULL) || ':' || deletions || ':' || history_count || ':' || COALESCE(history_last_digest, ''), ',') FROM (SELECT * FROM tags ORDER BY uid)`,
			`SELECT group_concat(tag_uid || ':' || seq || ':' || digest, ',') FROM (SELECT * FROM tag_history ORDER BY tag_uid, seq)`,
			`SELECT group_concat(uid || ':' || (deleted_time IS NULL) || ':' || complete, ',') FROM (SELECT * FROM advisories ORDER BY uid)`,
			`SELECT group_concat(advisory_uid || ':' || seq || ':' || uid, ',') FROM (SELECT * FROM advisory_events ORDER BY advisory_uid, seq)`,
			`SELECT group_concat(advisory_uid || ':' || alias, ',') FROM (SELECT * FROM advisory_aliases ORDER BY advisory_uid, seq)`,
			`SELECT group_concat(id || ':' || scope, ',') FROM (SELECT * FROM events ORDER BY seq)`,
			`SELECT count(*) FROM events WHERE published_time IS NULL`,
		} {
			out = append(out, queryString(t, st.Reader(), q))
		}
		return out
	}
	// The events as a follower's fetching goroutine hands them over, their
	// data decoded there (Predecode): the same mirror, batch by batch; the
	// redelivery shares the decoded values with the first delivery.
	predecoded := slices.Clone(evs)
	for i := range predecoded {
		predecoded[i].Predecode()
	}
	var want []string
	for k, size := range []int{1, 2, 5, len(evs), 5, len(evs)} {
		follower, _ := openTemp(t, clk, true, store.Options{})
		applied, evs := 0, evs
		if k >= 4 {
			evs = predecoded
		}
		for i := 0; i < len(evs); i += size {
			// Each batch twice over, the second a redelivery.
			batch := evs[i:min(i+size, len(evs))]
			n, err := follower.ApplyStreamEvents(ctx, slices.Concat(batch, batch))
			if err != nil {
				t.Fatalf("batches of %d: %v", size, err)
			}
			applied += n
		}
		if applied != len(evs) {
			t.Errorf("batches of %d: applied %d of %d events", size, applied, len(evs))
		}
		got := render(follower)
		if want == nil {
			// The leader's tags have history the stream does not carry
			// (the records before the first move).
			want = got
			l := render(leader)
			for _, i := range []int{0, 3, 4, 5, 6} {
				if got[i] != l[i] {
					t.Errorf("one at a time, the follower holds\n%s\nthe leader\n%s", got[i], l[i])
				}
			}
			continue
		}
		if !slices.Equal(got, want) {
			t.Errorf(
				"batches of %d: the follower holds\n%s\none at a time\n%s",
				size,
				strings.Join(got, "\n"),
				strings.Join(want, "\n"),
			)
		}
	}
}
