package cluster

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
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
	_, err = download(ctx, obj, "mirror-bomb", path, int64(b.Len()), bound, "", false)
	if !errors.Is(err, errSnapshotRefused) {
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
	if _, err := download(ctx, obj, "mirror-bomb", filepath.Join(t.TempDir(), "ok.db"), int64(b.Len()), 64*bound, "",
		false); err != nil {
		t.Errorf("download within the bound: %v", err)
	}
}

// timingOutStore is an object store whose objects stop arriving after
// their first bytes, as over a connection that stalls: a read then fails
// as nats.go's reader does at its context's deadline (nats.ErrTimeout).
type timingOutStore struct {
	jetstream.ObjectStore
	after int
}

func (s timingOutStore) Get(
	ctx context.Context,
	name string,
	opts ...jetstream.GetObjectOpt,
) (jetstream.ObjectResult, error) {
	r, err := s.ObjectStore.Get(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return &timingOutResult{ObjectResult: r, left: s.after}, nil
}

type timingOutResult struct {
	jetstream.ObjectResult
	left int
}

func (r *timingOutResult) Read(p []byte) (int, error) {
	if r.left <= 0 {
		return 0, nats.ErrTimeout
	}
	n, err := r.ObjectResult.Read(p[:min(len(p), r.left)])
	r.left -= n
	return n, err
}

// TestDownload_ADownloadThatDoesNotFinishIsNotRefused: a download past its
// deadline is given up as a failed download (errDownloadFailed), not as the
// snapshot's refusal, which would have the older ones tried and counted:
// over a real connection that stalls before the object comes (its
// deadline shortened), and when the object's reader times out midway.
// The deadline grows with the object's size.
func TestDownload_ADownloadThatDoesNotFinishIsNotRefused(t *testing.T) {
	ctx := context.Background()
	ns := testutil.NATS(t)
	proxy := testutil.NewFaultProxy(t, strings.TrimPrefix(ns.URL(), "nats://"))
	js := testutil.JetStream(t, "nats://"+proxy.Addr())
	obj, size := putCompressed(t, js, "mirror-slow")
	if got, want := downloadDeadline(200<<20), downloadFloor+200*time.Second; got != want {
		t.Errorf("the deadline of 200 MiB: %v, want %v", got, want)
	}

	_, err := download(ctx, timingOutStore{obj, int(size / 2)}, "mirror-slow", filepath.Join(t.TempDir(), "m.db"),
		size, 1<<30, "", false)
	if !errors.Is(err, errDownloadFailed) || errors.Is(err, errSnapshotRefused) {
		t.Errorf("a read that timed out midway: %v, want errDownloadFailed and not a refusal", err)
	}

	defer func(d time.Duration) { downloadFloor = d }(downloadFloor)
	downloadFloor = 300 * time.Millisecond
	proxy.Stall()
	_, err = download(ctx, obj, "mirror-slow", filepath.Join(t.TempDir(), "m.db"), size, 1<<30, "", false)
	if !errors.Is(err, errDownloadFailed) || errors.Is(err, errSnapshotRefused) {
		t.Errorf("over a stalled connection: %v, want errDownloadFailed and not a refusal", err)
	}
	proxy.Heal()
	downloadFloor = 10 * time.Second
	testutil.Eventually(t, 30*time.Second, func() error {
		_, err := download(ctx, obj, "mirror-slow", filepath.Join(t.TempDir(), "ok.db"), size, 1<<30, "", false)
		return err
	})
}

// putCompressed puts a zstd object of about a megabyte, named name, in a
// bucket "snaps" of js, and returns the bucket and the object's size.
func putCompressed(t *testing.T, js jetstream.JetStream, name string) (jetstream.ObjectStore, int64) {
	t.Helper()
	ctx := context.Background()
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
	if _, err := obj.PutBytes(ctx, name, b.Bytes()); err != nil {
		t.Fatal(err)
	}
	return obj, int64(b.Len())
}

// TestDownload_AStallOrAnEndIsNotWaitedOut: a download whose object stops
// coming is given up once downloadStall passes without a byte, and one
// whose context ends returns at once, without waiting for the download's
// deadline (10 s here, minutes for a large snapshot), which nats.go's
// blocked read would: a standby that gained the lease, or a process told
// to stop, waited that long. Neither counts as the snapshot's refusal.
func TestDownload_AStallOrAnEndIsNotWaitedOut(t *testing.T) {
	ctx := context.Background()
	ns := testutil.NATS(t)
	proxy := testutil.NewFaultProxy(t, strings.TrimPrefix(ns.URL(), "nats://"))
	js := testutil.JetStream(t, "nats://"+proxy.Addr())
	obj, size := putCompressed(t, js, "mirror-stalled")
	// The downloads given up go on until their deadline, writing here.
	dir, err := os.MkdirTemp("", "stalled-downloads-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })

	// A read blocked mid-object, as nats.go's is until its deadline
	// whatever its context (a stall of the connection, below, may block
	// before the first chunk, where the context is still heard).
	defer func(d time.Duration) { downloadStall = d }(downloadStall)
	downloadStall = time.Minute
	release := make(chan struct{})
	defer close(release)
	cctx, cancel := context.WithCancel(ctx)
	time.AfterFunc(200*time.Millisecond, cancel)
	ended := make(chan error, 1)
	go func() {
		_, err := downloadWatched(cctx, blockingStore{obj, release}, "mirror-stalled", filepath.Join(dir, "b.db"),
			size, 1<<30, "", false)
		ended <- err
	}()
	select {
	case err := <-ended:
		if !errors.Is(err, context.Canceled) {
			t.Errorf("a download whose context ended: %v, want context.Canceled", err)
		}
	case <-time.After(10 * time.Second):
		t.Error("a download blocked in a read had not returned 10 s after its context ended")
	}

	downloadStall = 300 * time.Millisecond
	proxy.Stall()
	start := time.Now()
	_, err = downloadWatched(ctx, obj, "mirror-stalled", filepath.Join(dir, "a.db"), size, 1<<30, "", false)
	if !errors.Is(err, errDownloadFailed) || errors.Is(err, errSnapshotRefused) {
		t.Errorf("a stalled download: %v, want errDownloadFailed and not a refusal", err)
	}
	if took := time.Since(start); took >= downloadFloor {
		t.Errorf("a stalled download was given up after %v, its deadline's %v", took, downloadFloor)
	}

	downloadStall = time.Minute
	proxy.Heal()
	testutil.Eventually(t, 30*time.Second, func() error {
		_, err := downloadWatched(ctx, obj, "mirror-stalled", filepath.Join(t.TempDir(), "ok.db"), size, 1<<30, "", false)
		return err
	})
}

// blockingStore is an object store whose objects' reads block until
// release closes, whatever their context.
type blockingStore struct {
	jetstream.ObjectStore
	release <-chan struct{}
}

func (s blockingStore) Get(
	ctx context.Context,
	name string,
	opts ...jetstream.GetObjectOpt,
) (jetstream.ObjectResult, error) {
	r, err := s.ObjectStore.Get(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	return blockingResult{r, s.release}, nil
}

type blockingResult struct {
	jetstream.ObjectResult
	release <-chan struct{}
}

func (r blockingResult) Read([]byte) (int, error) {
	<-r.release
	return 0, nats.ErrTimeout
}
