package cluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/testutil"
)

const ttl = 2 * time.Second

// mustJetStream runs a NATS server with JetStream on a loopback port and
// returns a JetStream context connected to it.
func mustJetStream(t *testing.T) jetstream.JetStream {
	t.Helper()
	return testutil.JetStream(t, testutil.NATS(t).URL())
}

// runLease starts a lease for node and returns it with a function that
// stops it (releasing the key) and waits.
func runLease(t *testing.T, js jetstream.JetStream, node string) (*cluster.Lease, func()) {
	t.Helper()
	l, err := cluster.NewLease(
		context.Background(),
		js,
		cluster.LeaseConfig{Bucket: "lease", Key: "leader", Node: node, TTL: ttl},
	)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- l.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			<-done
		})
	}
	t.Cleanup(stop)
	return l, stop
}

func TestLease_OneLeaderAndHandover(t *testing.T) {
	js := mustJetStream(t)
	a, stopA := runLease(t, js, "a")
	testutil.WaitFor(t, ttl, "a to lead", a.IsLeader)
	b, _ := runLease(t, js, "b")
	testutil.WaitFor(t, ttl, "b to see a as the holder", func() bool { return b.Holder() == "a" })
	// Through several of a's renewals (each a new revision of the key) a
	// still leads and b still stands by.
	kv, err := js.KeyValue(context.Background(), "lease")
	if err != nil {
		t.Fatal(err)
	}
	revision := func() uint64 {
		e, err := kv.Get(context.Background(), "leader")
		if err != nil {
			t.Fatalf("lease key: %v", err)
		}
		return e.Revision()
	}
	first := revision()
	testutil.WaitFor(t, 3*ttl, "three renewals by a", func() bool {
		if !a.IsLeader() || b.IsLeader() || b.Holder() != "a" {
			t.Fatalf(
				"between renewals: a leader=%v, b leader=%v, b sees %q; want only a",
				a.IsLeader(),
				b.IsLeader(),
				b.Holder(),
			)
		}
		return revision() >= first+3
	})
	stopA() // deletes the key at its revision
	start := time.Now()
	testutil.WaitFor(t, ttl, "b to take over after a released", b.IsLeader)
	if took := time.Since(start); took > ttl/2 {
		t.Errorf("takeover after a release took %s, want well under the TTL %s", took, ttl)
	}
	if got, want := b.State().Term, uint64(1); got != want {
		t.Errorf("b's term=%d, want %d", got, want)
	}
}

func TestLease_TakeoverAfterExpiry(t *testing.T) {
	js := mustJetStream(t)
	// A holder that crashed: its key stays until the TTL expires it.
	b, _ := runLease(t, js, "b")
	kv, err := js.KeyValue(context.Background(), "lease")
	if err != nil {
		t.Fatal(err)
	}
	// Whether or not b created the key first, the crashed holder's write
	// replaces it.
	if _, err := kv.Put(context.Background(), "leader", []byte("crashed")); err != nil {
		t.Fatal(err)
	}
	written := time.Now()
	testutil.WaitFor(
		t,
		ttl,
		"b to see the crashed holder",
		func() bool { return !b.IsLeader() && b.Holder() == "crashed" },
	)
	testutil.WaitFor(t, 3*ttl, "b to take over after the expiry", b.IsLeader)
	if took := time.Since(written); took < ttl-ttl/4 || took > 2*ttl {
		t.Errorf("takeover %s after the last write, want after the TTL %s and within two", took, ttl)
	}
}

func TestLease_StepDownOnFailedRenewal(t *testing.T) {
	js := mustJetStream(t)
	a, _ := runLease(t, js, "a")
	testutil.WaitFor(t, ttl, "a to lead", a.IsLeader)
	kv, err := js.KeyValue(context.Background(), "lease")
	if err != nil {
		t.Fatal(err)
	}
	// Another writer moves the revision: a's next renewal must fail.
	if _, err := kv.Put(context.Background(), "leader", []byte("intruder")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, ttl, "a to step down", func() bool { return !a.IsLeader() })
	select {
	case <-a.Changes():
	default:
		t.Error("no change signalled on stepping down")
	}
	testutil.WaitFor(t, ttl, "a to see the intruder as holder", func() bool { return a.Holder() == "intruder" })
}

// TestLease_ConfirmAndStepDown: Confirm renews the lease of the current
// term and fails for another term; StepDown after a fenced write deletes
// the key this replica holds, so that a standby takes over at once.
func TestLease_ConfirmAndStepDown(t *testing.T) {
	ctx := context.Background()
	js := mustJetStream(t)
	a, stopA := runLease(t, js, "a")
	testutil.WaitFor(t, ttl, "a to lead", a.IsLeader)
	term := a.State().Term
	if err := a.Confirm(ctx, term); err != nil {
		t.Fatalf("confirm while leading: %v", err)
	}
	if err := a.Confirm(ctx, term+1); err == nil {
		t.Error("confirmed a term a does not hold")
	}
	b, _ := runLease(t, js, "b")
	testutil.WaitFor(t, ttl, "b to see a as the holder", func() bool { return b.Holder() == "a" })
	// A step-down without a's loop, which would campaign again at once
	// and might win: the takeover measured is b's.
	a.StepDown()
	stopA()
	if a.IsLeader() {
		t.Fatal("a still leads after stepping down")
	}
	start := time.Now()
	testutil.WaitFor(t, ttl, "b to take over after a stepped down", b.IsLeader)
	if took := time.Since(start); took > ttl/2 {
		t.Errorf("takeover after a step-down took %s, want well under the TTL %s", took, ttl)
	}
	// b leads now: a confirmation of a's old term fails and changes
	// nothing.
	if err := a.Confirm(ctx, term); err == nil {
		t.Error("a confirmed its old term after b took over")
	}
	kv, err := js.KeyValue(ctx, "lease")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := kv.Get(ctx, "leader"); err != nil || string(e.Value()) != "b" {
		t.Errorf("lease key after a's stale confirmation: %v, want b's", err)
	}
}

// TestLease_SitOut: a leader that sits out gives the key up at once and
// campaigns again only once the sit-out has passed, though nobody else
// holds the lease meanwhile.
func TestLease_SitOut(t *testing.T) {
	js := mustJetStream(t)
	l, stop := runLease(t, js, "a")
	defer stop()
	testutil.WaitFor(t, 5*ttl, "a to lead", l.IsLeader)
	d := 3 * ttl / 2
	start := time.Now()
	l.SitOut(d)
	if l.IsLeader() {
		t.Fatal("still the leader after SitOut")
	}
	kv, err := js.KeyValue(context.Background(), "lease")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Get(context.Background(), "leader"); !errors.Is(err, jetstream.ErrKeyNotFound) {
		t.Fatalf("the key after SitOut: %v, want it deleted", err)
	}
	testutil.WaitFor(t, d+2*ttl, "a to lead again", l.IsLeader)
	if took := time.Since(start); took < d {
		t.Fatalf("led again %s after SitOut(%s)", took.Round(time.Millisecond), d)
	}
}
