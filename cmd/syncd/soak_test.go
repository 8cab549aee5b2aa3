package main

import (
	"context"
	"math/rand/v2"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestSoak runs syncd for SOAK_DURATION (make soak: 10 minutes) with
// continuous change and upstream faults, SIGKILLs and restarts it at seeded
// moments, stops NATS once for SOAK_NATS_OUTAGE, and checks convergence
// every minute: the mirror equals the ground truth and every move arrived
// exactly once, in order. It prints the figures at the end.
func TestSoak(t *testing.T) {
	d, err := time.ParseDuration(os.Getenv("SOAK_DURATION"))
	if err != nil {
		t.Skip("soak test: runs under make soak, which sets SOAK_DURATION (e.g. 10m)")
	}
	ns := testutil.NATS(t)
	w := newWorld(
		t,
		53,
		platformsim.Scale{Repos: 20, TagsPerRepo: 5, HistoryPerTag: 50, Advisories: 20, PublicImages: -1},
		ns.URL(),
	)
	cfg := w.config()
	rng := rand.New(rand.NewPCG(53, 1))
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "run", "--config", cfg)
		cmd.Env = append(os.Environ(), execMainEnv+"=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd := start()
	waitBaseline(w.t, w.dbPath)
	rcv := consume(ctx, t, w.natsURL)
	w.sim.SetRates(changesOnly())
	faults := platformsim.Fault{Pattern: "*", ErrorRate: 0.10, RateLimitRate: 0.05, RetryAfter: time.Second,
		ResetRate: 0.02, TruncateRate: 0.01, LatencyExpMean: 10 * time.Millisecond}

	var changes, kills, checks int
	outageDone := false
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		minute := time.Now().Add(time.Minute)
		w.sim.SetFaults(faults)
		for time.Now().Before(minute) && time.Now().Before(end) {
			changes += len(w.sim.Step(1 + rng.IntN(3)))
			switch r := rng.IntN(100); {
			case r < 3:
				cmd.Process.Signal(syscall.SIGKILL)
				cmd.Wait()
				kills++
				cmd = start()
			case r < 4 && !outageDone:
				ns.Stop()
				outage := outageLength()
				stop := time.Now().Add(outage)
				for time.Now().Before(stop) {
					changes += len(w.sim.Step(1))
					time.Sleep(500 * time.Millisecond)
				}
				ns.Start()
				outageDone = true
				t.Logf("NATS was down for %s", outage)
			}
			time.Sleep(time.Duration(100+rng.IntN(400)) * time.Millisecond)
		}
		// Once a minute: quiet, then check that everything converged.
		w.sim.SetFaults()
		w.converge(rcv, 2*time.Minute)
		checks++
		t.Logf("check %d: converged; %d changes, %d kills so far", checks, changes, kills)
	}
	total, distinct := rcv.counts()
	t.Logf(
		"soak figures: duration %s, changes made %d, events delivered %d (distinct %d, duplicates seen by the consumer %d), restarts survived %d, NATS outages %d, convergence checks %d, failed upstream answers %d",
		d,
		changes,
		total,
		distinct,
		total-distinct,
		kills,
		map[bool]int{true: 1}[outageDone],
		checks,
		w.failures.Load(),
	)
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("syncd after SIGTERM: %v", err)
	}
}
