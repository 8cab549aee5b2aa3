package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestFollower_AScopeThatBeginsWithAnUnderscoreIsApplied: a repo whose
// name begins with "_" has events on <prefix>.<resource>.<action>._name
// (EscapeToken keeps '_'); they are a resource's events, not the leader's
// control records (<prefix>._checkpoint, ._term, ._snapshot), and a
// follower applies them.
func TestFollower_AScopeThatBeginsWithAnUnderscoreIsApplied(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	at := time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC)
	repo := store.Repo{UID: "g/r2", Name: "_internal", CreateTime: at, UpdateTime: at}
	if _, err := leader.st.ApplyRepos(ctx, []store.Repo{leader.repo, repo}); err != nil {
		t.Fatal(err)
	}
	testutil.AnnounceTags(t, leader.st, repo, []store.Tag{{UID: "g/r2/t1", Name: "v1",
		Digest:     "sha256:" + "1111111111111111111111111111111111111111111111111111111111111111",
		CreateTime: at, UpdateTime: at}})
	leader.change(1)
	leader.publish()

	follower := openFollowerStore(t, store.Options{})
	f := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond})
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Fatalf("the follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
}
