package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v4"
)

// Roles a replica reports.
const (
	RoleLeader   = "leader"
	RoleStandby  = "standby"
	RoleFollower = "follower"
)

// Replica runs one "syncd run" replica in cluster mode: it follows the
// stream while another replica leads, and leads while it holds the lease.
type Replica struct {
	Lease    *Lease
	Follower *Follower
	// Promote runs once the lease is gained and the stream caught up, before
	// Lead: it readies the followed mirror for crawling.
	Promote func(ctx context.Context) error
	// Mark, when set, begins the lease term before anything of it is
	// written: it lays the term's fence markers (publish.Fence.Mark).
	// Leading waits until it succeeded and the lease was confirmed after it.
	Mark func(ctx context.Context) error
	// Unmark, when set, ends a term begun by Mark that is not led (the
	// lease lost before it was confirmed, a catch-up that stalled): its
	// writes are refused before they are sent (publish.Fence.End). Lead
	// ends a term it led itself.
	Unmark func()
	// Lead does the leader's work until ctx is done; ctx ends as soon as
	// the lease is lost. An error from Lead ends Run.
	Lead func(ctx context.Context) error
	// OnRole, when set, is told the role and the lease holder on every change.
	OnRole func(role, holder string)
	// Meta, when set, records the role and the lease holder on every
	// change, where "syncd status" reads them.
	Meta   Meta
	Logger *slog.Logger
	// StallLimit is how long a replica that holds the lease goes on
	// trying to begin its term (Mark) or to catch up with the stream
	// while its mirror takes nothing (it cannot write to the stream, or
	// read it) before it steps down and sits out SitOut, so that a
	// standby that can lead does; defaults: 6 and 2 times the lease's
	// TTL. Each step-down in a row sits out twice as long as the last, up
	// to 16 times SitOut, until the replica leads.
	StallLimit, SitOut time.Duration

	// stepDowns counts the step-downs since the replica last led; only
	// the goroutine of Run touches it.
	stepDowns int

	mu      sync.Mutex
	current string
}

// Meta is where a replica records its role and a follower its lag, for
// "syncd status": the mirror's meta table.
type Meta interface {
	SetMeta(ctx context.Context, key, value string) error
}

// RecordRole records role and the lease holder in m.
func RecordRole(ctx context.Context, m Meta, role, holder string) error {
	if err := m.SetMeta(ctx, "role", role); err != nil {
		return fmt.Errorf("record role: %w", err)
	}
	if err := m.SetMeta(ctx, "lease_holder", holder); err != nil {
		return fmt.Errorf("record lease holder: %w", err)
	}
	return nil
}

// Role is the replica's current role: standby until it leads.
func (r *Replica) Role() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.current == "" {
		return RoleStandby
	}
	return r.current
}

// IsLeader reports whether the replica holds the lease.
func (r *Replica) IsLeader() bool { return r.Lease.IsLeader() }

// Run campaigns for the lease and runs the role it gives until ctx is done.
// The lease is released last, after Lead returned, so that what the leader
// does at shutdown (publishing what it committed) happens under the lease.
func (r *Replica) Run(ctx context.Context) error {
	log := r.logger()
	leaseCtx, stopLease := context.WithCancel(context.WithoutCancel(ctx))
	leaseDone := make(chan error, 1)
	go func() { leaseDone <- r.Lease.Run(leaseCtx) }()
	defer func() {
		stopLease()
		<-leaseDone
	}()
	for ctx.Err() == nil {
		st := r.Lease.State()
		var err error
		if st.Leader {
			err = r.lead(ctx, st, log)
		} else {
			r.follow(ctx, st)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// follow applies the stream until the lease is gained or ctx is done.
// Once another replica is seen leading, the events this one recorded while
// it led and never published are forfeited (see Follower.Forfeit) before
// the stream is applied.
func (r *Replica) follow(ctx context.Context, st LeaseState) {
	r.role(RoleStandby, st.Holder)
	if r.othersLead(st) {
		if err := r.Follower.Forfeit(ctx, st.Holder); err != nil && ctx.Err() == nil {
			r.logger().
				Error(
					"dropping the events recorded while leading and never published failed; the mirror may differ from the leader's",
					"err",
					err,
				)
		}
	}
	fctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- r.Follower.Run(fctx) }()
	defer func() {
		cancel()
		<-done
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.Lease.Changes():
			was := st
			st = r.Lease.State()
			if st.Leader {
				return
			}
			if !r.othersLead(was) && r.othersLead(st) && r.Follower.Unpublished(ctx) > 0 {
				// Run follows again, forfeiting first. Only then: a
				// fetch cut short drops the messages on their way, which
				// come again after the consumer's AckWait.
				return
			}
			r.role(RoleStandby, st.Holder)
		}
	}
}

// othersLead reports whether st names another replica as the holder.
// While nobody holds the lease, or the key still names this replica (it
// restarted before the key expired), this replica may lead again and
// publish what it recorded.
func (r *Replica) othersLead(st LeaseState) bool {
	return st.Holder != "" && st.Holder != r.Lease.cfg.Node
}

// lead catches up with the stream, promotes the mirror and runs Lead until
// the lease of this term is lost or ctx is done.
func (r *Replica) lead(ctx context.Context, st LeaseState, log *slog.Logger) error {
	start := time.Now()
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lost := make(chan struct{})
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		for {
			select {
			case <-dctx.Done():
				return
			case <-r.Lease.Changes():
				if now := r.Lease.State(); !now.Leader || now.Term != st.Term {
					close(lost)
					cancel() // stop at once: another replica may lead already
					// The replica stands down now, not once its duties
					// have stopped: one stuck in a request to a NATS
					// server it cannot reach held the role for the whole
					// shutdown grace (4 s after a black hole, while
					// another replica took over). Nothing it still sends
					// lands: the relay stops at once, and the fence
					// refuses what is sent in a term that is over.
					r.standDown(now.Holder)
					return
				}
			}
		}
	}()
	defer func() {
		cancel()
		<-watchDone
	}()
	led := false
	defer func() {
		if !led && r.Unmark != nil {
			r.Unmark()
		}
	}()
	if !r.mark(dctx, st, log) {
		return nil
	}
	if r.catchUp(dctx, log) != nil {
		return nil
	}
	if err := r.Follower.FinishCatchUp(dctx); err != nil {
		if dctx.Err() != nil {
			return nil
		}
		// The end of the leader's next backfill pass builds them, or the
		// mirror's next open; queries by digest or time scan meanwhile.
		log.Warn("building the history indexes failed; leading without them", "err", err)
	}
	if r.Promote != nil && dctx.Err() == nil {
		if err := r.Promote(dctx); err != nil && dctx.Err() == nil {
			log.Warn("readying the mirror for crawling failed; tags not readied are read silently", "err", err)
		}
	}
	if dctx.Err() != nil {
		return nil
	}
	r.stepDowns = 0
	r.role(RoleLeader, r.Lease.cfg.Node)
	log.Info(
		"leading",
		"node",
		r.Lease.cfg.Node,
		"term",
		st.Term,
		"promotion",
		time.Since(start).Round(time.Millisecond).String(),
	)
	led = true
	err := r.Lead(dctx)
	select {
	case <-lost:
		log.Warn("stopped leading: the lease was lost", "node", r.Lease.cfg.Node)
		return nil
	default:
	}
	if ctx.Err() != nil || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// stalled reports whether the replica has tried to begin its term
// without progress, from since, for its stall limit; if so, it has
// stepped down, sitting out, and logged why.
func (r *Replica) stalled(since time.Time, log *slog.Logger, why string, args ...any) bool {
	stall, sitOut := r.StallLimit, r.SitOut
	if stall <= 0 {
		stall = 6 * r.Lease.cfg.TTL
	}
	if sitOut <= 0 {
		sitOut = 2 * r.Lease.cfg.TTL
	}
	took := time.Since(since)
	if took < stall {
		return false
	}
	sitOut <<= min(r.stepDowns, 4)
	r.stepDowns++
	log.Error("stepping down: "+why+" for "+took.Round(time.Second).String()+
		"; another replica may lead, and this one campaigns again in "+sitOut.String(),
		append(args, "step_downs_in_a_row", r.stepDowns)...)
	r.Lease.SitOut(sitOut)
	return true
}

// errSteppedDown: the catch-up made no progress for the stall limit, and
// the replica gave the lease up.
var errSteppedDown = errors.New("stepped down: the mirror could not catch up with the stream")

// errRepairDue: the catch-up found the mirror diverged from the leader's.
var errRepairDue = errors.New("the mirror diverged from the leader's checkpoint; repairing it first")

// catchUp completes the mirror and applies what the stream holds, trying
// again until both succeed or ctx ends. Events the old leader published are
// in the stream: applying them first means the crawl that follows finds
// them in the mirror and does not record them again. A replica leads only
// with a mirror that holds the stream: one behind it would put older values
// back into the KV buckets and delete live keys in its first
// reconciliation, and one left empty by a restore cut short would crawl a
// silent baseline over changes the stream never got (the partition tests
// saw all three when the catch-up was bounded by a TTL and leading went on
// regardless). A large backlog takes several attempts, each resuming where
// the last one stopped. One that makes no progress for StallLimit (the
// stream unreadable, a restore that fails) gives the lease up for SitOut
// instead, so that a standby that can lead does, and returns
// errSteppedDown.
func (r *Replica) catchUp(ctx context.Context, log *slog.Logger) error {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(250*time.Millisecond),
		backoff.WithMaxInterval(5*time.Second),
		backoff.WithMaxElapsedTime(0),
	)
	applied, progressAt := r.Follower.Applied(), time.Now()
	for attempt := 1; ; attempt++ {
		err := r.Follower.Complete(ctx)
		if err == nil {
			cctx, cancel := context.WithTimeout(ctx, r.Lease.cfg.TTL)
			err = r.Follower.CatchUp(cctx)
			cancel()
		}
		if err == nil && r.Follower.RepairDue() {
			// A checkpoint of the catch-up found the mirror diverged: the
			// next attempt repairs it (Complete) before leading.
			err = errRepairDue
		}
		if err == nil || ctx.Err() != nil {
			return ctx.Err()
		}
		if now := r.Follower.Applied(); now != applied {
			applied, progressAt = now, time.Now()
		} else if r.stalled(progressAt, log, "the mirror has not caught up with the stream and took nothing",
			"attempts", attempt, "err", err, "lag", r.Follower.Lag()) {
			return errSteppedDown
		}
		wait := b.NextBackOff()
		log.Warn("not leading yet: the mirror has not caught up with the stream", "attempt", attempt, "err", err,
			"lag", r.Follower.Lag(), "retry_in", wait.Round(time.Millisecond).String())
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
	}
}

// mark begins the term st with Mark, trying again while the lease holds,
// and reports whether the replica may lead: the markers are laid and the
// lease was still this term's after they landed. Marking first means that
// everything the old leader got onto the stream lies before the markers,
// where the catch-up that follows applies it.
func (r *Replica) mark(ctx context.Context, st LeaseState, log *slog.Logger) bool {
	if r.Mark == nil {
		return true
	}
	wait := time.NewTimer(0)
	defer wait.Stop()
	start := time.Now()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-wait.C:
		}
		err := r.Mark(ctx)
		if err == nil {
			err = r.Lease.Confirm(ctx, st.Term)
			if err == nil {
				return true
			}
			log.Warn("not leading: the lease was lost while the term was marked", "err", err)
			return false
		}
		if ctx.Err() != nil {
			return false
		}
		if r.stalled(start, log, "the lease term could not be marked", "err", err) {
			return false
		}
		log.Warn("marking the lease term failed; trying again", "err", err, "in", r.Lease.cfg.TTL/4)
		wait.Reset(r.Lease.cfg.TTL / 4)
	}
}

// role takes role and records it.
// standDown records this replica as a standby if it is the leader.
func (r *Replica) standDown(holder string) {
	r.mu.Lock()
	leading := r.current == RoleLeader
	r.mu.Unlock()
	if leading {
		r.role(RoleStandby, holder)
	}
}

func (r *Replica) role(role, holder string) {
	r.mu.Lock()
	r.current = role
	r.mu.Unlock()
	if r.Meta != nil {
		if err := RecordRole(context.Background(), r.Meta, role, holder); err != nil {
			r.logger().Warn("record the cluster role", "err", err)
		}
	}
	r.logger().Info("cluster role", "role", role, "holder", holder, "node", r.Lease.cfg.Node)
	if r.OnRole != nil {
		r.OnRole(role, holder)
	}
}

func (r *Replica) logger() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}
