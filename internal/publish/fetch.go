package publish

import (
	"context"
	"iter"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Fetched yields batch's messages until the batch ends, or, once ctx has
// ended, until grace passes without a message, and then sets stuck:
// across a partition's heal, nats.go once left a fetch's messages open
// after its context expired, and a standby waited on it for good
// (TestCluster_StreamLeaderNodePartitioned: its goroutine dump). The
// messages not taken are the consumer's to deliver again.
func Fetched(
	ctx context.Context,
	batch jetstream.MessageBatch,
	grace time.Duration,
	stuck *bool,
) iter.Seq[jetstream.Msg] {
	return func(yield func(jetstream.Msg) bool) {
		msgs, done := batch.Messages(), ctx.Done()
		var quiet *time.Timer
		var expired <-chan time.Time
		for {
			select {
			case m, ok := <-msgs:
				if !ok || !yield(m) {
					return
				}
				if quiet != nil {
					quiet.Reset(grace) // still coming: not stuck
				}
			case <-done:
				done = nil
				quiet = time.NewTimer(grace)
				defer quiet.Stop()
				expired = quiet.C
			case <-expired:
				*stuck = true
				return
			}
		}
	}
}
