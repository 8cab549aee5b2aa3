package cluster

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestDownload_Bounded: a small object in the bucket that decompresses far
// beyond the bound (a zstd bomb) is refused, having written no more than
// the bound to disk.
func TestDownload_Bounded(t *testing.T) {
	ctx := context.Background()
	js := testutil.JetStream(t, testutil.NATS(t).URL())
	obj, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "snaps"})
	if err != nil {
		t.Fatal(err)
	}
	const bound = 1 << 20
	var b bytes.Buffer
	enc, err := zstd.NewWriter(&b, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Write(make([]byte, 64*bound)); err != nil {
		t.Fatal(err)
	}
	enc.Close()
	if b.Len() > 32<<10 {
		t.Fatalf("the bomb is %d bytes compressed, want a small one", b.Len())
	}
	if _, err := obj.PutBytes(ctx, "mirror-bomb", b.Bytes()); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "mirror.db")
	if _, err := download(ctx, obj, "mirror-bomb", path, bound, "", false); !errors.Is(err, errSnapshotRefused) {
		t.Fatalf("download = %v, want refused", err)
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() > bound {
		t.Errorf("wrote %d bytes, more than the bound %d", fi.Size(), bound)
	}
	// Within the bound, it is taken whole.
	if _, err := download(ctx, obj, "mirror-bomb", filepath.Join(t.TempDir(), "ok.db"), 64*bound, "", false); err != nil {
		t.Errorf("download within the bound: %v", err)
	}
}

// stallingStore is an object store whose objects stop arriving after
// their first bytes, as over a connection that stalls: a read then waits
// until its context ends, as the object store's own reader does.
type stallingStore struct {
	jetstream.ObjectStore
	after int
}

func (s stallingStore) Get(
	ctx context.Context,
	name string,
	opts ...jetstream.GetObjectOpt,
) (jetstream.ObjectResult, error) {
	r, err := s.ObjectStore.Get(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return &stallingResult{ObjectResult: r, ctx: ctx, left: s.after}, nil
}

type stallingResult struct {
	jetstream.ObjectResult
	ctx  context.Context
	left int
}

func (r *stallingResult) Read(p []byte) (int, error) {
	if r.left <= 0 {
		<-r.ctx.Done()
		return 0, r.ctx.Err()
	}
	n, err := r.ObjectResult.Read(p[:min(len(p), r.left)])
	r.left -= n
	return n, err
}

// TestDownload_AStallIsGivenUp: a download whose object stops arriving is
// given up once nothing came for downloadStall, as a stall
// (errDownloadStalled), not as the snapshot's failure: an older snapshot
// would not be tried for it.
func TestDownload_AStallIsGivenUp(t *testing.T) {
	ctx := context.Background()
	js := testutil.JetStream(t, testutil.NATS(t).URL())
	obj, err := js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: "snaps"})
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	enc, err := zstd.NewWriter(&b, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Write(bytes.Repeat([]byte("a mirror's pages "), 1<<16)); err != nil {
		t.Fatal(err)
	}
	enc.Close()
	if _, err := obj.PutBytes(ctx, "mirror-stalls", b.Bytes()); err != nil {
		t.Fatal(err)
	}
	defer func(d time.Duration) { downloadStall = d }(downloadStall)
	downloadStall = 100 * time.Millisecond
	path := filepath.Join(t.TempDir(), "mirror.db")
	_, err = download(ctx, stallingStore{obj, b.Len() / 2}, "mirror-stalls", path, 1<<30, "", false)
	if !errors.Is(err, errDownloadStalled) || errors.Is(err, errSnapshotRefused) {
		t.Fatalf("a stalled download: %v, want errDownloadStalled and not a refusal", err)
	}
	// The same object, arriving whole, is taken.
	if _, err := download(ctx, obj, "mirror-stalls", filepath.Join(t.TempDir(), "ok.db"), 1<<30, "", false); err != nil {
		t.Errorf("the whole object: %v", err)
	}
}
