package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// BenchmarkIngest is the full initial sync of BenchmarkSyncd alone, with
// its ceiling, and where the CPU went: the child's (syncd's) and this
// process's (the simulator's) user and system time during the sync. It is
// for working on ingest (BENCH_SCALE, BENCH_CPUPROFILE for the child,
// BENCH_SIMPROFILE for the simulator's side):
//
//	BENCH_SCALE=0.3 go test -run '^$' -bench '^BenchmarkIngest$' -benchtime 1x ./bench/
func BenchmarkIngest(b *testing.B) {
	p, dir := setUp(b)
	ctx := context.Background()
	o := startOrg(orgScale(p.Scale))
	defer o.Close()
	rows := 0
	truth := o.sim.Truth()
	for _, h := range truth.History {
		rows += len(h)
	}
	tags := len(truth.Tags)
	truth.History = nil
	ceiling, err := sqliteCeiling(ctx, dir, rows, tags, ceilingRowsPerTx)
	if err != nil {
		b.Fatal(err)
	}
	stop, err := startProfile(os.Getenv("BENCH_SIMPROFILE"))
	if err != nil {
		b.Fatal(err)
	}
	before := selfCPU()
	m, full, err := childSync(ctx, p, o, 1, filepath.Join(dir, "a"))
	sim := selfCPU() - before
	stop()
	if err != nil {
		b.Fatal(err)
	}
	rate := float64(full.HistoryRows) / full.WallSeconds
	fmt.Fprintf(
		os.Stderr,
		"ingest: %d rows in %.1f s = %.0f rows/s; SQLite loop %.0f rows/s; ratio %.2f; requests %d; child CPU %.1f s, simulator CPU %.1f s; peak RSS %.0f MB at %.1f s (Go heap peak %.0f MB)\n",
		full.HistoryRows,
		full.WallSeconds,
		rate,
		ceiling,
		rate/ceiling,
		full.Requests,
		m.CPUSeconds,
		sim.Seconds(),
		m.PeakMB,
		m.RSSPeakAtSeconds,
		m.GoHeapPeakMB,
	)
	b.ReportMetric(rate/ceiling, "ingest/ceiling")
	b.ReportMetric(full.WallSeconds, "sync-s")
	b.ReportMetric(m.CPUSeconds, "child-cpu-s")
	b.ReportMetric(sim.Seconds(), "sim-cpu-s")
}

// selfCPU is the user and system time this process has used.
func selfCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
