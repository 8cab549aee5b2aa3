package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestApplyAdvisories_DeleteTime: an advisory the platform lists with a
// deleteTime is withdrawn at that time, once; one that comes back without
// it is revived.
func TestApplyAdvisories_DeleteTime(t *testing.T) {
	ctx := context.Background()
	apply := func(t *testing.T, st *store.Store, a store.Advisory) int {
		t.Helper()
		n, err := st.ApplyAdvisories(ctx, []store.Advisory{a})
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	standing := store.Advisory{UID: "g1/a1", AdvisoryID: "CGA-1", ArtifactName: "openssl",
		CreateTime: ts("2025-01-01T00:00:00Z"), UpdateTime: ts("2025-01-02T00:00:00Z")}
	withdrawn := standing
	withdrawn.UpdateTime, withdrawn.DeleteTime = ts("2025-03-01T00:00:00Z"), ts("2025-03-01T00:00:00Z")
	row := func(t *testing.T, st *store.Store) string {
		t.Helper()
		return queryString(
			t,
			st.Reader(),
			`SELECT COALESCE(deleted_time, 'live') || '/' || deletions FROM advisories WHERE uid = ?`,
			standing.UID,
		)
	}

	t.Run("WithdrawnOnceThenRevived", func(t *testing.T) {
		clk := newClock()
		st, _ := openTemp(t, clk, false, store.Options{})
		if got := apply(t, st, standing); got != 1 {
			t.Fatalf("events for a new advisory=%d, want 1", got)
		}
		if got := apply(t, st, withdrawn); got != 1 {
			t.Fatalf("events when deleteTime appears=%d, want 1", got)
		}
		e := lastEvent(t, st)
		before, after := payload[store.Advisory](t, e)
		if e.Type != store.AdvisoryWithdrawn || !e.Time.Equal(withdrawn.DeleteTime) || e.Scope != "openssl" {
			t.Fatalf("event %s at %v scope %q, want advisory.withdrawn at the deleteTime in openssl", e.Type, e.Time, e.Scope)
		}
		if after != nil || before == nil || !before.UpdateTime.Equal(standing.UpdateTime) || !before.DeleteTime.IsZero() {
			t.Fatalf("before=%+v after=%+v, want the last standing state and null", before, after)
		}
		if got, want := row(t, st), "2025-03-01T00:00:00.000Z/1"; got != want {
			t.Fatalf("deleted_time/deletions=%s, want %s", got, want)
		}
		live, err := st.LiveAdvisoryUIDs(ctx)
		if err != nil || len(live) != 0 {
			t.Fatalf("live advisories=%v err=%v, want none", live, err)
		}
		// Listed again as withdrawn: nothing new, and nothing written.
		w := watchCommits(t, st)
		if got := apply(t, st, withdrawn); got != 0 {
			t.Fatalf("events for a withdrawn advisory listed again=%d, want 0", got)
		}
		if w.wrote() {
			t.Fatal("an unchanged withdrawn advisory was rewritten")
		}
		// A sweep does not withdraw it a second time.
		if n, err := st.MarkAdvisoriesWithdrawn(ctx, []string{standing.UID}); err != nil || n != 0 {
			t.Fatalf("MarkAdvisoriesWithdrawn: events=%d err=%v, want 0 and nil", n, err)
		}
		// Back without a deleteTime: revived, and withdrawn again later is a
		// new event.
		back := standing
		back.UpdateTime = ts("2025-04-01T00:00:00Z")
		if got := apply(t, st, back); got != 1 {
			t.Fatalf("events for a revived advisory=%d, want 1", got)
		}
		if got, want := row(t, st), "live/1"; got != want {
			t.Fatalf("revived row=%s, want %s", got, want)
		}
		again := back
		again.DeleteTime = ts("2025-05-01T00:00:00Z")
		if got := apply(t, st, again); got != 1 {
			t.Fatalf("events for a second withdrawal=%d, want 1", got)
		}
		evs := allEvents(t, st)
		want := []string{store.AdvisoryCreated, store.AdvisoryWithdrawn, store.AdvisoryCreated, store.AdvisoryWithdrawn}
		if got := types(evs); !slices.Equal(got, want) {
			t.Fatalf("types=%v, want %v", got, want)
		}
		if evs[1].ID == evs[3].ID || evs[0].ID == evs[2].ID {
			t.Fatal("a second withdrawal or revival reused an event id")
		}
		if got, want := row(t, st), "2025-05-01T00:00:00.000Z/2"; got != want {
			t.Fatalf("row=%s, want %s", got, want)
		}
	})
	t.Run("FirstSeenWithdrawnIsNotNews", func(t *testing.T) {
		st, _ := openTemp(t, newClock(), false, store.Options{})
		if got := apply(t, st, withdrawn); got != 0 {
			t.Fatalf("events=%d, want 0", got)
		}
		if got, want := row(t, st), "2025-03-01T00:00:00.000Z/0"; got != want {
			t.Fatalf("row=%s, want %s", got, want)
		}
		if got := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM current_advisories`); got != 0 {
			t.Fatalf("current advisories=%d, want 0", got)
		}
		if got := apply(t, st, standing); got != 1 {
			t.Fatalf("events when it stands again=%d, want 1 (advisory.created)", got)
		}
	})
	// withdrawnQuietly applies withdrawn to a mirror that held the
	// advisory, expecting a tombstone at its deleteTime and no event.
	withdrawnQuietly := func(t *testing.T, st *store.Store) {
		t.Helper()
		if got := apply(t, st, withdrawn); got != 0 {
			t.Fatalf("events=%d, want 0", got)
		}
		if got, want := row(t, st), "2025-03-01T00:00:00.000Z/1"; got != want {
			t.Fatalf("row=%s, want %s", got, want)
		}
	}
	t.Run("NoneInTheBaseline", func(t *testing.T) {
		st, _ := openTemp(t, newClock(), true, store.Options{})
		apply(t, st, standing)
		withdrawnQuietly(t, st)
	})
	t.Run("TombstoneTakesTheUpstreamTime", func(t *testing.T) {
		// Withdrawn by a sweep first (the listing missed it), then listed
		// with its deleteTime: the row takes the upstream time, quietly.
		clk := newClock()
		st, _ := openTemp(t, clk, false, store.Options{})
		apply(t, st, standing)
		clk.Advance(24 * time.Hour)
		if n, err := st.MarkAdvisoriesWithdrawn(ctx, []string{standing.UID}); err != nil || n != 1 {
			t.Fatalf("MarkAdvisoriesWithdrawn: events=%d err=%v", n, err)
		}
		withdrawnQuietly(t, st)
	})
	t.Run("FollowerMatches", func(t *testing.T) {
		clk := newClock()
		leader, _ := openTemp(t, clk, false, store.Options{})
		follower, _ := openTemp(t, clk, false, store.Options{})
		apply(t, leader, standing)
		apply(t, leader, withdrawn)
		if _, err := follower.ApplyStreamEvents(ctx, stream(t, leader)); err != nil {
			t.Fatal(err)
		}
		if l, f := row(t, leader), row(t, follower); l != f {
			t.Fatalf("leader %s, follower %s", l, f)
		}
	})
}
