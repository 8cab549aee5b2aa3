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
// b.N times, a new follower that verifies its key starts from it (its
// mirror becomes the snapshot's file; reported), and another restores it
// into an open empty mirror, as a cluster replica does (printed):
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
		decompress, err := decompressToDisk(ctx, conn, info.Name, dir)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "download and decompression to disk alone: %.2f s (%.2f s before its sync)\n",
			decompress.Total.Seconds(), decompress.Written.Seconds())
		for _, opened := range []bool{false, true} {
			how := "a new follower's mirror file"
			if opened {
				how = "into an open empty mirror"
			}
			r, err := restoreSnapshot(ctx, conn, pcfg, filepath.Join(dir, fmt.Sprintf("restored-%d-%t", i, opened)),
				fmt.Sprintf("bench-restored-%d-%t", i, opened), v, opened)
			if err != nil {
				b.Fatal(err)
			}
			fmt.Fprintf(os.Stderr, "restore (%s): %.2f s, of which download and decompress %.2f s: "+
				"ratio to the decompression alone %.2f\n",
				how, r.Took.Seconds(), r.Download.Seconds(), r.Took.Seconds()/decompress.Total.Seconds())
			if !opened {
				b.ReportMetric(r.Took.Seconds()/decompress.Total.Seconds(), "restore/decompress")
			}
		}
	}
}
