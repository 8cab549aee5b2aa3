package testutil

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
)

// RecreateStream deletes cfg's stream and creates it again, as NATS losing
// it and syncd creating it again would. The server removes a deleted
// stream's files after it answers, and refuses a stream of the same name
// until then ("error creating store for stream", as syncd's relay meets it
// too and tries again at its next pass): the creation is tried until it
// succeeds, for at most 10 s.
func RecreateStream(tb testing.TB, js jetstream.JetStream, cfg publish.Config) {
	tb.Helper()
	ctx := context.Background()
	if err := js.DeleteStream(ctx, cfg.Stream); err != nil {
		tb.Fatalf("delete stream %s: %v", cfg.Stream, err)
	}
	Eventually(tb, 10*time.Second, func() error { return publish.EnsureStream(ctx, js, cfg) })
}
