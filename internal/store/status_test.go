package store_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestStatus reports what the mirror holds: rows per table, each job's
// latest run, every subscription, failing scopes, the outbox backlog and
// what cluster mode recorded.
func TestStatus(t *testing.T) {
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	ctx := context.Background()
	repo := nginx()
	mustApplyRepos(t, st, repo)
	mustApplyTags(t, st, repo, tag(repo.UID+"/t1", "latest", 1))
	run, err := st.StartRun(ctx, "crawl")
	if err != nil {
		t.Fatal(err)
	}
	run.Requests = 7
	if err := st.FinishRun(ctx, run, errors.New("upstream said no")); err != nil {
		t.Fatal(err)
	}
	if err := st.UpsertSubscription(ctx, store.Subscription{UID: "org1/s1", GroupUID: "org1", Sink: "https://sink.example.com"}); err != nil {
		t.Fatal(err)
	}
	if err := st.DeleteSubscription(ctx, "org1/s1"); err != nil {
		t.Fatal(err)
	}
	if err := st.SetMeta(ctx, "role", "standby"); err != nil {
		t.Fatal(err)
	}
	s, err := st.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Tables["repos"] != 1 || s.Tables["tags"] != 1 || s.Tables["crawl_runs"] != 1 ||
		len(s.Tables) != len(store.StatusTables) {
		t.Errorf("tables = %v", s.Tables)
	}
	if len(s.Runs) != 1 || s.Runs[0].Job != "crawl" || s.Runs[0].Outcome != store.OutcomeFailed ||
		s.Runs[0].Requests != 7 ||
		s.Runs[0].Error != "upstream said no" {
		t.Errorf("runs = %+v", s.Runs)
	}
	if len(s.Subscriptions) != 1 || s.Subscriptions[0].Sink != "https://sink.example.com" ||
		s.Subscriptions[0].Deleted.IsZero() {
		t.Errorf("subscriptions = %+v, want the removed one", s.Subscriptions)
	}
	if s.Unpublished == 0 || !s.OldestUnpublished.Equal(clk.Now().Truncate(time.Millisecond)) {
		t.Errorf("unpublished = %d, oldest %s; want the events recorded at %s", s.Unpublished, s.OldestUnpublished, clk.Now())
	}
	if s.Role != "standby" || s.LeaseHolder != "" {
		t.Errorf("role %q, lease holder %q", s.Role, s.LeaseHolder)
	}
}
