package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestFollower_AConsumerDeletedIsMadeAgain: the follower's durable
// consumer deleted under it (by an operator, or lost by NATS) is made
// again, and the follower goes on applying the stream. Before, it fetched
// from the deleted consumer forever, every fetch answered "no responders".
func TestFollower_AConsumerDeletedIsMadeAgain(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	f, follower := caughtUpFollower(t, js, leader)
	runFollowing(t, f)
	if err := js.DeleteConsumer(ctx, "EV", gapFollowerConfig.Consumer); err != nil {
		t.Fatal(err)
	}
	leader.change(3)
	leader.publish()
	testutil.Eventually(t, 10*time.Second, func() error { return sameRows(t, leader.st, follower) })
	if _, err := js.Consumer(ctx, "EV", gapFollowerConfig.Consumer); err != nil {
		t.Errorf("the follower's consumer: %v, want it made again", err)
	}
}

// TestFollower_AStreamCreatedAgainIsFollowedFromItsStart: the stream lost
// whole under a running follower and created again counts its sequences
// from 1: the follower, its consumer gone with the stream, makes it again
// on the new stream from its first message, not from where the old one
// left it (which would pass over everything the new stream holds below
// that), and applies what the leader publishes there.
func TestFollower_AStreamCreatedAgainIsFollowedFromItsStart(t *testing.T) {
	js, leader := newStreamLeader(t)
	f, follower := caughtUpFollower(t, js, leader)
	leader.change(5) // the old stream's sequences reach past what the new one will hold
	leader.publish()
	runFollowing(t, f)
	testutil.Eventually(t, 10*time.Second, func() error { return sameRows(t, leader.st, follower) })
	testutil.RecreateStream(t, js, publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute})
	leader.change(2)
	leader.publish()
	testutil.Eventually(t, 10*time.Second, func() error { return sameRows(t, leader.st, follower) })
	// Its position counts the new stream: the checkpoints there are
	// compared, not passed over as before the position.
	testutil.Eventually(t, 10*time.Second, func() error {
		pos, _, err := follower.StreamPosition(context.Background())
		if last := streamInfo(t, js).State.LastSeq; err != nil || pos != last {
			return fmt.Errorf("the follower's position %d (%v), want the new stream's last, %d", pos, err, last)
		}
		return nil
	})
}

// sameRows fails unless the follower's resources are the leader's.
func sameRows(t *testing.T, leader, follower *store.Store) error {
	if l, fo := mirrorRows(t, leader), mirrorRows(t, follower); l != fo {
		return fmt.Errorf("the follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
	return nil
}

// runFollowing runs f until the test ends.
func runFollowing(t *testing.T, f *cluster.Follower) {
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("follower: %v", err)
		}
	})
}
