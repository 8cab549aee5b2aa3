package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// LeaseConfig configures a Lease.
type LeaseConfig struct {
	Bucket string
	Key    string
	// Node names this replica; it is the value of the key while it leads.
	Node string
	// TTL is the bucket's max age: a key not renewed within it expires.
	TTL      time.Duration
	Replicas int
	Logger   *slog.Logger
}

// LeaseState is what a replica knows of the lease.
type LeaseState struct {
	Leader bool
	// Holder is the node holding the lease; "" when nobody does.
	Holder string
	// Term counts the times this replica gained the lease, so that a loss
	// and a regain between two looks are not missed.
	Term uint64
}

// Lease campaigns for, holds and renews the leader lease: one key in a KV
// bucket whose max age is the TTL. Create succeeds only when the key is
// absent, deleted or expired; Update with the last revision renews it and
// fails if anybody else wrote in between. A renewal that fails for any
// reason ends the leadership at once, before the key can expire, so two
// replicas never both believe they lead while the server is reachable.
type Lease struct {
	kv  jetstream.KeyValue
	cfg LeaseConfig
	log *slog.Logger

	mu      sync.Mutex
	state   LeaseState
	rev     uint64
	changes chan struct{}
	// op serializes the requests that write the key at l.rev (renewal,
	// confirmation, release), which Run and StepDown make from different
	// goroutines: two updates at one revision would fail one of them.
	op sync.Mutex
	// sitOutUntil is when this replica may campaign again after SitOut
	// (zero: any time), under mu; a time.Time keeps the monotonic clock,
	// so that a wall clock set back does not lengthen it.
	sitOutUntil time.Time
}

// NewLease creates the bucket, or updates it to cfg, and returns a lease
// that campaigns once Run is called.
func NewLease(ctx context.Context, js jetstream.JetStream, cfg LeaseConfig) (*Lease, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      cfg.Bucket,
		Description: "syncd leader lease",
		History:     1,
		TTL:         cfg.TTL,
		Storage:     jetstream.FileStorage,
		Replicas:    max(cfg.Replicas, 1),
	})
	if err != nil {
		return nil, fmt.Errorf("create or update KV bucket %s: %w", cfg.Bucket, err)
	}
	return &Lease{kv: kv, cfg: cfg, log: cfg.Logger, changes: make(chan struct{}, 1)}, nil
}

// State returns what the replica knows of the lease now.
func (l *Lease) State() LeaseState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.state
}

// LeaderOnly answers with h only while this replica leads: a standby's 503
// makes the platform deliver again, to the leader when the sink address
// points at whichever replica leads.
func (l *Lease) LeaderOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !l.IsLeader() {
			http.Error(w, "standby: not the leader", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, req)
	})
}

// IsLeader reports whether this replica holds the lease.
func (l *Lease) IsLeader() bool { return l.State().Leader }

// Holder is the node holding the lease, "" when nobody does.
func (l *Lease) Holder() string { return l.State().Holder }

// Changes receives a value after the state changed; it holds at most one
// pending signal, so readers look at State after receiving.
func (l *Lease) Changes() <-chan struct{} { return l.changes }

// Run campaigns while standing by and renews while leading, until ctx is
// done; it then deletes the key if it still holds it, so that a standby
// takes over at once instead of after the TTL.
func (l *Lease) Run(ctx context.Context) error {
	renew, campaign := l.cfg.TTL/3, l.cfg.TTL/4
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			l.release()
			return nil
		case <-t.C:
		}
		switch {
		case l.IsLeader():
			l.renew(ctx)
		case l.sittingOut():
			l.watchHolder(ctx)
		default:
			l.campaign(ctx)
		}
		if l.IsLeader() {
			t.Reset(renew)
		} else {
			t.Reset(campaign)
		}
	}
}

// opTimeout bounds one KV request: a renewal must fail, and leadership end,
// well before the key expires.
func (l *Lease) opTimeout() time.Duration { return l.cfg.TTL / 3 }

func (l *Lease) campaign(ctx context.Context) {
	octx, cancel := context.WithTimeout(ctx, l.opTimeout())
	defer cancel()
	rev, err := l.kv.Create(octx, l.cfg.Key, []byte(l.cfg.Node))
	if err == nil {
		l.set(func(s *LeaseState) { s.Leader, s.Holder = true, l.cfg.Node; s.Term++ }, rev)
		l.log.Info("gained the leader lease", "node", l.cfg.Node, "bucket", l.cfg.Bucket, "ttl", l.cfg.TTL.String())
		return
	}
	if !errors.Is(err, jetstream.ErrKeyExists) && ctx.Err() == nil {
		l.log.Warn("campaign for the leader lease failed", "err", err)
	}
	l.readHolder(octx)
}

// watchHolder records who holds the lease, without campaigning.
func (l *Lease) watchHolder(ctx context.Context) {
	octx, cancel := context.WithTimeout(ctx, l.opTimeout())
	defer cancel()
	l.readHolder(octx)
}

// readHolder records the key's holder, "" when it cannot be read.
func (l *Lease) readHolder(ctx context.Context) {
	holder := ""
	if e, err := l.kv.Get(ctx, l.cfg.Key); err == nil {
		holder = string(e.Value())
	}
	l.set(func(s *LeaseState) { s.Holder = holder }, 0)
}

func (l *Lease) renew(ctx context.Context) { l.renewed(ctx) }

// renewed renews the lease and reports whether the server took the
// renewal: false also when ctx ended first, which leaves the leadership
// to release (shutting down) but confirms nothing.
func (l *Lease) renewed(ctx context.Context) bool {
	l.op.Lock()
	defer l.op.Unlock()
	if !l.IsLeader() {
		return false // stepped down meanwhile
	}
	octx, cancel := context.WithTimeout(ctx, l.opTimeout())
	defer cancel()
	l.mu.Lock()
	rev := l.rev
	l.mu.Unlock()
	next, err := l.kv.Update(octx, l.cfg.Key, []byte(l.cfg.Node), rev)
	if err == nil {
		l.mu.Lock()
		l.rev = next
		l.mu.Unlock()
		return true
	}
	if ctx.Err() != nil {
		return false // shutting down: release decides
	}
	l.set(func(s *LeaseState) { s.Leader, s.Holder = false, "" }, 0)
	l.log.Warn("lost the leader lease: renewal failed; stepping down", "node", l.cfg.Node, "err", err)
	return false
}

// Confirm renews the lease of term now, and ends the leadership when that
// fails: a replica that wrote its term's markers confirms that it still
// held the lease after they landed, so that a replica paused between
// gaining the lease and marking cannot write under a marker it laid after
// a newer leader's.
func (l *Lease) Confirm(ctx context.Context, term uint64) error {
	if st := l.State(); !st.Leader || st.Term != term {
		return errors.New("no longer the leader")
	}
	// Only a renewal the server took confirms: one whose context ended
	// first (a process frozen past its deadline) says nothing of who holds
	// the key now.
	renewed := l.renewed(ctx)
	if st := l.State(); !renewed || !st.Leader || st.Term != term {
		return errors.New("the lease was lost while the term was marked, or could not be confirmed")
	}
	return nil
}

// StepDown ends the leadership at once and deletes the key if this
// replica still holds it (a fenced write is the sign that it may not):
// then any replica, this one included, may gain the lease for a new term.
func (l *Lease) StepDown() {
	l.release()
}

// SitOut steps down (StepDown) and campaigns again only once d has
// passed, so that another replica can take the lease: a leader that
// cannot lead (its mirror cannot catch up with the stream) gives way.
func (l *Lease) SitOut(d time.Duration) {
	l.mu.Lock()
	l.sitOutUntil = time.Now().Add(d)
	l.mu.Unlock()
	l.release()
}

// sittingOut reports whether a SitOut keeps this replica from campaigning.
func (l *Lease) sittingOut() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	return time.Now().Before(l.sitOutUntil)
}

// release deletes the key if this replica still holds it at the revision it
// last wrote, so that nobody else's lease is ever deleted.
func (l *Lease) release() {
	l.op.Lock()
	defer l.op.Unlock()
	l.mu.Lock()
	leader, rev := l.state.Leader, l.rev
	l.mu.Unlock()
	if !leader {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), l.opTimeout())
	defer cancel()
	if err := l.kv.Delete(ctx, l.cfg.Key, jetstream.LastRevision(rev)); err != nil {
		l.log.Warn("release the leader lease; standbys take over when it expires", "err", err, "ttl", l.cfg.TTL.String())
	} else {
		l.log.Info("released the leader lease", "node", l.cfg.Node)
	}
	l.set(func(s *LeaseState) { s.Leader, s.Holder = false, "" }, 0)
}

// set changes the state under the lock, records the revision when it is
// not zero, and signals a change.
func (l *Lease) set(fn func(*LeaseState), rev uint64) {
	l.mu.Lock()
	before := l.state
	fn(&l.state)
	if rev != 0 {
		l.rev = rev
	}
	changed := l.state != before
	l.mu.Unlock()
	if changed {
		select {
		case l.changes <- struct{}{}:
		default:
		}
	}
}
