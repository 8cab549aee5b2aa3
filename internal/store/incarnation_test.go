package store_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestSetStreamIncarnation: the mirror's positions count the stream it
// recorded; a stream of another creation time, or one whose last sequence
// is below a position, makes them 0. A restore records the stream its
// snapshot's sequence counts, and a restored mirror says so whatever
// stream comes after.
func TestSetStreamIncarnation(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	first := time.Date(2026, 3, 1, 10, 0, 0, 123456789, time.UTC)
	second := first.Add(time.Hour)

	position := func() uint64 {
		t.Helper()
		pos, _, err := st.StreamPosition(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return pos
	}
	set := func(created time.Time, last uint64, wantMoved bool) {
		t.Helper()
		moved, err := st.SetStreamIncarnation(ctx, created, last)
		if err != nil {
			t.Fatal(err)
		}
		if moved != wantMoved {
			t.Fatalf("SetStreamIncarnation(%s, %d) moved = %v, want %v", created, last, moved, wantMoved)
		}
		if got, err := st.StreamIncarnation(ctx); err != nil || !got.Equal(created) {
			t.Fatalf("StreamIncarnation = %s, %v; want %s", got, err, created)
		}
	}

	if got, err := st.StreamIncarnation(ctx); err != nil || !got.IsZero() {
		t.Fatalf("a new mirror's StreamIncarnation = %s, %v; want none", got, err)
	}
	if err := st.SetStreamSeq(ctx, 8); err != nil {
		t.Fatal(err)
	}
	// A mirror that recorded none takes the stream it meets for its own.
	set(first, 10, false)
	if got := position(); got != 8 {
		t.Fatalf("position %d after the first record, want 8", got)
	}
	set(first, 10, false)
	// A last sequence below the position: the tail it counted is gone.
	set(first, 5, true)
	if got := position(); got != 0 {
		t.Fatalf("position %d after the stream lost its tail, want 0", got)
	}
	if err := st.SetStreamSeq(ctx, 4); err != nil {
		t.Fatal(err)
	}
	// Another stream of the same name, past the position: still another.
	set(second, 100, true)
	if got := position(); got != 0 {
		t.Fatalf("position %d in a stream created again, want 0", got)
	}
	if restored, err := st.Restored(ctx); err != nil || restored {
		t.Fatalf("Restored = %v, %v before any restore", restored, err)
	}

	// A restore records the stream its sequence counts.
	leader, _ := openTemp(t, clk, false, store.Options{InitialEvents: "snapshot"})
	mustApplyRepos(t, leader, nginx())
	third := second.Add(time.Hour)
	if err := st.Restore(ctx, backupTo(t, leader), store.SnapshotAt{Seq: 7, StreamCreated: third},
		store.Unverified); err != nil {
		t.Fatal(err)
	}
	if got, err := st.StreamIncarnation(ctx); err != nil || !got.Equal(third) {
		t.Fatalf("StreamIncarnation after the restore = %s, %v; want %s", got, err, third)
	}
	if got := position(); got != 7 {
		t.Fatalf("position %d after the restore, want 7", got)
	}
	set(third.Add(time.Hour), 50, true)
	if seq, err := st.SnapshotSeq(ctx); err != nil || seq != 0 {
		t.Fatalf("SnapshotSeq = %d, %v in a stream created again, want 0", seq, err)
	}
	if restored, err := st.Restored(ctx); err != nil || !restored {
		t.Fatalf("Restored = %v, %v after the stream moved on, want true", restored, err)
	}

	// A snapshot that does not record its stream leaves the mirror's
	// unrecorded: the next stream met is taken for its.
	if err := st.Restore(ctx, backupTo(t, leader), store.SnapshotAt{Seq: 3}, store.Unverified); err != nil {
		t.Fatal(err)
	}
	if got, err := st.StreamIncarnation(ctx); err != nil || !got.IsZero() {
		t.Fatalf("StreamIncarnation after an unrecorded snapshot = %s, %v; want none", got, err)
	}
	set(first, 3, false)
	if got := position(); got != 3 {
		t.Fatalf("position %d, want the snapshot's 3", got)
	}
}

// TestRefill: a mirror that meets another stream keeps its checkpoints
// off (CheckpointState) until an audit of that stream has checked every
// event it held then, and asks the next audit to sweep. Events the audit
// still holds keep them off for RefillWait at most: a resource that
// changes within the duplicate window has its repair put off for as long,
// and must not keep every checkpoint off.
func TestRefill(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	mustApplyRepos(t, st, nginx())
	evs, err := st.Unpublished(ctx, 0, 100)
	if err != nil || len(evs) == 0 {
		t.Fatalf("events: %d, %v", len(evs), err)
	}
	var seqs []int64
	for _, e := range evs {
		seqs = append(seqs, e.Seq)
	}
	if err := st.MarkPublished(ctx, seqs); err != nil {
		t.Fatal(err)
	}
	last := seqs[len(seqs)-1]
	ready := func(want bool) {
		t.Helper()
		cs, err := st.CheckpointState(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if cs.Ready != want || (!want && !strings.HasPrefix(cs.Why, store.WhyRefill)) {
			t.Fatalf("checkpoint ready %v (%q), want %v", cs.Ready, cs.Why, want)
		}
	}
	first := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	second := first.Add(time.Hour)
	if _, err := st.SetStreamIncarnation(ctx, first, 10); err != nil {
		t.Fatal(err)
	}
	ready(true)
	if moved, err := st.SetStreamIncarnation(ctx, second, 10); err != nil || !moved {
		t.Fatalf("moved %v, %v", moved, err)
	}
	ready(false)
	if rec, err := st.AuditStream(ctx); err != nil || !rec.Refill {
		t.Fatalf("audit_stream %+v, %v: want the next audit asked to sweep", rec, err)
	}

	end := func(position int64, held []store.HeldEvent, created time.Time) {
		t.Helper()
		if err := st.SetAuditPosition(ctx, position, 1, held); err != nil {
			t.Fatal(err)
		}
		if err := st.SetAuditStream(ctx, store.AuditStream{Created: created, LastSeq: 1}, false); err != nil {
			t.Fatal(err)
		}
	}
	end(last-1, nil, second) // not through the log yet
	ready(false)
	end(last, nil, first) // an audit of the stream before
	ready(false)
	held := []store.HeldEvent{{Seq: last, Subject: "repo.g1/r1"}}
	end(last, held, second) // through, a repair put off
	ready(false)
	clk.Advance(store.RefillWait)
	end(last, held, second)
	ready(true)

	// Nothing held: the audit that is through ends it at once.
	if moved, err := st.SetStreamIncarnation(ctx, first, 10); err != nil || !moved {
		t.Fatalf("moved %v, %v", moved, err)
	}
	ready(false)
	end(last, nil, first)
	ready(true)
}

// TestSetStreamIncarnation_TheSweepAskedForOutlivesARunningAudit: the
// sweep a mirror that met another stream or a lost tail asks for is not
// written away by an audit that was running then and ends after (its
// record of the stream knows nothing of it); the next sweep's start takes
// it.
func TestSetStreamIncarnation_TheSweepAskedForOutlivesARunningAudit(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), false, store.Options{})
	first := time.Date(2026, 3, 1, 10, 0, 0, 0, time.UTC)
	if _, err := st.SetStreamIncarnation(ctx, first, 10); err != nil {
		t.Fatal(err)
	}
	if err := st.SetStreamSeq(ctx, 8); err != nil {
		t.Fatal(err)
	}
	running, err := st.AuditStream(ctx) // an audit begins
	if err != nil || running.Refill {
		t.Fatalf("before any move: %+v, %v", running, err)
	}
	if moved, err := st.SetStreamIncarnation(ctx, first, 0); err != nil || !moved {
		t.Fatalf("a lost tail: moved %v, %v", moved, err)
	}
	running.Created, running.LastSeq = first, 3
	if err := st.SetAuditStream(ctx, running, false); err != nil { // and ends
		t.Fatal(err)
	}
	if rec, err := st.AuditStream(ctx); err != nil || !rec.Refill {
		t.Fatalf("after the running audit's end: %+v, %v; want the sweep still asked for", rec, err)
	}
	if err := st.SetAuditStream(ctx, store.AuditStream{Created: first, LastSeq: 3}, true); err != nil {
		t.Fatal(err)
	}
	if rec, err := st.AuditStream(ctx); err != nil || rec.Refill {
		t.Fatalf("after a sweep began: %+v, %v; want no sweep asked for", rec, err)
	}
}
