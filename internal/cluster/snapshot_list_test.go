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
