package publish

import (
	"context"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/store"
)

// SetBeforeKVApply installs a crash point: fn runs after a batch of
// events was marked published and before its state is written to the
// buckets, and an error from it stops the writes, as a SIGKILL there would.
func SetBeforeKVApply(k *KV, fn func([]store.Event) error) { k.beforeApply = fn }

// SetKVQueueWait sets how long a marking waits for room in the KV
// writer's queue; 0 drops the writes of a full queue at once.
func SetKVQueueWait(k *KV, d time.Duration) { k.queueWait = d }

// KVDirty reports whether the buckets are due a reconciliation.
func KVDirty(k *KV) bool { return k.dirty.Load() }

// SetWatchStall sets how long a watch of a bucket's values may wait for
// the next one, restoring it when tb ends.
func SetWatchStall(tb interface{ Cleanup(func()) }, d time.Duration) {
	old := watchStall.Swap(int64(d))
	tb.Cleanup(func() { watchStall.Store(old) })
}

// SetKVRetry sets the first and longest waits between reconciliations of
// buckets that failed to reconcile, for relays made from now on.
func SetKVRetry(tb interface{ Cleanup(func()) }, initial, longest time.Duration) {
	oldInitial, oldMax := kvRetryInitial, kvRetryMax
	kvRetryInitial, kvRetryMax = initial, longest
	tb.Cleanup(func() { kvRetryInitial, kvRetryMax = oldInitial, oldMax })
}

// BucketValues reads every live key of kv with its value, as the
// reconciliation does.
func BucketValues(ctx context.Context, kv jetstream.KeyValue) (map[string][]byte, error) {
	return bucketValues(ctx, kv)
}

// SetMaxHeldEvents sets how many events an audit holds for the next at
// most, restoring it when tb ends.
func SetMaxHeldEvents(tb interface{ Cleanup(func()) }, n int) {
	old := maxHeldEvents
	maxHeldEvents = n
	tb.Cleanup(func() { maxHeldEvents = old })
}

// SetGoneCheck sets how long a relay pass's publishes wait before it looks
// whether the stream is gone, restoring it when tb ends.
func SetGoneCheck(tb interface{ Cleanup(func()) }, d time.Duration) {
	old := goneCheckAfter
	goneCheckAfter = d
	tb.Cleanup(func() { goneCheckAfter = old })
}
