package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkSnapshotRestore is the snapshot row of BenchmarkSyncd alone: a
// mirror syncs the organization and writes a signed snapshot, and then,
// b.N times, a follower that verifies its key restores it into an empty
// mirror:
//
//	BENCH_SCALE=0.1 go test -run '^$' -bench '^BenchmarkSnapshotRestore$' -benchtime 3x ./bench/
func BenchmarkSnapshotRestore(b *testing.B) {
	p, dir := setUp(b)
	ctx := context.Background()
	o := startOrg(orgScale(p.Scale))
	defer o.Close()
	l, conn, pcfg := publishedMirror(ctx, b, o, p, dir)
	info, v, err := writeSnapshot(ctx, conn, l.store, pcfg, dir)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(os.Stderr, "snapshot: %d bytes (%d raw), written in %.2f s\n", info.Bytes, info.RawBytes,
		info.Took.Seconds())
	b.ResetTimer()
	for i := range b.N {
		r, err := restoreSnapshot(ctx, conn, pcfg, filepath.Join(dir, fmt.Sprintf("restored-%d", i)),
			fmt.Sprintf("bench-restored-%d", i), v)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "restore: %.2f s, of which download and decompress %.2f s: ratio %.2f\n",
			r.Took.Seconds(), r.Download.Seconds(), r.Took.Seconds()/r.Download.Seconds())
		b.ReportMetric(r.Took.Seconds()/r.Download.Seconds(), "restore/decompress")
	}
}
