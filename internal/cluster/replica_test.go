package cluster_test

import (
	"context"
	"errors"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestReplica_LeadsOnlyWithTheStreamInItsMirror: a standby that gains the
// lease while it cannot read the stream (here: the stream is not there
// yet) does not lead, up to its stall limit (then it steps down:
// TestReplica_StepsDownWhenItCannotLead); once it can, it leads with
// every event the stream holds already in its mirror. Before, the
// catch-up was bounded by one lease TTL and leading went on regardless: the
// partition tests saw new leaders put older values back into the KV
// buckets, delete live keys, and crawl a silent baseline over changes the
// stream never got.
func TestReplica_LeadsOnlyWithTheStreamInItsMirror(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	js := mustJetStream(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	leader := newLeaderMirror(t, js, pcfg)
	leader.change(3)

	standby, err := store.Open(ctx, filepath.Join(t.TempDir(), "standby.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })
	lease, err := cluster.NewLease(ctx, js, cluster.LeaseConfig{Bucket: "lease", Key: "leader", Node: "b", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	waits := &countingHandler{text: "not leading yet"}
	var ledWith atomic.Pointer[string]
	r := &cluster.Replica{
		Lease: lease,
		Follower: cluster.NewFollower(js, standby, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "b",
			MaxWait: 100 * time.Millisecond}),
		Lead: func(ctx context.Context) error {
			rows := mirrorRows(t, standby)
			ledWith.Store(&rows)
			<-ctx.Done()
			return nil
		},
		Logger: slog.New(waits),
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	testutil.WaitFor(t, 5*ttl, "the standby to hold the lease and fail to catch up twice, or to lead", func() bool {
		return lease.IsLeader() && (waits.n.Load() >= 2 || ledWith.Load() != nil)
	})
	if ledWith.Load() != nil {
		t.Fatal("led with a mirror that could not read the stream")
	}

	if err := publish.EnsureStream(ctx, js, pcfg); err != nil {
		t.Fatal(err)
	}
	leader.publish()
	testutil.WaitFor(t, 5*ttl, "the standby to lead", func() bool { return ledWith.Load() != nil })
	if got, want := *ledWith.Load(), mirrorRows(t, leader.st); got != want {
		t.Fatalf("led with the mirror:\n%s\nthe stream's (the old leader's):\n%s", got, want)
	}
}

// TestReplica_StepsDownWhenItCannotLead: a replica that holds the lease
// but cannot begin its term (its fence markers are refused) or whose
// mirror takes nothing of the stream (it cannot read the stream, which it
// names wrong, as one without the permissions would) steps down after its
// stall limit and sits out, and a standby that can lead takes the lease
// and leads with the stream in its mirror. Before, the first held the
// lease for as long as it failed, and nobody led.
func TestReplica_StepsDownWhenItCannotLead(t *testing.T) {
	refused := func(context.Context) error { return errors.New("permissions violation for publish") }
	for _, c := range []struct {
		name   string
		stream string
		mark   func(context.Context) error
	}{
		{"CatchUp", "NOT_EV", nil},
		{"Mark", "EV", refused},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			js, leader := newStreamLeader(t)
			leader.change(3)
			leader.publish()
			// a's terms, begun and never led, are ended: their writes
			// refused before they are sent.
			var marks, unmarks atomic.Int64
			mark := func(ctx context.Context) error {
				if c.mark != nil {
					return c.mark(ctx)
				}
				marks.Add(1)
				return nil
			}
			a, aLed, aSteps := leadingReplica(ctx, t, js, "a", c.stream, mark, func() { unmarks.Add(1) })
			testutil.WaitFor(t, 5*ttl, "a to hold the lease", a.IsLeader)
			_, bLed, _ := leadingReplica(ctx, t, js, "b", "EV", nil, nil)
			testutil.WaitFor(t, 10*ttl, "b to lead", func() bool { return bLed.Load() != nil })
			if aLed.Load() != nil {
				t.Fatal("a led")
			}
			if aSteps.n.Load() == 0 {
				t.Error("a never logged that it stepped down")
			}
			if m, u := marks.Load(), unmarks.Load(); u < m || u == 0 {
				t.Errorf("a began %d terms it never led and ended %d of them", m, u)
			}
			if got, want := *bLed.Load(), mirrorRows(t, leader.st); got != want {
				t.Fatalf("b led with the mirror:\n%s\nthe stream's (the old leader's):\n%s", got, want)
			}
		})
	}
}

// leadingReplica runs a replica named node, following stream, with mark as
// its Mark and unmark as its Unmark, a stall limit of one TTL and a sit-out of three, until ctx
// ends; it returns the mirror it led with (nil until it leads) and a count
// of its step-downs.
func leadingReplica(
	ctx context.Context,
	t *testing.T,
	js jetstream.JetStream,
	node, stream string,
	mark func(context.Context) error,
	unmark func(),
) (*cluster.Replica, *atomic.Pointer[string], *countingHandler) {
	t.Helper()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), node+".db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	lease, err := cluster.NewLease(ctx, js, cluster.LeaseConfig{Bucket: "lease", Key: "leader", Node: node, TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	ledWith := &atomic.Pointer[string]{}
	steps := &countingHandler{text: "stepping down"}
	r := &cluster.Replica{
		Lease: lease,
		Follower: cluster.NewFollower(js, st, cluster.FollowerConfig{Stream: stream, SubjectPrefix: "ev",
			Consumer: node, MaxWait: 100 * time.Millisecond}),
		Mark:   mark,
		Unmark: unmark,
		Lead: func(ctx context.Context) error {
			rows := mirrorRows(t, st)
			ledWith.Store(&rows)
			<-ctx.Done()
			return nil
		},
		Logger:     slog.New(steps),
		StallLimit: ttl,
		SitOut:     3 * ttl,
	}
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Run(rctx) }()
	t.Cleanup(func() { cancel(); <-done })
	return r, ledWith, steps
}

// countingHandler counts log records whose message contains text.
type countingHandler struct {
	text string
	n    atomic.Int64
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	if strings.Contains(r.Message, h.text) {
		h.n.Add(1)
	}
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

// TestReplica_RepairsADivergenceBeforeLeading: a standby whose mirror was
// changed behind its back takes the lease, and the checkpoint its catch-up
// reads finds the divergence. It repairs its mirror from the newest
// snapshot before it leads: a leader crawls only what changes upstream,
// and would keep what it lacks for good (make cluster-test saw a new
// leader lead with four history rows fewer than the old one's, found by
// the checkpoint of its catch-up, the repair never made).
func TestReplica_RepairsADivergenceBeforeLeading(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	js, leader, relay, _ := newSnapshottingLeader(t, "leader")
	leader.change(2)
	first := publishCheckpoint(t, relay)

	// The standby follows up to a checkpoint it matches, and stops.
	path := filepath.Join(t.TempDir(), "standby.db")
	standby, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { standby.Close() })
	fcfg := cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "b", MaxWait: 100 * time.Millisecond,
		Meta: standby, SnapshotBucket: "snaps", Restore: cluster.RestoreWhenEmpty, SnapshotDir: t.TempDir()}
	f := cluster.NewFollower(js, standby, fcfg)
	fctx, stopFollowing := context.WithCancel(ctx)
	followed := make(chan error, 1)
	go func() { followed <- f.Run(fctx) }()
	testutil.WaitFor(t, 10*time.Second, "the standby to match a checkpoint", func() bool {
		r, ok := f.LastCheckpoint()
		return ok && r.Seq >= first && r.Diff == ""
	})
	stopFollowing()
	<-followed

	// Behind its back; then the leader changes on and checkpoints.
	forgeTag(t, path)
	leader.change(1)
	publishCheckpoint(t, relay)

	lease, err := cluster.NewLease(ctx, js, cluster.LeaseConfig{Bucket: "lease", Key: "leader", Node: "b", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	var ledWith atomic.Pointer[string]
	f = cluster.NewFollower(js, standby, fcfg)
	r := &cluster.Replica{
		Lease:    lease,
		Follower: f,
		Lead: func(ctx context.Context) error {
			rows := mirrorRows(t, standby)
			ledWith.Store(&rows)
			<-ctx.Done()
			return nil
		},
		Logger: slog.New(slog.DiscardHandler),
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitFor(t, 10*ttl, "the standby to lead", func() bool { return ledWith.Load() != nil })
	if got, want := *ledWith.Load(), mirrorRows(t, leader.st); got != want {
		t.Fatalf("led with the mirror:\n%s\nthe old leader's:\n%s", got, want)
	}
	if f.Repairs() != 1 {
		t.Errorf("repairs before leading = %d, want 1", f.Repairs())
	}
}

// TestReplica_StandsDownWhenTheLeaseIsLost: a leader whose duties take
// long to stop (one stuck in a request to a NATS server it cannot reach)
// is a standby as soon as its lease is lost, not once they stopped: the
// black-hole test saw the old leader keep its role for the whole shutdown
// grace, 4 s, while another replica took over.
func TestReplica_StandsDownWhenTheLeaseIsLost(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	js := mustJetStream(t)
	pcfg := publish.Config{Stream: "EV", SubjectPrefix: "ev", DuplicateWindow: time.Minute, Source: "test"}
	if err := publish.EnsureStream(ctx, js, pcfg); err != nil {
		t.Fatal(err)
	}
	mirror, err := store.Open(ctx, filepath.Join(t.TempDir(), "a.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { mirror.Close() })
	lease, err := cluster.NewLease(ctx, js, cluster.LeaseConfig{Bucket: "lease", Key: "leader", Node: "a", TTL: ttl})
	if err != nil {
		t.Fatal(err)
	}
	release := make(chan struct{})
	unblock := sync.OnceFunc(func() { close(release) })
	stopped := make(chan struct{})
	r := &cluster.Replica{
		Lease: lease,
		Follower: cluster.NewFollower(js, mirror, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "a",
			MaxWait: 100 * time.Millisecond}),
		Meta: mirror,
		Lead: func(ctx context.Context) error {
			<-ctx.Done()
			<-release // a duty that does not stop when asked
			close(stopped)
			return nil
		},
	}
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); unblock(); <-done })
	testutil.WaitFor(t, 5*ttl, "a to lead", func() bool { return r.Role() == cluster.RoleLeader })
	kv, err := js.KeyValue(ctx, "lease")
	if err != nil {
		t.Fatal(err)
	}
	// Another writer moves the revision: a's next renewal fails.
	if _, err := kv.Put(ctx, "leader", []byte("b")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 2*ttl, "a to stand down while its duties still run", func() bool {
		var role string
		_ = mirror.Reader().QueryRow(`SELECT value FROM meta WHERE key = 'role'`).Scan(&role)
		return r.Role() == cluster.RoleStandby && role == cluster.RoleStandby
	})
	select {
	case <-stopped:
		t.Fatal("the duties stopped before the check")
	default:
	}
	unblock()
}
