package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestSyncOnce_RefusesFencedClusterConfig: "sync --once" holds no lease
// term, so with a cluster configuration every write would be refused
// (docs/cluster.md, "Fencing"); it says so before crawling anything.
func TestSyncOnce_RefusesFencedClusterConfig(t *testing.T) {
	sim, simURL := startSim(t, 7, platformsim.Scale{Repos: 1, TagsPerRepo: 1, HistoryPerTag: 1})
	ns := testutil.NATS(t)
	cfg := testConfig{
		simURL:        simURL,
		natsURL:       ns.URL(),
		dbPath:        filepath.Join(t.TempDir(), "syncd.db"),
		initialEvents: "snapshot",
	}.write(
		t,
	)
	body, err := os.ReadFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cfg, append(body, "\n[cluster]\nenabled = true\nnode_id = \"a\"\n"...), 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runMain(context.Background(), "sync", "--once", "--config", cfg)
	if code == exitOK || !strings.Contains(stderr, "does not write in cluster mode") {
		t.Errorf("sync --once with a cluster configuration exited %d; stderr:\n%s", code, stderr)
	}
	if n := sim.Stats().Total; n != 0 {
		t.Errorf("%d requests to the platform, want none", n)
	}
}
