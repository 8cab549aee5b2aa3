package daemon

import (
	"context"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/store"
)

// extraJobs are the jobs the crawler runs beside its own: reconciling the subscription.
func (a *App) extraJobs() []crawler.Job {
	if a.Registrar == nil || a.Jobs[crawler.JobSubscriptions] == nil {
		return nil
	}
	return []crawler.Job{
		{Name: crawler.JobSubscriptions, Schedule: a.Jobs[crawler.JobSubscriptions], Run: a.Registrar.Ensure},
	}
}

// duties are the leader's: the crawler's jobs, the receiver's queue, the
// snapshots, the stream audit, the matured digests and the relay, shut down within grace; drain
// as in cluster.Duties.
func (a *App) duties(grace time.Duration, drain func() bool) *cluster.Duties {
	jobs := a.extraJobs()
	work := []func(context.Context) error{func(ctx context.Context) error { return a.Crawler.Run(ctx, jobs...) }}
	if a.Receiver != nil {
		work = append(work, a.Receiver.Run)
	}
	if a.Snapshots != nil {
		work = append(work, a.Snapshots.Run)
	}
	if a.Auditor != nil {
		work = append(work, a.Auditor.Run)
	}
	if a.Maturity != nil {
		work = append(work, a.Maturity.Run)
	}
	return &cluster.Duties{Work: work, Relay: a.Relay, Outbox: a.Store, Grace: grace, Drain: drain, Logger: a.Log}
}

// RecordMode marks a mirror of the demo, or of cluster mode, in its meta:
// the demo overwrites only a mirror of its own.
func (a *App) RecordMode(ctx context.Context, demo bool) error {
	switch {
	case a.Config.Cluster.Enabled:
		return a.Store.SetMeta(ctx, "mode", "cluster")
	case demo:
		return a.Store.SetMeta(ctx, "mode", store.ModeDemo)
	}
	return nil
}

// Leadership is how "syncd run" does the leader's duties: directly in single
// mode, and in cluster mode as a replica, while it holds the lease.
type Leadership struct {
	Run func(ctx context.Context) error
	// Leading reports whether this replica leads now; nil: always.
	Leading func() bool
	// Receiver wraps the webhook receiver: a standby answers 503.
	Receiver func(h http.Handler) http.Handler
	// Follower follows the stream while standing by; nil in single mode.
	Follower *cluster.Follower
	// Current names the role now: leader, or in cluster mode standby.
	Current func() string
}

// Leadership builds the leader's duties, shut down within grace, and, in
// cluster mode, the replica that runs them while it holds the lease.
func (a *App) Leadership(ctx context.Context, grace time.Duration) (Leadership, error) {
	if !a.Config.Cluster.Enabled {
		return Leadership{Run: a.duties(grace, nil).Run, Receiver: func(h http.Handler) http.Handler { return h },
			Current: func() string { return cluster.RoleLeader }}, nil
	}
	cl, node := a.Config.Cluster, a.Config.Cluster.Node()
	lease, err := cluster.NewLease(ctx, a.NATS.JS, cluster.LeaseConfig{Bucket: cl.Bucket, Key: cl.Key, Node: node,
		TTL: cl.LeaseTTL.Duration, Replicas: a.Config.NATS.Replicas, Logger: a.Log.With("part", "lease")})
	if err != nil {
		return Leadership{}, err
	}
	stepDown := lease.StepDown
	a.stepDown.Store(&stepDown)
	// A marker that left the stream (max_age, a purge) is laid again
	// while the lease is still this term's: confirmed before and after,
	// as when the term began (cluster.Replica's mark).
	a.Fence.SetRemark(func(ctx context.Context, lay func(context.Context) error) error {
		st := lease.State()
		if err := lease.Confirm(ctx, st.Term); err != nil {
			return err
		}
		if err := lay(ctx); err != nil {
			return err
		}
		return lease.Confirm(ctx, st.Term)
	})
	duties := a.duties(grace, lease.IsLeader)
	rep := &cluster.Replica{
		Lease: lease,
		Follower: NewClusterFollower(
			a.NATS,
			a.Store,
			a.Config,
			cluster.RestoreWhenEmpty,
			a.Snapshot,
			a.Position,
			a.Metrics,
			a.Trust,
			a.Log,
		),
		Promote: a.Crawler.ResolveFollowed,
		Mark:    a.Fence.Mark,
		Unmark:  a.Fence.End,
		Meta:    a.Store,
		Logger:  a.Log.With("part", "cluster"),
		Lead: func(ctx context.Context) error {
			defer a.Fence.End() // nothing of this term is sent after it
			return duties.Run(ctx)
		},
	}
	a.Metrics.WatchReplica(rep, cluster.RoleLeader, cluster.RoleStandby)
	a.Metrics.WatchLag(rep.Follower.Lag)
	a.Metrics.WatchVerification(rep.Follower)
	return Leadership{
		Run: func(ctx context.Context) error {
			g, gctx := errgroup.WithContext(ctx)
			g.Go(func() error { a.Adopted.check(gctx, a.Store, a.Log); return nil })
			g.Go(func() error { return rep.Run(gctx) })
			return g.Wait()
		},
		Leading:  lease.IsLeader,
		Receiver: lease.LeaderOnly,
		Follower: rep.Follower,
		Current:  rep.Role,
	}, nil
}

// AdminHandler serves the metrics and the readiness checks; r.Leading says
// whether freshness and publishing are checked (only the leader crawls and
// publishes), and whether the standby's following is.
func (a *App) AdminHandler(r Leadership) http.Handler {
	leading, m := r.Leading, a.Metrics
	m.WatchOutbox(a.Store)
	m.WatchFailures(a.Store)
	m.WatchNATS(a.NATS)
	if a.Receiver != nil {
		m.WatchReceiver(&a.Receiver.Stats)
	}
	checks := []admin.ReadinessCheck{
		{Name: "database", Run: a.Store.Writable},
		a.Adopted.ReadinessCheck(),
		admin.NATSCheck(a.NATS),
		admin.RoleCheck("publish", a.Relay, leading),
		admin.FreshnessCheck(
			a.Fresh,
			leading,
		),
		admin.BaselineCheck(a.Store, leading),
		admin.CredentialsCheck(a.Client, leading),
		admin.HistoryCheck(a.Store, a.Config.Crawl.RequestsPerSecond, leading),
	}
	m.WatchBackfill(a.Store, a.Config.Crawl.RequestsPerSecond)
	if r.Follower != nil {
		checks = append(checks, admin.RoleCheck("stream", r.Follower, func() bool { return !leading() }))
	}
	if s := a.Snapshots; s != nil {
		m.WatchSnapshots(func() (time.Time, int64) { l := s.Last(); return l.Created, l.Bytes })
	}
	return admin.Handler(m, checks)
}
