package publish

import "github.com/syncd-dev/syncd/internal/store"

// SetBeforeKVApply installs a crash point: fn runs after a batch of
// events was marked published and before its state is written to the
// buckets, and an error from it stops the writes, as a SIGKILL there would.
func SetBeforeKVApply(k *KV, fn func([]store.Event) error) { k.beforeApply = fn }
