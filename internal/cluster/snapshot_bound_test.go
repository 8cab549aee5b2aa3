package cluster

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

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
	if _, err := download(ctx, obj, "mirror-bomb", path, bound, ""); !errors.Is(err, errSnapshotRefused) {
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
	if _, err := download(ctx, obj, "mirror-bomb", filepath.Join(t.TempDir(), "ok.db"), 64*bound, ""); err != nil {
		t.Errorf("download within the bound: %v", err)
	}
}
