package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// lastLogged is the seq of the last event of app's log.
func lastLogged(t *testing.T, app *daemon.App) int64 {
	t.Helper()
	var seq int64
	if err := app.Store.Reader().QueryRow(`SELECT COALESCE(MAX(seq), 0) FROM event_log`).Scan(&seq); err != nil {
		t.Fatal(err)
	}
	return seq
}

// TestAudit_RefillsAStreamLostWhole: the stream is lost whole under a
// running leader while the data changes upstream (deleted here; Jepsen's
// analysis of NATS 2.12.1 saw damaged snapshot files lose streams). The
// leader's relay creates it again and publishes on, and its audits sweep
// the whole log: the stream then holds every event of the leader's log
// once, each resource's in order, and a follower started afterwards, from
// the stream alone into an empty mirror, equals the leader.
func TestAudit_RefillsAStreamLostWhole(t *testing.T) {
	ctx := context.Background()
	app, sim, cfg, logs := startAuditedLeader(t, 29,
		platformsim.Rates{MoveTag: 80, Deprecate: 5, CreateTag: 5, UpdateRepo: 3, CreateAdvisory: 4})
	// The audits check every event of the first sync: a loss after that is
	// a sweep's to find.
	last := lastLogged(t, app)
	testutil.WaitFor(t, 20*time.Second, "the audits to check the first sync's events", func() bool {
		audit(t, app)
		return app.Auditor.Last().Position == last
	})

	// The data changes; the stream is lost between two of the relay's
	// passes (one with publishes in flight waits out the client's 30 s
	// publish timeout first: docs/cluster.md), and the changes go on.
	changes := func() (stop func()) {
		changeCtx, stopChanges := context.WithCancel(ctx)
		changing := make(chan struct{})
		go func() { defer close(changing); sim.Run(changeCtx, 20*time.Millisecond, 1) }()
		return func() { stopChanges(); <-changing }
	}
	stop := changes()
	s, err := app.NATS.JS.Stream(ctx, cfg.NATS.Stream)
	if err != nil {
		t.Fatal(err)
	}
	first := streamLast(t, s)
	testutil.WaitFor(t, 20*time.Second, "moves to reach the stream", func() bool { return streamLast(t, s) >= first+6 })
	stop()
	caughtUp(t, app, sim)
	if err := app.NATS.JS.DeleteStream(ctx, cfg.NATS.Stream); err != nil {
		t.Fatal(err)
	}
	stop = changes()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(logs.String(), "the stream was gone (lost by NATS, or deleted); created it again") {
		if time.Now().After(deadline) {
			t.Fatalf("the relay did not create the stream again within 20s:\n%s",
				tail(grepLines(logs.String(), "part=publish"), 40))
		}
		time.Sleep(20 * time.Millisecond)
	}
	stop()
	caughtUp(t, app, sim)
	s, err = app.NATS.JS.Stream(ctx, cfg.NATS.Stream)
	if err != nil {
		t.Fatal(err)
	}
	// The sweep publishes at once what is older than the window, and the
	// resources whose later events are younger once they are not.
	testutil.Eventually(t, 30*time.Second, func() error {
		audit(t, app)
		return streamHoldsTheLog(t, s, app.Store.Reader())
	})
	if !strings.Contains(logs.String(), "the stream was created again") {
		t.Errorf("the audit's log does not say why it went through the whole log again:\n%s",
			grepLines(logs.String(), "audit"))
	}
	if got := counter(t, app, "syncd_stream_repaired_total"); got == 0 {
		t.Error("syncd_stream_repaired_total = 0, want the events published again counted")
	}
	if got := counter(t, app, "syncd_stream_sweeps_total"); got == 0 {
		t.Error("syncd_stream_sweeps_total = 0, want the sweep of the stream created again counted")
	}
	followerEqualsLeader(t, app, cfg)
}
