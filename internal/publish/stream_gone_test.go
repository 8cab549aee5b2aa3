package publish_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// startRelayOfItsOwn starts a server, a store and a relay publishing it
// to the stream, which the relay may not manage with checkOnly.
func startRelayOfItsOwn(t *testing.T, checkOnly bool) (*publish.Conn, *store.Store, *producer, *logBuffer) {
	t.Helper()
	srv := startServer(t, nil)
	logs := &logBuffer{}
	cfg := srv.config(logs.logger())
	conn := mustConnect(t, cfg)
	cfg.CheckStreamOnly = checkOnly
	st := mustOpenStore(t)
	startRelay(t, publish.NewRelay(conn.JS, st, cfg))
	return conn, st, newProducer(t, st), logs
}

// TestRelay_CreatesAStreamLostWholeAgain: the stream lost whole under a
// running relay (deleted here; NATS 2.12.1 lost streams to damaged
// snapshot files in Jepsen's analysis) is created again by the relay,
// which then publishes what was committed since; the log says so. (The
// audit's sweep publishes the rest again: TestAuditor_SweepsAStreamCreatedAgain.)
func TestRelay_CreatesAStreamLostWholeAgain(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	conn, st, p, logs := startRelayOfItsOwn(t, false)
	p.addRepos(ctx, "before", 2, 1)
	testutil.Eventually(t, 10*time.Second, unpublished(t, st))
	before := len(storedEvents(t, st))

	if err := conn.JS.DeleteStream(ctx, testStream); err != nil {
		t.Fatal(err)
	}
	p.addRepos(ctx, "after", 2, 1)
	testutil.Eventually(t, 30*time.Second, unpublished(t, st))
	s, err := conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatalf("the stream after the relay published again: %v", err)
	}
	if got, want := s.CachedInfo().State.Msgs, uint64(len(storedEvents(t, st))-before); got != want {
		t.Errorf("the stream created again holds %d messages, want the %d events committed after it was lost", got, want)
	}
	if !strings.Contains(logs.String(), "the stream was gone (lost by NATS, or deleted); created it again") {
		t.Errorf("the log does not say the stream was created again:\n%s", logs.String())
	}
}

// TestRelay_LeavesAStreamItMayNotManageGone: with manage_stream = false
// the relay does not create a lost stream again; it says so, and the
// events wait in the outbox.
func TestRelay_LeavesAStreamItMayNotManageGone(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	conn, st, p, logs := startRelayOfItsOwn(t, true)
	if err := conn.JS.DeleteStream(ctx, testStream); err != nil {
		t.Fatal(err)
	}
	p.addRepos(ctx, "orphan", 1, 1)
	testutil.WaitFor(t, 30*time.Second, "the relay to say the stream is gone", func() bool {
		return strings.Contains(logs.String(), "nats.manage_stream = false forbids syncd to create it")
	})
	if _, err := conn.JS.Stream(ctx, testStream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Errorf("look up the stream = %v, want it still gone", err)
	}
	if err := unpublished(t, st)(); err == nil {
		t.Error("the outbox is empty, want the events waiting for the stream")
	}
}

// TestRelay_GivesUpPublishesDroppedWithTheStream: publishes the server
// took and never answered, as it drops those in flight to a stream
// deleted under them (here a subscriber that takes the stream's subjects
// and answers nothing stands for the dying stream), would hold the pass
// for the client's 30 s publish timeout; once they waited the check's
// time the pass looks, finds the stream gone, gives them up, and the
// relay creates the stream again and publishes.
func TestRelay_GivesUpPublishesDroppedWithTheStream(t *testing.T) {
	ctx := context.Background()
	publish.SetGoneCheck(t, 200*time.Millisecond)
	conn, st, p, logs := startRelayOfItsOwn(t, false)
	if err := conn.JS.DeleteStream(ctx, testStream); err != nil {
		t.Fatal(err)
	}
	sink, err := conn.NC.SubscribeSync(testPrefix + ".>")
	if err != nil {
		t.Fatal(err)
	}
	p.addRepos(ctx, "dropped", 1, 1)
	testutil.WaitFor(t, 10*time.Second, "the relay to create the stream again", func() bool {
		return strings.Contains(logs.String(), "created it again")
	})
	if err := sink.Unsubscribe(); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, unpublished(t, st))
	if !strings.Contains(logs.String(), "the stream is gone") {
		t.Errorf("the relay's log does not say the stream was gone:\n%s", logs.String())
	}
}
