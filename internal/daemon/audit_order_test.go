package daemon_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestAudit_AFollowerThatReadPastALossEndsEqual: messages go missing from
// the stream (the first of each tag's changes while a follower was away),
// the follower comes back and reads past the gaps, applying the tags'
// later changes, and only then does the leader's audit repair the stream:
// the lost events published again, each tag's later ones deleted and
// published again behind them. The follower, which holds those later
// events already, applies them again after the late ones, as the stream
// now orders them, and ends equal to the leader with no snapshot to
// repair from (none is on here). Before, it kept each tag's late state,
// which only a repair from a snapshot put right. (Until the repair its
// checkpoint comparisons find it lacking the lost events, as it does.)
func TestAudit_AFollowerThatReadPastALossEndsEqual(t *testing.T) {
	ctx := context.Background()
	app, sim, cfg, logs := startAuditedLeader(t, 31, platformsim.Rates{MoveTag: 80, Deprecate: 5})
	s, err := app.NATS.JS.Stream(ctx, cfg.NATS.Stream)
	if err != nil {
		t.Fatal(err)
	}
	fst := followerStore(t)
	follow := func() func() { return runFollower(t, app.NATS.JS, fst, cfg, "past-the-loss", logs) }
	stop := follow()
	testutil.Eventually(t, 20*time.Second, func() error { return testutil.SameMirror(fst.Reader(), app.Store.Reader()) })
	stop()

	// The data changes while the follower is away.
	first := streamLast(t, s)
	changeCtx, stopChanges := context.WithCancel(ctx)
	changing := make(chan struct{})
	go func() { defer close(changing); sim.Run(changeCtx, 20*time.Millisecond, 1) }()
	testutil.WaitFor(t, 20*time.Second, "changes to reach the stream", func() bool { return streamLast(t, s) >= first+20 })
	stopChanges()
	<-changing
	caughtUp(t, app, sim)
	last := streamLast(t, s)
	// The first message of each tag that changed more than once is lost.
	seen := map[string]uint64{}
	var deleted []uint64
	for _, m := range streamEvents(t, s, first+1, last) {
		if !strings.HasPrefix(m.event.Type, "tag.") {
			continue
		}
		if at, ok := seen[m.event.Subject]; !ok {
			seen[m.event.Subject] = m.seq
		} else if at != 0 {
			if err := s.DeleteMsg(ctx, at); err != nil {
				t.Fatalf("delete stream message %d: %v", at, err)
			}
			deleted, seen[m.event.Subject] = append(deleted, at), 0
		}
	}
	if len(deleted) == 0 {
		t.Fatalf("no tag changed twice in stream messages %d..%d", first+1, last)
	}

	// The follower reads past the gaps, then the audit repairs them.
	stop = follow()
	defer stop()
	testutil.WaitFor(t, 20*time.Second, "the follower to read past the gaps", func() bool {
		pos, _, err := fst.StreamPosition(ctx)
		return err == nil && pos >= last
	})
	testutil.Eventually(t, 20*time.Second, func() error {
		audit(t, app)
		return streamHoldsTheLog(t, s, app.Store.Reader())
	})
	if got := counter(t, app, "syncd_stream_repaired_total"); got != float64(len(deleted)) {
		t.Errorf("syncd_stream_repaired_total = %v, want the %d messages deleted", got, len(deleted))
	}
	testutil.Eventually(t, 20*time.Second, func() error { return testutil.SameMirror(fst.Reader(), app.Store.Reader()) })
	t.Logf("%d of %d messages lost and repaired; %d audits logged", len(deleted), last-first,
		strings.Count(logs.String(), "part=audit"))
}
