package cluster_test

import (
	"context"
	"fmt"
	"testing"
	"time"

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
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(runCtx) }()
	t.Cleanup(func() {
		stop()
		if err := <-done; err != nil {
			t.Errorf("follower: %v", err)
		}
	})
	if err := js.DeleteConsumer(ctx, "EV", gapFollowerConfig.Consumer); err != nil {
		t.Fatal(err)
	}
	leader.change(3)
	leader.publish()
	testutil.Eventually(t, 10*time.Second, func() error {
		if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
			return fmt.Errorf("the follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
		}
		return nil
	})
	if _, err := js.Consumer(ctx, "EV", gapFollowerConfig.Consumer); err != nil {
		t.Errorf("the follower's consumer: %v, want it made again", err)
	}
}
