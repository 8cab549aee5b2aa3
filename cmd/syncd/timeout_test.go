package main

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestSyncOnce_GivesUpOnUnreachableServices: "syncd sync --once" waits
// for an unreachable NATS server, or an unreachable platform, for one
// bound (--timeout, or [sync] timeout), then exits 1 with the same
// "giving up after N attempts" message; it waited for NATS for ever (a
// cron job that never ends).
func TestSyncOnce_GivesUpOnUnreachableServices(t *testing.T) {
	t.Parallel() // it mostly waits: see "Parallel tests" in harness_test.go
	_, simURL := startSim(t, 31, platformsim.Scale{Repos: 2, TagsPerRepo: 1, HistoryPerTag: 2})
	ns := testutil.NATS(t)
	// Nothing listens on a port freePort had free.
	deadNATS, deadPlatform := "nats://"+freePort(t), "http://"+freePort(t)
	for _, tc := range []struct {
		name, simURL, natsURL string
		env                   []string
		flags                 []string
		want                  string
	}{
		{
			"NATSFlag",
			simURL,
			deadNATS,
			nil,
			[]string{"--timeout", "2s"},
			"connect to NATS at " + deadNATS + ": giving up after ",
		},
		{
			"NATSConfigKey",
			simURL,
			deadNATS,
			[]string{"SYNCD_SYNC_TIMEOUT=2s"},
			nil,
			"connect to NATS at " + deadNATS + ": giving up after ",
		},
		{"Platform", deadPlatform, ns.URL(), nil, []string{"--timeout", "2s"}, "giving up after "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := e2eConfig(t, tc.simURL, tc.natsURL, filepath.Join(t.TempDir(), "syncd.db"), "@hourly")
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			var out, errb syncBuffer
			start := time.Now()
			code := NewMain(&out, &errb, tc.env).Run(ctx, append([]string{"sync", "--once", "--config", cfg}, tc.flags...))
			took := time.Since(start)
			if code != exitFailure || !strings.Contains(errb.String(), tc.want) {
				t.Errorf(
					"sync --once exited %d after %s, want 1 saying %q; stderr:\n%s",
					code,
					took.Round(time.Millisecond),
					tc.want,
					errb.String(),
				)
			}
			if took > 15*time.Second {
				t.Errorf("sync --once took %s with a bound of 2s", took.Round(time.Millisecond))
			}
		})
	}
}
