package publish_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
)

// chanBatch is a fetch whose messages are what the test sends, ending
// when it closes the channel: a fake, since a real fetch that nats.go
// leaves open cannot be had on demand.
type chanBatch struct{ msgs chan jetstream.Msg }

func (b chanBatch) Messages() <-chan jetstream.Msg { return b.msgs }
func (chanBatch) Error() error                     { return nil }

// TestFetched_GivesUpABatchThatStaysOpen: a batch still open grace after
// its context ended is given up and reported stuck; one whose messages
// still come after its context ended is read to its end, however long
// that takes, as long as no gap between them reaches grace.
func TestFetched_GivesUpABatchThatStaysOpen(t *testing.T) {
	t.Run("open", func(t *testing.T) {
		const grace = 100 * time.Millisecond
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		stuck, ended := false, make(chan struct{})
		go func() {
			defer close(ended)
			for range publish.Fetched(ctx, chanBatch{make(chan jetstream.Msg)}, grace, &stuck) {
				t.Error("a message from a batch that sends none")
			}
		}()
		select {
		case <-ended:
		case <-time.After(10 * time.Second):
			t.Fatal("a batch that never ends was still read 10 s after its context ended")
		}
		if !stuck {
			t.Error("a batch given up is not reported stuck")
		}
	})
	t.Run("still coming", func(t *testing.T) {
		const grace = time.Second
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		msgs := make(chan jetstream.Msg)
		const n = 15 // 15 gaps of grace/10: 1.5 grace after the context ended
		go func() {
			defer close(msgs)
			for range n {
				time.Sleep(grace / 10) // the pace of a slow link, not a wait for a condition
				msgs <- nil
			}
		}()
		stuck, got := false, 0
		for range publish.Fetched(ctx, chanBatch{msgs}, grace, &stuck) {
			got++
		}
		if stuck || got != n {
			t.Errorf("read %d of %d messages (stuck %v), want all of a batch whose messages kept coming", got, n, stuck)
		}
	})
}
