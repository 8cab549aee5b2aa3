package store_test

import (
	"context"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestAuditEvents: the audit reads the log in seq order with each event's
// publication time (zero while it is in the outbox), a resource's events
// with their data, and keeps its position across a reopening.
func TestAuditEvents(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, path := openTemp(t, clk, false, store.Options{})
	repo := func(uid, name string) store.Repo {
		r := nginx()
		r.UID, r.Name = uid, name
		return r
	}
	mustApplyRepos(t, st, nginx(), repo("t1", "redis"), repo("t2", "postgres"))
	evs := allEvents(t, st)
	if len(evs) != 3 {
		t.Fatalf("events=%v, want three repo.created", types(evs))
	}
	// The first and the last are published, a second apart; the middle
	// one waits in the outbox.
	first := clk.Now()
	if err := st.MarkPublished(ctx, []int64{evs[0].Seq}); err != nil {
		t.Fatal(err)
	}
	clk.Advance(time.Second)
	if err := st.MarkPublished(ctx, []int64{evs[2].Seq}); err != nil {
		t.Fatal(err)
	}

	got, err := st.AuditEvents(ctx, 0, 10)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 {
		t.Fatalf("AuditEvents=%d events, want 3", len(got))
	}
	for i, want := range []time.Time{first, {}, first.Add(time.Second)} {
		if g := got[i]; g.Seq != evs[i].Seq || g.ID != evs[i].ID || g.Type != evs[i].Type || g.Subject != evs[i].Subject ||
			!g.Published.Equal(want) {
			t.Errorf("event %d = seq %d %s %s published %v, want seq %d %s %s published %v",
				i, g.Seq, g.ID, g.Type, g.Published, evs[i].Seq, evs[i].ID, evs[i].Type, want)
		}
	}
	if got, err := st.AuditEvents(ctx, evs[1].Seq, 10); err != nil || len(got) != 1 || got[0].Seq != evs[2].Seq {
		t.Errorf("AuditEvents after seq %d = %v, %v; want the last event alone", evs[1].Seq, got, err)
	}

	res, err := st.ResourceEvents(ctx, "t2", 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 1 || res[0].ID != evs[2].ID || len(res[0].Data) == 0 ||
		!res[0].Published.Equal(first.Add(time.Second)) {
		t.Errorf("ResourceEvents(t2) = %+v, want its repo.created with data, published a second after the first", res)
	}

	if pos, err := st.AuditPosition(ctx); err != nil || pos != 0 {
		t.Errorf("AuditPosition = %d, %v; want 0 before any audit", pos, err)
	}
	if err := st.SetAuditPosition(ctx, evs[1].Seq, 7, nil); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	st = mustOpen(t, path, store.Options{Now: clk.Now})
	if pos, err := st.AuditPosition(ctx); err != nil || pos != evs[1].Seq {
		t.Errorf("AuditPosition after reopening = %d, %v; want %d", pos, err, evs[1].Seq)
	}
	if v, err := st.Meta(ctx, store.AuditStreamSeqKey); err != nil || v != "7" {
		t.Errorf("meta %s = %q, %v; want 7", store.AuditStreamSeqKey, v, err)
	}
}
