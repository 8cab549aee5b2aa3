package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestAudit_AServerThatLostItsUnsyncedTail: the NATS server restarts
// having lost the stream's last acknowledged messages, as one that
// crashed before it synced them does (Jepsen's analysis of NATS 2.12.1),
// and the stream's next messages take their sequences. An audit had
// found every event on the stream before, so only the loss can have the
// leader publish them again. The leader's relay meets its next messages
// at sequences it had counted (or, started again with the server, the
// stream's last sequence below its mirror's position) and records the
// stream's position anew; the next audit goes through the whole log
// again and publishes the lost events again; the stream then holds every
// event of the leader's log. A follower that had read the lost messages
// before the crash, and one that starts afterwards, end equal to the
// leader.
func TestAudit_AServerThatLostItsUnsyncedTail(t *testing.T) {
	for _, c := range []struct {
		name    string
		restart bool // the leader's process too, with the server
		fenced  bool // a cluster's leader, its writes fenced by its lease term, KV buckets kept
	}{
		{"the leader stays up", false, false},
		{"the leader restarts with the server", true, false},
		{"a fenced leader stays up", false, true},
	} {
		t.Run(c.name, func(t *testing.T) { lostTail(t, c.restart, c.fenced) })
	}
}

func lostTail(t *testing.T, restart, fenced bool) {
	ctx := context.Background()
	ns := testutil.NATS(t)
	var mutate []func(*config.Config)
	if fenced {
		mutate = append(mutate, func(cfg *config.Config) {
			cfg.Cluster.Enabled, cfg.Cluster.NodeID = true, "leader-1"
			cfg.Cluster.LeaseTTL = config.Duration{Duration: 2 * time.Second}
			cfg.KV.Enabled = true
		})
	}
	app, sim, cfg, logs, stopLeader := startAuditedLeaderOn(t, ns, 33,
		platformsim.Rates{MoveTag: 80, Deprecate: 5, CreateTag: 5, CreateAdvisory: 4, UpdateAdvisory: 3}, mutate...)
	// The follower and the test have a connection of their own: the
	// leader's closes when it restarts.
	js := testutil.JetStream(t, ns.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	s, err := js.Stream(ctx, cfg.NATS.Stream)
	if err != nil {
		t.Fatal(err)
	}
	fst := followerStore(t)
	defer runFollower(t, js, fst, cfg, "read-the-tail", logs)()

	changes := func(app *daemon.App, n uint64) {
		t.Helper()
		from := streamLastAfterRestart(t, s)
		changeCtx, stop := context.WithCancel(ctx)
		changing := make(chan struct{})
		go func() { defer close(changing); sim.Run(changeCtx, 20*time.Millisecond, 1) }()
		testutil.WaitFor(t, 20*time.Second, "changes to reach the stream", func() bool {
			info, err := s.Info(ctx)
			return err == nil && info.State.LastSeq >= from+n
		})
		stop()
		<-changing
		caughtUp(t, app, sim)
	}
	changes(app, 20)
	last := streamLast(t, s)
	testutil.WaitFor(t, 20*time.Second, "the follower to read the stream's last message", func() bool {
		pos, _, err := fst.StreamPosition(ctx)
		return err == nil && pos >= last
	})
	// An audit checks every event on the stream before the crash.
	var logged int64
	if err := app.Store.Reader().QueryRowContext(ctx, `SELECT max(seq) FROM event_log`).Scan(&logged); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "an audit to check every event", func() bool {
		audit(t, app)
		rep := app.Auditor.Last()
		return rep.Position >= logged && rep.Repaired == 0
	})

	// The server crashes and comes back without the stream's last 8
	// messages.
	// (The leader may publish a checkpoint meanwhile: the stream is read
	// again just before the crash.)
	const n = 8
	if restart {
		stopLeader()
	}
	before := streamLast(t, s)
	ids := map[uint64]string{}
	for _, m := range streamEvents(t, s, before-n+1, before) {
		ids[m.seq] = m.event.ID
	}
	ns.Stop()
	lost := ns.LoseTail(cfg.NATS.Stream, n)
	ns.Start()
	if got := streamLastAfterRestart(t, s); got != lost[0]-1 {
		t.Fatalf("the stream's last sequence after the loss = %d, want %d", got, lost[0]-1)
	}
	var lostEvents []string
	for _, seq := range lost {
		if id, ok := ids[seq]; ok {
			lostEvents = append(lostEvents, id)
		} else if seq <= before {
			continue // a checkpoint
		} else {
			t.Logf("stream message %d, published as the server stopped, was lost unread", seq)
		}
	}
	if restart {
		app, _ = runLeader(t, cfg, logs)
	}

	// The data changes again: the relay's next messages take the lost
	// sequences, and the audits bring the lost events back.
	changes(app, n+5)
	defer func() {
		if t.Failed() {
			var keep []string
			for _, l := range strings.Split(logs.String(), "\n") {
				if !strings.Contains(l, "level=DEBUG") && !strings.Contains(l, "part=crawler") {
					keep = append(keep, l)
				}
			}
			t.Logf("the leader's log, crawls left out:\n%s", strings.Join(keep[max(0, len(keep)-150):], "\n"))
		}
	}()
	testutil.Eventually(t, 30*time.Second, func() error {
		audit(t, app)
		return streamHoldsTheLog(t, s, app.Store.Reader())
	})
	if !strings.Contains(logs.String(), `msg="stream audit: checking the whole event log again" part=audit why=`) {
		t.Errorf("no audit went through the whole log again after the loss:\n%s", grepLines(logs.String(), "part=audit"))
	}
	for _, id := range lostEvents {
		if !strings.Contains(logs.String(), "event missing from the stream published again\" part=audit id="+id) {
			t.Errorf("the log does not name lost event %s as published again", id)
		}
	}
	if fenced {
		// The lost writes put the term's markers in doubt; the lease was
		// the leader's (again, when the server's restart cost it the
		// lease), so it marked the term again and led on: no write taken
		// for a newer term's, no remark that failed.
		if !strings.Contains(logs.String(), "this term's markers are in doubt; marking the term again") {
			t.Error("the fenced leader did not doubt its term's markers")
		}
		for _, wrong := range []string{"another replica's lease term began", "marking the term again failed"} {
			if strings.Contains(logs.String(), wrong) {
				t.Errorf("the fenced leader logged %q:\n%s", wrong, grepLines(logs.String(), wrong))
			}
		}
	}
	testutil.Eventually(t, 30*time.Second, func() error { return testutil.SameMirror(fst.Reader(), app.Store.Reader()) })
	followerEqualsLeader(t, app, cfg)
	t.Logf("%d of the %d messages lost were events", len(lostEvents), n)
}

// streamLastAfterRestart is the stream's last sequence, asked until the
// server started again answers.
func streamLastAfterRestart(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	var last uint64
	testutil.Eventually(t, 10*time.Second, func() error {
		info, err := s.Info(context.Background())
		if err == nil {
			last = info.State.LastSeq
		}
		return err
	})
	return last
}
