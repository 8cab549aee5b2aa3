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

// countingConsumer counts its fetches, each an open batch.
type countingConsumer struct {
	jetstream.Consumer
	fetches int
}

func (c *countingConsumer) Fetch(int, ...jetstream.FetchOpt) (jetstream.MessageBatch, error) {
	c.fetches++
	return openBatch{make(chan jetstream.Msg)}, nil
}

// TestPull_NothingIsFetchedOnceTheContextEnded: a follower stopping (or a
// catch-up out of time) sends no fetch, neither its next one nor the one
// ahead of a batch it has: the server would deliver it to nobody, and its
// messages would wait to be naked (up to fetchGrace at shutdown).
func TestPull_NothingIsFetchedOnceTheContextEnded(t *testing.T) {
	f := NewFollower(nil, nil, FollowerConfig{MaxWait: 50 * time.Millisecond, MaxBytes: 1 << 20})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	cons := &countingConsumer{}
	b := f.pull(ctx, cons, 10)
	if err := b.wait(); !errors.Is(err, context.Canceled) {
		t.Errorf("pull after the context ended: %v, want context.Canceled", err)
	}
	if cons.fetches != 0 {
		t.Errorf("%d fetches sent after the context ended, want none", cons.fetches)
	}
}
