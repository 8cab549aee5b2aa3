package bench

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"time"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// syncIntervalResult is what the embedded server's JetStream sync_interval costs
// the relay: the same outbox relayed to an embedded server with each
// setting, on the same disk, in the same run.
type syncIntervalResult struct {
	Events int `json:"events"`
	// Dir is where the servers stored: its disk is what is measured.
	Dir string `json:"dir"`
	// LazyPerSec is the relay's rate with JetStream's own default (a
	// background fsync every 2 minutes); DefaultPerSec with syncd's (every
	// second); AlwaysPerSec with "always" (each message on disk before its
	// acknowledgement).
	LazyPerSec    float64 `json:"lazy_2m_per_s"`
	DefaultPerSec float64 `json:"default_1s_per_s"`
	AlwaysPerSec  float64 `json:"always_per_s"`
	// DefaultRatio and AlwaysRatio are their rates over the lazy one.
	DefaultRatio float64 `json:"default_ratio"`
	AlwaysRatio  float64 `json:"always_ratio"`
}

// measureSyncInterval relays events repo.created events (a mirror's
// first crawl announces one a resource) to an embedded server with each
// sync_interval. With "always" every message waits for an fsync, so the
// outbox is smaller than the relay's own measure: a few thousand events.
//
// The servers store under BENCH_SYNC_DIR, by default the system's
// temporary directory, not the benchmark's (/dev/shm where there is one):
// an fsync costs nothing in memory, and what is measured is its cost on a
// disk. The directory is removed after.
func measureSyncInterval(ctx context.Context, events int) (syncIntervalResult, error) {
	res := syncIntervalResult{Events: events}
	dir, err := os.MkdirTemp(cmp.Or(os.Getenv("BENCH_SYNC_DIR"), os.TempDir()), "syncd-bench-sync-")
	if err != nil {
		return res, err
	}
	defer os.RemoveAll(dir)
	res.Dir = dir
	for _, m := range []struct {
		name string
		sync publish.EmbeddedSync
		rate *float64
	}{
		{"lazy", publish.EmbeddedSync{Interval: 2 * time.Minute}, &res.LazyPerSec},
		{"default", publish.EmbeddedSync{}, &res.DefaultPerSec},
		{"always", publish.EmbeddedSync{Always: true}, &res.AlwaysPerSec},
	} {
		rate, err := relayWithSync(ctx, filepath.Join(dir, m.name), m.sync, events)
		if err != nil {
			return res, fmt.Errorf("relay with sync_interval %s: %w", m.sync, err)
		}
		*m.rate = rate
	}
	res.DefaultRatio, res.AlwaysRatio = res.DefaultPerSec/res.LazyPerSec, res.AlwaysPerSec/res.LazyPerSec
	return res, nil
}

// relayWithSync fills a new mirror's outbox with events creations and
// relays them to a new embedded server with sync, returning events/s.
func relayWithSync(ctx context.Context, dir string, sync publish.EmbeddedSync, events int) (float64, error) {
	st, err := store.Open(ctx, filepath.Join(dir, "syncd.db"), store.Options{})
	if err != nil {
		return 0, err
	}
	defer st.Close()
	if err := st.EndBaseline(ctx); err != nil {
		return 0, err
	}
	now := time.Now().UTC()
	for start := 0; start < events; start += 500 {
		var repos []store.Repo
		for i := start; i < min(start+500, events); i++ {
			repos = append(
				repos,
				store.Repo{
					UID:        fmt.Sprintf("org1/sync%06d", i),
					Name:       fmt.Sprintf("sync-%06d", i),
					CreateTime: now,
					UpdateTime: now,
				},
			)
		}
		if _, err := st.ApplyRepos(ctx, repos); err != nil {
			return 0, err
		}
	}
	pcfg := publishConfig(dir, "https://platform.bench/org1")
	pcfg.Sync = sync
	conn, err := publish.Connect(ctx, pcfg)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	runtime.GC()
	start := time.Now()
	if err := publish.NewRelay(conn.JS, st, pcfg).Flush(ctx); err != nil {
		return 0, err
	}
	return float64(events) / time.Since(start).Seconds(), nil
}
