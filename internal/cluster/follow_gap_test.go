package cluster_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
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
	f, follower := caughtUpFollower(t, js, leader)
	cons, err := js.Consumer(ctx, "EV", "f1")
	if err != nil {
		t.Fatal(err)
	}
	lose := func() {
		t.Helper()
		takeDeliveries(t, cons, 1, 1, "the next one")
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

// TestFollower_TailLostWhileFollowing: a follower that is following, not
// catching up, and was just restarted, loses the stream's last messages on
// their way (fetched by
// another client of its durable consumer, never acknowledged), with nothing
// after them. It reads them from the stream at its next empty fetch, which
// finds them delivered and unacknowledged, instead of waiting out the 30 s
// AckWait: a fetch whose wait ends as a batch arrives drops the batch the
// same way, and the three-node test's standby stayed behind its leader for
// the AckWait after such a loss.
func TestFollower_TailLostWhileFollowing(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	js, leader := newStreamLeader(t)
	f, follower := caughtUpFollower(t, js, leader)
	// Lost while the follower is not fetching, so that nothing but the
	// other client can take them.
	leader.change(2)
	leader.publish()
	cons, err := js.Consumer(ctx, "EV", "f1")
	if err != nil {
		t.Fatal(err)
	}
	takeDeliveries(t, cons, 10, 4, "two new tags: tag.created and history.recorded each")
	// A restarted process: a new follower of the same mirror and consumer,
	// which learns from the mirror where it stands.
	f = cluster.NewFollower(js, follower, gapFollowerConfig)
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	start := time.Now()
	testutil.WaitFor(t, 10*time.Second, "the follower to hold the lost tail", func() bool {
		return mirrorRows(t, leader.st) == mirrorRows(t, follower)
	})
	t.Logf("the lost tail applied after %s (AckWait 30s)", time.Since(start).Round(time.Millisecond))
}

// gapFollowerConfig is the follower of the gap tests: consumer f1 of EV.
var gapFollowerConfig = cluster.FollowerConfig{
	Stream:        "EV",
	SubjectPrefix: "ev",
	Consumer:      "f1",
	MaxWait:       200 * time.Millisecond,
}

// caughtUpFollower returns a follower of gapFollowerConfig into a new
// mirror, caught up with three changes of leader's.
func caughtUpFollower(t *testing.T, js jetstream.JetStream, leader *leaderMirror) (*cluster.Follower, *store.Store) {
	t.Helper()
	follower, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	f := cluster.NewFollower(js, follower, gapFollowerConfig)
	leader.change(3)
	leader.publish()
	if err := f.CatchUp(context.Background()); err != nil {
		t.Fatal(err)
	}
	return f, follower
}

// TestFollower_ReplacesAConsumerThatStartsElsewhere: a durable consumer of
// the follower's name that starts at another sequence than the mirror
// (left from before a restore whose deletion never reached the stream, as
// in a partition) cannot be updated to the mirror's start; the follower
// replaces it instead of failing every attempt to follow or to lead.
func TestFollower_ReplacesAConsumerThatStartsElsewhere(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(3)
	leader.publish()
	left := func(description string) {
		t.Helper()
		if err := js.DeleteConsumer(ctx, "EV", gapFollowerConfig.Consumer); err != nil &&
			!errors.Is(err, jetstream.ErrConsumerNotFound) {
			t.Fatal(err)
		}
		if _, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{
			Durable:       gapFollowerConfig.Consumer,
			Description:   description,
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy,
			OptStartSeq:   2,
			AckPolicy:     jetstream.AckExplicitPolicy,
		}); err != nil {
			t.Fatal(err)
		}
	}
	follower, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	// A consumer of the name that is not a follower's is someone else's:
	// it is left alone, and the error says so.
	left("another application's")
	if err := cluster.NewFollower(js, follower, gapFollowerConfig).CatchUp(ctx); err == nil ||
		!strings.Contains(err.Error(), "same consumer name") {
		t.Fatalf("catch up with another application's consumer of the same name: %v; want it refused, named", err)
	}
	if _, err := js.Consumer(ctx, "EV", gapFollowerConfig.Consumer); err != nil {
		t.Fatalf("another application's consumer was deleted: %v", err)
	}
	left("syncd follower mirror")
	f := cluster.NewFollower(js, follower, gapFollowerConfig)
	if err := f.CatchUp(ctx); err != nil {
		t.Fatalf("catch up with a consumer of the same name starting at 2: %v", err)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Fatalf("the follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
	c, err := js.Consumer(ctx, "EV", gapFollowerConfig.Consumer)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.CachedInfo().Config.DeliverPolicy; got != jetstream.DeliverAllPolicy {
		t.Fatalf("the consumer's deliver policy is %v, want all (replaced)", got)
	}
}

// TestFollower_FirstDeliveryLostOnTheWay: a new follower, its mirror
// empty, loses the first messages its consumer delivers (here fetched by
// another client of the same durable consumer, never acknowledged, as a
// first fetch cut short by its wait drops them). Its catch-up reads them
// from the stream before the messages that follow, as it does for a gap
// later on; before, with no position to measure the gap from, it ended
// without them (a follower benchmark's catch-up lacked 2,237 events), and
// they came after the 30 s AckWait, behind later events.
func TestFollower_FirstDeliveryLostOnTheWay(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(3)
	leader.publish()
	cfg := gapFollowerConfig
	cfg.Consumer = "f-new"
	// The durable consumer as the follower makes it.
	cons, err := js.CreateOrUpdateConsumer(ctx, "EV", jetstream.ConsumerConfig{
		Durable:       cfg.Consumer,
		Description:   "syncd follower mirror",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		FilterSubject: cfg.SubjectPrefix + ".>",
		MaxAckPending: 4000,
	})
	if err != nil {
		t.Fatal(err)
	}
	takeDeliveries(t, cons, 2, 2, "the first two")
	follower, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	if err := cluster.NewFollower(js, follower, cfg).CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Fatalf("the new follower differs from the leader after its catch-up:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
}

// TestFollower_ABatchSlowerThanTheWaitIsWhole: over a link whose round
// trip (300 ms) is longer than the fetch's wait (100 ms), every batch
// arrives after the wait. The server ends the wait (FetchMaxWait), behind
// the messages it sent, so the follower takes each batch whole. A fetch
// ended by the client's own context dropped every such batch on arrival,
// and the follower read the whole stream again a message at a time
// ("events the consumer skipped were read from the stream").
func TestFollower_ABatchSlowerThanTheWaitIsWhole(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(20)
	leader.publish()
	proxy := testutil.NewFaultProxy(t, strings.TrimPrefix(js.Conn().ConnectedUrl(), "nats://"))
	fjs := testutil.JetStream(t, "nats://"+proxy.Addr())
	proxy.Latency(150 * time.Millisecond)
	follower, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	var logs testutil.Buffer
	cfg := gapFollowerConfig
	cfg.Consumer, cfg.MaxWait, cfg.Logger = "f-slow", 100*time.Millisecond, slog.New(slog.NewTextHandler(&logs, nil))
	if err := cluster.NewFollower(fjs, follower, cfg).CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Fatalf("the follower differs from the leader after its catch-up:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
	if out := logs.String(); strings.Contains(out, "read from the stream") {
		t.Errorf("the follower read what its fetches dropped from the stream:\n%s", out)
	}
}

// TestFollower_ACatchUpWithNothingPendingDoesNotWait: a catch-up whose
// consumer has nothing pending ends without a fetch, which would come back
// empty only after MaxWait (here an hour; 1 s by default, the wait a
// restored mirror's start paid for nothing).
func TestFollower_ACatchUpWithNothingPendingDoesNotWait(t *testing.T) {
	js, leader := newStreamLeader(t)
	follower, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	cfg := gapFollowerConfig
	cfg.MaxWait = time.Hour
	f := cluster.NewFollower(js, follower, cfg)
	catchUp := func(what string) {
		t.Helper()
		// Far below MaxWait: a fetch sent with nothing to deliver ends
		// with this context, failing the catch-up.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := f.CatchUp(ctx); err != nil {
			t.Fatalf("%s: %v", what, err)
		}
		if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
			t.Fatalf("%s: the follower differs from the leader:\nleader:\n%s\nfollower:\n%s", what, l, fo)
		}
	}
	leader.change(2)
	leader.publish()
	catchUp("messages pending")
	catchUp("nothing pending")
	leader.change(1)
	leader.publish()
	catchUp("more messages pending")
	catchUp("nothing pending again")
}

// TestFollower_ALostCheckpointIsCompared: a checkpoint the consumer
// delivered but the follower never received (here fetched by another
// client of its durable consumer) is read from the stream with the events
// around it, and compared there: a mirror changed behind the follower's
// back is found diverged. Before, a read of the stream passed checkpoints
// over, and a promotion whose catch-up read the stream's tail led without
// comparing its last one.
func TestFollower_ALostCheckpointIsCompared(t *testing.T) {
	ctx := context.Background()
	js, leader, relay, _ := newSnapshottingLeader(t, "leader")
	leader.change(2)
	publishCheckpoint(t, relay)
	path := filepath.Join(t.TempDir(), "follower.db")
	follower, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	f := cluster.NewFollower(js, follower, gapFollowerConfig)
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if r, ok := f.LastCheckpoint(); !ok || r.Diff != "" {
		t.Fatalf("the first checkpoint: %+v (%v), want one matched", r, ok)
	}

	forgeTag(t, path)
	leader.change(1)
	seq := publishCheckpoint(t, relay)
	cons, err := js.Consumer(ctx, "EV", "f1")
	if err != nil {
		t.Fatal(err)
	}
	takeDeliveries(t, cons, 10, 3, "tag.created, history.recorded, the checkpoint")
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	r, ok := f.LastCheckpoint()
	if !ok || r.Seq != seq {
		t.Fatalf("the last checkpoint compared: %+v (%v), want the one at stream seq %d", r, ok, seq)
	}
	if r.Diff == "" || !f.Diverged() {
		t.Fatalf("the forged mirror matched the checkpoint read from the stream: %+v", r)
	}
}

// pendingOnTheStream is how many messages the consumer cons (of the
// stream EV, whose messages all match its filter) has yet to deliver: the
// messages after the last it delivered, once its count of pending
// messages has caught up with them. The server counts a consumer's
// pending messages as the stream signals it of new ones, after their
// publications were acknowledged: read once right after a publish, the
// count was 0 in one run of the cluster package under load.
func pendingOnTheStream(t *testing.T, js jetstream.JetStream, cons jetstream.Consumer) int {
	t.Helper()
	ctx := context.Background()
	var pending uint64
	testutil.WaitFor(t, 10*time.Second, "the consumer to count the stream's new messages", func() bool {
		stream, err := js.Stream(ctx, "EV")
		if err != nil {
			return false
		}
		si, err := stream.Info(ctx)
		if err != nil {
			return false
		}
		ci, err := cons.Info(ctx)
		if err != nil || si.State.LastSeq <= ci.Delivered.Stream {
			return false
		}
		pending = ci.NumPending
		return pending == si.State.LastSeq-ci.Delivered.Stream
	})
	return int(pending)
}

// takeDeliveries fetches up to max messages from cons, as another client
// of a follower's durable consumer, and never acknowledges them: lost for
// the follower until the AckWait. It fails the test unless want came.
func takeDeliveries(t *testing.T, cons jetstream.Consumer, max, want int, what string) {
	t.Helper()
	batch, err := cons.Fetch(max, jetstream.FetchMaxWait(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for range batch.Messages() {
		n++
	}
	if n != want {
		t.Fatalf("took %d messages, want %d (%s) (%v)", n, want, what, batch.Error())
	}
}

// TestFollower_AGapBeforeControlRecordsAlone: deliveries lost on the way
// (a fetch lost to a stream leader's failure), and then a batch of
// control records alone (a new term's markers, which a failover lays just
// when deliveries get lost; a snapshot's record). The batch applies
// nothing, but the events before it are read from the stream all the
// same: before, the follower's position moved past them with the batch,
// and they came only after the consumer's 30 s AckWait, after a
// promotion's catch-up had ended.
func TestFollower_AGapBeforeControlRecordsAlone(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	f, follower := caughtUpFollower(t, js, leader)
	cons, err := js.Consumer(ctx, "EV", "f1")
	if err != nil {
		t.Fatal(err)
	}
	leader.change(2)
	leader.publish()
	pending := pendingOnTheStream(t, js, cons)
	takeDeliveries(t, cons, pending, pending, "the change's events")
	for range 3 {
		if _, err := js.Publish(ctx, "ev._term", []byte(`{"node":"other"}`)); err != nil {
			t.Fatal(err)
		}
	}
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Fatalf("the follower differs from the leader after its catch-up:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
}
