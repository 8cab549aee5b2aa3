package cluster

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// openBatch is a fetch whose messages never end, as nats.go left one
// across a partition's heal after its context expired.
type openBatch struct{ msgs chan jetstream.Msg }

func (b openBatch) Messages() <-chan jetstream.Msg { return b.msgs }
func (openBatch) Error() error                     { return nil }

// stuckConsumer fetches open batches.
type stuckConsumer struct{ jetstream.Consumer }

func (stuckConsumer) Fetch(int, ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	return openBatch{make(chan jetstream.Msg)}, nil
}

// TestPull_AFetchThatNeverEndsIsGivenUp: a fetch whose messages stay open
// after its context ended is given up fetchGrace later (errFetchStuck), so
// that the follower fetches again rather than wait on it for good.
func TestPull_AFetchThatNeverEndsIsGivenUp(t *testing.T) {
	defer func(g time.Duration) { fetchGrace = g }(fetchGrace)
	fetchGrace = 100 * time.Millisecond
	f := NewFollower(nil, nil, FollowerConfig{MaxWait: 50 * time.Millisecond, MaxBytes: 1 << 20})
	b := f.pull(context.Background(), stuckConsumer{}, 0)
	select {
	case <-b.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the fetch was still waited on 10 s after its 50 ms")
	}
	if !errors.Is(b.err, errFetchStuck) {
		t.Errorf("the fetch ended with %v, want errFetchStuck", b.err)
	}
}
