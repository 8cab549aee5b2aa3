package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// replica is what "syncd run" adds in cluster mode: the lease, the
// follower that keeps a standby's mirror warm, and the role they give.
type replica struct {
	a        *app
	node     string
	lease    *cluster.Lease
	follower *cluster.Follower

	mu   sync.Mutex
	role string
}

// newReplica creates the lease bucket and the follower of a.
func newReplica(ctx context.Context, a *app) (*replica, error) {
	cfg := a.cfg
	node := cfg.Cluster.Node()
	lease, err := cluster.NewLease(ctx, a.nats.JS, cluster.LeaseConfig{
		Bucket: cfg.Cluster.Bucket, Key: cfg.Cluster.Key, Node: node, TTL: cfg.Cluster.LeaseTTL.Duration,
		Replicas: cfg.NATS.Replicas, Logger: a.log.With("part", "lease"),
	})
	if err != nil {
		return nil, err
	}
	r := &replica{a: a, node: node, lease: lease, role: cluster.RoleStandby}
	r.follower = newFollower(a.nats, a.store, cfg, node, a.log)
	return r, nil
}

// newFollower returns the follower of the stream into st, which records its
// lag in the mirror's meta for "syncd status" when it changes.
func newFollower(nc *publish.Conn, st *store.Store, cfg config.Config, node string, log *slog.Logger) *cluster.Follower {
	last := int64(-1)
	return cluster.NewFollower(nc.JS, st, cluster.FollowerConfig{
		Stream: cfg.NATS.Stream, SubjectPrefix: cfg.NATS.SubjectPrefix, Consumer: cfg.Cluster.ConsumerName(node),
		Logger: log.With("part", "follow"),
		OnBatch: func(applied int, pending uint64) {
			if int64(pending) == last {
				return
			}
			last = int64(pending)
			if err := st.SetMeta(context.Background(), "follow_lag", strconv.FormatUint(pending, 10)); err != nil {
				log.Warn("record follower lag", "err", err)
			}
		},
	})
}

// Role is the replica's current role.
func (r *replica) Role() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.role
}

// setRole records the role and the lease holder in meta, where "syncd
// status" reads them.
func (r *replica) setRole(role, holder string) {
	r.mu.Lock()
	r.role = role
	r.mu.Unlock()
	ctx := context.Background()
	if err := r.a.store.SetMeta(ctx, "role", role); err != nil {
		r.a.log.Warn("record role", "err", err)
	}
	if err := r.a.store.SetMeta(ctx, "lease_holder", holder); err != nil {
		r.a.log.Warn("record lease holder", "err", err)
	}
	r.a.log.Info("cluster role", "role", role, "holder", holder, "node", r.node)
}

// registerGauges adds the cluster's series.
func (r *replica) registerGauges() {
	reg := r.a.metrics.Registry()
	for _, role := range []string{cluster.RoleLeader, cluster.RoleStandby} {
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "syncd_cluster_role", Help: "1 for the replica's current role.",
			ConstLabels: prometheus.Labels{"role": role}}, func() float64 { return boolGauge(r.Role() == role) }))
	}
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "syncd_cluster_leader", Help: "1 while this replica holds the leader lease."},
		func() float64 { return boolGauge(r.lease.IsLeader()) }))
	registerLag(reg, r.follower)
}

func registerLag(reg prometheus.Registerer, f *cluster.Follower) {
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "syncd_follower_lag_events", Help: "Messages the follower's consumer has pending."},
		func() float64 { return float64(f.Lag()) }))
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// leaderOnly answers pushed events only while this replica leads: a
// standby's 503 makes the platform deliver again, to the leader when the
// sink address points at whichever replica leads.
func (r *replica) leaderOnly(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if !r.lease.IsLeader() {
			http.Error(w, "standby: not the leader", http.StatusServiceUnavailable)
			return
		}
		h.ServeHTTP(w, req)
	})
}

// lead runs the leader's duties until ctx is done: the crawl jobs, the
// receiver's queue and the relay. When the lease is still held as they stop
// (a shutdown, not a loss), it publishes what was committed within grace.
func (r *replica) lead(ctx context.Context, jobs []crawler.Job, grace time.Duration) error {
	a := r.a
	if err := a.store.SetMeta(ctx, "mode", "cluster"); err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	if a.receiver != nil {
		g.Go(func() error { return a.receiver.Run(gctx) })
	}
	g.Go(func() error { return a.crawler.Run(gctx, jobs...) })
	relayDone := make(chan error, 1)
	go func() { relayDone <- a.relay.Run(gctx) }()
	err := g.Wait()
	<-relayDone
	if !r.lease.IsLeader() {
		return err
	}
	flushCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if ferr := a.relay.Flush(flushCtx); ferr != nil {
		n, _, _ := a.store.UnpublishedCount(context.Background())
		a.log.Warn("stopped leading with events unpublished; the next leader records them again", "unpublished", n, "err", ferr)
	}
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// promote readies a followed mirror for crawling: the tags it knows only
// from the stream get the history the old leader had (see
// store.ResolveHistory), so that the first crawl announces only what is new.
func (r *replica) promote(ctx context.Context) error {
	a := r.a
	refs, err := a.store.UnresolvedTags(ctx)
	if err != nil || len(refs) == 0 {
		return err
	}
	start := time.Now()
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(a.cfg.Crawl.Concurrency)
	var mu sync.Mutex
	resolved := 0
	for _, ref := range refs {
		g.Go(func() error {
			recs, err := a.client.HistorySince(gctx, a.client.PrivateImage(ref.Repo), ref.Name, time.Time{})
			if err != nil {
				if gctx.Err() != nil {
					return gctx.Err()
				}
				a.log.Warn("read history to ready a tag for crawling; its history is read silently", "repo", ref.Repo, "tag", ref.Name, "err", err)
				return nil
			}
			out := make([]store.HistoryRecord, len(recs))
			for i, rec := range recs {
				out[i] = store.HistoryRecord{Time: rec.UpdateTimestamp, Digest: rec.Digest}
			}
			if _, err := a.store.ResolveHistory(gctx, ref, out); err != nil {
				return err
			}
			mu.Lock()
			resolved++
			mu.Unlock()
			return nil
		})
	}
	err = g.Wait()
	a.log.Info("readied the followed mirror for crawling", "tags", len(refs), "resolved", resolved, "took", time.Since(start).Round(time.Millisecond).String())
	return err
}

// run runs the replica and the work already in g until ctx is done, then
// waits for it to stop: leader duties finish the page in flight and publish
// what is committed within grace, then the lease is released.
func (r *replica) run(ctx context.Context, cancel context.CancelFunc, g *errgroup.Group, gctx context.Context, jobs []crawler.Job, grace time.Duration) error {
	rep := &cluster.Replica{
		Lease: r.lease, Follower: r.follower, Promote: r.promote,
		Lead:   func(ctx context.Context) error { return r.lead(ctx, jobs, grace) },
		OnRole: r.setRole, Logger: r.a.log.With("part", "cluster"),
	}
	g.Go(func() error { return rep.Run(gctx) })
	workDone := make(chan error, 1)
	go func() { workDone <- g.Wait() }()
	select {
	case err := <-workDone:
		return err
	case <-ctx.Done():
	}
	r.a.log.Info("shutting down", "role", r.Role(), "grace", grace.String())
	cancel()
	select {
	case err := <-workDone:
		if err != nil && !errors.Is(err, context.Canceled) {
			return err
		}
		r.a.log.Info("stopped")
		return nil
	case <-time.After(2 * grace):
		return fmt.Errorf("work still running %s after the shutdown signal; exiting anyway (the mirror is consistent: unfinished transactions roll back)", 2*grace)
	}
}

// standbyFresh wraps the freshness check: only the leader crawls, so only
// the leader can be stale.
func (r *replica) standbyFresh(checks []admin.Check) []admin.Check {
	for i, c := range checks {
		if c.Name != "freshness" {
			continue
		}
		run := c.Run
		checks[i].Run = func(ctx context.Context) error {
			if !r.lease.IsLeader() {
				return nil
			}
			return run(ctx)
		}
	}
	return checks
}
