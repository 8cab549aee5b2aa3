package store_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// The baseline's reads in the places its listings leave free (the
// crawler's spare reads): the listing stays the state, the reads stop at
// the listing they were asked for, and what the baseline did not read up
// to its last listing is the backfill's.

// spareTag is a tag listed at digest d, its last move at at.
func spareTag(d int, at time.Time) store.Tag {
	tg := tag("g1/r1/t1", "latest", d)
	tg.CreateTime, tg.UpdateTime = ts("2025-01-01T00:00:00Z"), at
	return tg
}

func spareRecords(n int) []store.HistoryRecord {
	recs := make([]store.HistoryRecord, n)
	for i := range recs {
		recs[i] = store.HistoryRecord{Time: ts("2025-01-01T00:00:00Z").Add(time.Duration(i) * time.Hour), Digest: digest(i)}
	}
	return recs
}

// TestSpareRead_ListedAgainAfterItsRead: a tag read during the baseline and
// listed again after a move (and a deprecation) takes the listing as it
// is; the backfill reads it from where the read ended, silently.
func TestSpareRead_ListedAgainAfterItsRead(t *testing.T) {
	for _, readFirst := range []bool{true, false} {
		name := map[bool]string{true: "ReadCommittedFirst", false: "ReadCommittedAfterTheListing"}[readFirst]
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st, _ := openTemp(t, newClock(), true, store.Options{})
			recs := spareRecords(3)
			mustApplyRepos(t, st, nginx())
			need := mustApplyTags(t, st, nginx(), spareTag(1, recs[1].Time))
			moved := spareTag(2, recs[2].Time)
			moved.Deprecated = true
			read := func() {
				if _, err := st.ApplyHistory(ctx, need[0], recs[:2], true); err != nil {
					t.Fatal(err)
				}
			}
			if readFirst {
				read()
				mustApplyTags(t, st, nginx(), moved)
			} else { // the read was on the wire when the page came
				mustApplyTags(t, st, nginx(), moved)
				read()
			}
			if got := queryString(t, st.Reader(), `SELECT digest || ' ' || deprecated FROM tags`); got != digest(2)+" 1" {
				t.Fatalf("tag = %s, want the last listing's %s deprecated", got, digest(2))
			}
			if err := st.EndBaseline(ctx); err != nil {
				t.Fatal(err)
			}
			refs, err := st.BackfillNext(ctx, 10, func(string) bool { return false })
			if err != nil || len(refs) != 1 || refs[0].Bookmark.Count != 2 {
				t.Fatalf("backfill = %+v (%v), want the tag from its second record", refs, err)
			}
			if _, err := st.ApplyHistory(ctx, refs[0], recs, true); err != nil {
				t.Fatal(err)
			}
			if got := types(allEvents(t, st)); len(got) != 0 {
				t.Fatalf("events = %v, want none: the move came before the first complete listing", got)
			}
			if n := queryInt(t, st.Reader(), `SELECT count(*) FROM tag_history`); n != 3 {
				t.Fatalf("history rows = %d, want 3", n)
			}
			if got := queryString(t, st.Reader(), `SELECT digest || ' ' || deprecated FROM tags`); got != digest(2)+" 1" {
				t.Fatalf("tag after the backfill = %s, want %s deprecated", got, digest(2))
			}
			if ready, err := st.HistoryReady(ctx); err != nil || !ready {
				t.Fatalf("history ready = %v (%v)", ready, err)
			}
		})
	}
}

// TestSpareRead_StopsAtItsListing: a read during the baseline that finds a
// move made after the tag's listing stores the history up to the listing;
// the move is news after the baseline, a tag.moved event.
func TestSpareRead_StopsAtItsListing(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), true, store.Options{})
	recs := spareRecords(3)
	mustApplyRepos(t, st, nginx())
	need := mustApplyTags(t, st, nginx(), spareTag(1, recs[1].Time))
	if _, err := st.ApplyHistory(ctx, need[0], recs, true); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(t, st.Reader(), `SELECT count(*) FROM tag_history`); n != 2 {
		t.Fatalf("history rows = %d after the baseline's read, want the 2 up to the listing", n)
	}
	if got := queryString(t, st.Reader(), `SELECT digest FROM tags`); got != digest(1) {
		t.Fatalf("digest = %s, want the listing's %s", got, digest(1))
	}
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	if left, err := st.BackfillRemaining(ctx); err != nil || left != 0 {
		t.Fatalf("backfill remaining = %d (%v), want 0: the tag's history is read up to its listing", left, err)
	}
	need = mustApplyTags(t, st, nginx(), spareTag(2, recs[2].Time))
	if len(need) != 1 {
		t.Fatalf("the listing showing the move asks for %d reads, want 1", len(need))
	}
	if _, err := st.ApplyHistory(ctx, need[0], recs, true); err != nil {
		t.Fatal(err)
	}
	evs := allEvents(t, st)
	if got := types(evs); !slices.Equal(got, []string{store.TagMoved}) {
		t.Fatalf("events = %v, want one tag.moved", got)
	}
	if got := queryString(t, st.Reader(), `SELECT digest FROM tags`); got != digest(2) {
		t.Fatalf("digest = %s, want %s", got, digest(2))
	}
}

// TestListedTime_ARecordJustAfterIt: the platform does not say that a
// tag's updateTime is its newest record's time. A listing whose time is
// just before the record of the digest it shows takes that record for the
// one it showed: silent, in the backfill's read and in a read during the
// baseline alike, not a move after the listing.
func TestListedTime_ARecordJustAfterIt(t *testing.T) {
	recs := spareRecords(2)
	recs[1].Time = recs[1].Time.Add(time.Millisecond)
	listed := spareTag(1, recs[1].Time.Add(-time.Millisecond))
	for _, during := range []bool{false, true} {
		t.Run(map[bool]string{false: "Backfill", true: "DuringTheBaseline"}[during], func(t *testing.T) {
			ctx := context.Background()
			st, _ := openTemp(t, newClock(), true, store.Options{})
			mustApplyRepos(t, st, nginx())
			need := mustApplyTags(t, st, nginx(), listed)
			if during {
				if _, err := st.ApplyHistory(ctx, need[0], recs, true); err != nil {
					t.Fatal(err)
				}
			}
			if err := st.EndBaseline(ctx); err != nil {
				t.Fatal(err)
			}
			left, err := st.BackfillRemaining(ctx)
			if err != nil || left != map[bool]int64{false: 1, true: 0}[during] {
				t.Fatalf("backfill remaining = %d (%v)", left, err)
			}
			if !during {
				refs, err := st.BackfillNext(ctx, 1, func(string) bool { return false })
				if err != nil || len(refs) != 1 {
					t.Fatalf("backfill = %v (%v)", refs, err)
				}
				if _, err := st.ApplyHistory(ctx, refs[0], recs, true); err != nil {
					t.Fatal(err)
				}
			}
			if got := types(allEvents(t, st)); len(got) != 0 {
				t.Fatalf("events = %v, want none: the record is the one the listing showed", got)
			}
			if n := queryInt(t, st.Reader(), `SELECT count(*) FROM tag_history`); n != 2 {
				t.Fatalf("history rows = %d, want 2", n)
			}
			if got := queryString(t, st.Reader(), `SELECT digest FROM tags`); got != digest(1) {
				t.Fatalf("digest = %s, want %s", got, digest(1))
			}
		})
	}
}
