package cluster_test

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/store"
)

// TestFollower_DeliveryLostOnTheWay: a message the consumer delivered but
// the follower never received (here fetched by another client of the same
// durable consumer, and never acknowledged) comes again only after the
// 30 s AckWait. The follower's catch-up does not wait for it: it reads the
// gap before the next messages from the stream, and, when the lost message
// was the stream's last, the tail, so that a promotion's catch-up leaves
// nothing out.
func TestFollower_DeliveryLostOnTheWay(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	follower, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	f := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1", MaxWait: 200 * time.Millisecond})
	leader.change(3)
	leader.publish()
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	cons, err := js.Consumer(ctx, "EV", "f1")
	if err != nil {
		t.Fatal(err)
	}
	lose := func() {
		t.Helper()
		batch, err := cons.Fetch(1, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for range batch.Messages() {
			n++ // received, never acknowledged: lost for the follower
		}
		if n != 1 {
			t.Fatalf("took %d messages, want 1 (%v)", n, batch.Error())
		}
	}
	// The stream also holds messages of other subjects, which the reads
	// of a gap pass over.
	stream, err := js.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	scfg := stream.CachedInfo().Config
	scfg.Subjects = append(scfg.Subjects, "other.>")
	if _, err := js.UpdateStream(ctx, scfg); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name          string
		before, after int
	}{{"a gap before the next messages", 1, 3}, {"the stream's last message", 1, 0}} {
		leader.change(c.before)
		leader.publish()
		lose()
		for range 3 {
			if _, err := js.Publish(ctx, "other.x", []byte("not a syncd event")); err != nil {
				t.Fatal(err)
			}
		}
		leader.change(c.after)
		leader.publish()
		if err := f.CatchUp(ctx); err != nil {
			t.Fatal(err)
		}
		if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
			t.Fatalf("%s: the follower differs from the leader after its catch-up:\nleader:\n%s\nfollower:\n%s", c.name, l, fo)
		}
	}
}
