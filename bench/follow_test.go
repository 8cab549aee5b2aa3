package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// followResult is what a follower joining late costs: applying the stream
// (the whole baseline the relay published) into an empty mirror, and
// writing and restoring a snapshot of the benchmark organization's mirror.
type followResult struct {
	Events int `json:"events"`
	// CatchUpSeconds is from the follower's start until its consumer had
	// nothing pending; ApplyPerSec is Events over it.
	CatchUpSeconds float64 `json:"catch_up_s"`
	ApplyPerSec    float64 `json:"apply_per_s"`
	// Ratio is ApplyPerSec over the same run's SQLite ceiling (rows/s):
	// an event applied is one row upserted and one logged.
	Ratio float64 `json:"ratio_to_sqlite_ceiling"`

	SnapshotRawBytes   int64   `json:"snapshot_raw_bytes"`
	SnapshotBytes      int64   `json:"snapshot_bytes"`
	SnapshotWriteSec   float64 `json:"snapshot_write_s"`
	SnapshotRestoreSec float64 `json:"snapshot_restore_s"`
}

// measureFollow runs a follower of the stream into an empty mirror, then
// writes a snapshot of src (the full-size mirror) and restores it into
// another empty mirror, as a follower does when it joins.
func measureFollow(
	ctx context.Context,
	conn *publish.Conn,
	src *store.Store,
	pcfg publish.Config,
	dir string,
	ceiling float64,
) (followResult, error) {
	var r followResult
	open := func(name string) (*store.Store, error) {
		return store.Open(ctx, filepath.Join(dir, name, "syncd.db"), store.Options{})
	}
	f, err := open("follower")
	if err != nil {
		return r, err
	}
	defer f.Close()
	fol := cluster.NewFollower(
		conn.JS,
		f,
		cluster.FollowerConfig{Stream: pcfg.Stream, SubjectPrefix: pcfg.SubjectPrefix, Consumer: "bench-follower",
			MaxWait: 200 * time.Millisecond, OnBatch: func(applied int, _ uint64) { r.Events += applied }},
	)
	start := time.Now()
	if err := fol.CatchUp(ctx); err != nil {
		return r, fmt.Errorf("follow the stream: %w", err)
	}
	r.CatchUpSeconds = time.Since(start).Seconds()
	r.ApplyPerSec = float64(r.Events) / r.CatchUpSeconds
	r.Ratio = r.ApplyPerSec / ceiling

	snaps := cluster.NewSnapshotter(
		conn.JS,
		src,
		cluster.SnapshotConfig{Bucket: "bench_snapshots", Stream: pcfg.Stream, Every: time.Hour, Keep: 1, Dir: dir},
	)
	info, err := snaps.Write(ctx, nil)
	if err != nil {
		return r, err
	}
	r.SnapshotRawBytes, r.SnapshotBytes, r.SnapshotWriteSec = info.RawBytes, info.Bytes, info.Took.Seconds()
	g, err := open("restored")
	if err != nil {
		return r, err
	}
	defer g.Close()
	restorer := cluster.NewFollower(
		conn.JS,
		g,
		cluster.FollowerConfig{Stream: pcfg.Stream, SubjectPrefix: pcfg.SubjectPrefix, Consumer: "bench-restored",
			MaxWait: 200 * time.Millisecond, SnapshotBucket: "bench_snapshots", SnapshotDir: dir},
	)
	if err := restorer.CatchUp(ctx); err != nil {
		return r, fmt.Errorf("restore the snapshot: %w", err)
	}
	if restorer.Restored().Name == "" {
		return r, fmt.Errorf("the follower did not restore the snapshot")
	}
	r.SnapshotRestoreSec = restorer.Restored().Took.Seconds()
	return r, nil
}
