package cluster_test

import (
	"context"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestLease_ConfirmWithoutARenewalConfirmsNothing: Confirm is what keeps a
// replica that froze while it laid its term's markers (the fence's
// remark, whose context has a deadline of a minute) from writing under
// markers it laid after a newer leader's. A freeze longer than that
// deadline leaves the context expired when the process resumes; the
// renewal then never reaches the server, and Confirm must not report the
// lease as still this term's: another replica took it meanwhile.
func TestLease_ConfirmWithoutARenewalConfirmsNothing(t *testing.T) {
	js := mustJetStream(t)
	// A long TTL: no renewal of Run's comes between the steps below.
	l, err := cluster.NewLease(context.Background(), js,
		cluster.LeaseConfig{Bucket: "lease", Key: "leader", Node: "a", TTL: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitFor(t, 5*time.Second, "a to lead", l.IsLeader)
	term := l.State().Term

	// While a is frozen, its key expires and b gains the lease.
	kv, err := js.KeyValue(context.Background(), "lease")
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(context.Background(), "leader"); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Create(context.Background(), "leader", []byte("b")); err != nil {
		t.Fatal(err)
	}

	// a resumes past its remark's deadline.
	expired, cancelExpired := context.WithDeadline(context.Background(), time.Now().Add(-time.Second))
	defer cancelExpired()
	if err := l.Confirm(expired, term); err == nil {
		t.Error("Confirm succeeded with no renewal: a would open its term on markers laid after b's")
	}
	// And with a live context, the renewal fails: b holds the key.
	if err := l.Confirm(context.Background(), term); err == nil {
		t.Error("Confirm succeeded although b holds the key")
	}
}
