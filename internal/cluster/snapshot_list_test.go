package cluster

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// stuckLister is an object store whose listing never answers the first
// `stuck` times it is asked, as a watcher that missed its last entry, and
// then lists one snapshot. A real bucket cannot be made to miss it on
// demand.
type stuckLister struct {
	jetstream.ObjectStore
	stuck int32
	calls atomic.Int32
	// empty makes the bucket's status say it holds nothing.
	empty bool
}

// sizedStatus is a bucket status that knows its size only.
type sizedStatus struct {
	jetstream.ObjectStoreStatus
	size uint64
}

func (s sizedStatus) Size() uint64 { return s.size }

func (s *stuckLister) Status(context.Context) (jetstream.ObjectStoreStatus, error) {
	if s.empty {
		return sizedStatus{}, nil
	}
	return sizedStatus{size: 1 << 10}, nil
}

func (s *stuckLister) List(ctx context.Context, _ ...jetstream.ListObjectsOpt) ([]*jetstream.ObjectInfo, error) {
	if s.calls.Add(1) <= s.stuck {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	return []*jetstream.ObjectInfo{
		{ObjectMeta: jetstream.ObjectMeta{Name: snapshotPrefix + "1", Metadata: map[string]string{snapshotSeqKey: "7"}}},
	}, nil
}

// TestListSnapshots_AListingThatNeverAnswers: a listing that does not
// answer is given up after its deadline and asked again; after
// listAttempts such listings the error says so, and a cancelled caller is
// not asked for again.
func TestListSnapshots_AListingThatNeverAnswers(t *testing.T) {
	defer func(d time.Duration) { listAttempt = d }(listAttempt)
	listAttempt = 20 * time.Millisecond
	ctx := context.Background()

	obj := &stuckLister{stuck: listAttempts - 1}
	got, err := listSnapshots(ctx, obj)
	if err != nil || len(got) != 1 || got[0].Seq != 7 {
		t.Fatalf("after %d stuck listings: %+v, %v; want the one snapshot at seq 7", listAttempts-1, got, err)
	}
	if n := obj.calls.Load(); n != listAttempts {
		t.Fatalf("asked %d times, want %d", n, listAttempts)
	}

	obj = &stuckLister{stuck: listAttempts}
	if _, err := listSnapshots(ctx, obj); !errors.Is(err, context.DeadlineExceeded) || obj.calls.Load() != listAttempts {
		t.Fatalf("every listing stuck: %v after %d calls; want the deadline after %d", err, obj.calls.Load(), listAttempts)
	}

	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	obj = &stuckLister{stuck: listAttempts}
	if _, err := listSnapshots(cancelled, obj); !errors.Is(err, context.Canceled) || obj.calls.Load() != 1 {
		t.Fatalf("cancelled caller: %v after %d calls; want context.Canceled after 1", err, obj.calls.Load())
	}
}

// TestListSnapshots_EmptyBucketNotListed: a bucket whose status says it
// holds nothing is not listed. Its listing would wait for an entry that
// never comes when the lookup telling it the bucket is empty goes
// unanswered, as on a just-created R3 bucket: a new leader's first
// listing took its whole 10 s deadline there, and its first snapshot came
// that much later (TestCluster_ThreeNodes).
func TestListSnapshots_EmptyBucketNotListed(t *testing.T) {
	defer func(d time.Duration) { listAttempt = d }(listAttempt)
	listAttempt = 20 * time.Millisecond
	obj := &stuckLister{stuck: listAttempts, empty: true}
	got, err := listSnapshots(context.Background(), obj)
	if err != nil || len(got) != 0 || obj.calls.Load() != 0 {
		t.Fatalf("an empty bucket: %+v, %v after %d listings; want none, no error, not listed", got, err, obj.calls.Load())
	}
}
