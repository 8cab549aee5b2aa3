package cluster_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/store"
)

// TestFollower_MarksEventsPublishedWhenStored: a follower marks what it
// applies published when the stream stored it, not at its own clock (here
// an hour ahead, as a standby catching up an hour late is): the audit of a
// replica that leads reads the stream from an event's publication time.
func TestFollower_MarksEventsPublishedWhenStored(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(2)
	leader.publish()
	before := time.Now()

	late := func() time.Time { return time.Now().Add(time.Hour) }
	follower := openFollowerStore(t, store.Options{Now: late})
	f := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond})
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	evs, err := follower.AuditEvents(ctx, 0, 1000)
	if err != nil || len(evs) == 0 {
		t.Fatalf("follower's events = %d (%v), want the leader's", len(evs), err)
	}
	for _, e := range evs {
		if e.Published.IsZero() || e.Published.After(before) {
			t.Fatalf("event %s %s published %v, want when the stream stored it (before %v), not the follower's clock",
				e.Type, e.ID, e.Published, before)
		}
	}
}

// openFollowerStore opens an empty mirror for a follower in t's temporary
// directory, closed when t ends.
func openFollowerStore(t *testing.T, opts store.Options) *store.Store {
	t.Helper()
	st, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "follower.db"), opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return st
}
