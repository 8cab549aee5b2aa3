//go:build memory.counters

// SQLite's own allocations in BENCH_MEMTRACE's lines, with the allocator's
// counters, which need their build tag:
//
//	BENCH_MEMTRACE=1 go test -tags memory.counters -run '^$' -bench '^BenchmarkMemory$' -benchtime 1x ./bench/

package bench

import (
	"fmt"

	"modernc.org/libc"
)

func init() {
	extraMemTrace = func() string {
		m := libc.MemStat()
		return fmt.Sprintf("  sqlite malloc %.1f MB in %d allocs, %d mmaps", float64(m.Bytes)/(1<<20), m.Allocs, m.Mmaps)
	}
}
