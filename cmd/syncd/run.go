package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/crawler"
)

// runCommand is "syncd run": the daemon.
type runCommand struct {
	m     *Main
	flags commonFlags
	demo  bool
	grace time.Duration
}

const runUsage = `Usage: syncd run [--config FILE] [--demo] [--grace DURATION] [--log-level LEVEL]

Runs the daemon: crawls the platform once at start and then on the [crawl]
schedules, keeps the SQLite mirror at [store] path, and publishes every change
to NATS JetStream ([nats] url, or an embedded server when it is empty). With
[events] listen and sink_url set, it also receives the platform's pushed
events, so changes arrive within seconds. SIGINT or SIGTERM stops it cleanly.

A real platform needs [platform] base_url, registry_url, group, organization
and a token; a missing or bad key exits 2 naming it. --demo needs none of
them: each demo starts from a fresh mirror, and refuses to overwrite a mirror
of a real platform.

Examples:
  syncd run --demo
  syncd run --config /etc/syncd/syncd.toml --log-level debug
  SYNCD_NATS_URL=nats://nats:4222 syncd run --config syncd.toml

Flags:
`

func (c *runCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("run", runUsage, &c.flags)
	fs.BoolVar(&c.demo, "demo", false, "run against the built-in simulator, whose data changes every few seconds, with an embedded NATS server on 127.0.0.1:4222; no account or [platform] keys needed")
	fs.DurationVar(&c.grace, "grace", 4*time.Second, "on SIGINT/SIGTERM, how long to finish the page in flight and publish what is committed; events left unpublished go out at the next start")
	return fs.Parse(args)
}

func (c *runCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	log := newLogger(c.m.Stderr, cfg.Log)
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(runCtx)
	// Bad input changes nothing: the platform keys are checked before the
	// mirror is locked (which creates its directory), and the lock is
	// taken before the demo replaces an earlier demo's mirror.
	if !c.demo {
		if err := cfg.RequirePlatform(); err != nil {
			return usageError{err}
		}
	}
	command := "syncd run"
	if c.demo {
		command = "syncd run --demo"
	}
	release, err := lockMirror(cfg, command, log)
	if err != nil {
		return err
	}
	defer release()
	if c.demo {
		if err := startDemo(gctx, g, &cfg, log); err != nil {
			return err
		}
	}
	// The receiver listens before anything registers its address.
	var evLn net.Listener
	if cfg.Events.Listen != "" {
		if evLn, err = c.m.listen(cfg.Events.Listen); err != nil {
			return fmt.Errorf("events listen %s: %w", cfg.Events.Listen, err)
		}
		defer evLn.Close()
		if c.demo && cfg.Events.SinkURL == "" {
			cfg.Events.SinkURL = "http://" + evLn.Addr().String()
		}
	}
	a, err := openApp(ctx, cfg, log, publishedLevel(c.demo))
	if err != nil {
		return err
	}
	defer a.Close()
	if err := a.recordMode(ctx, c.demo); err != nil {
		return err
	}
	log.Info("syncd running", "version", version(), "platform", cfg.Platform.BaseURL, "mirror", cfg.Store.Path,
		"schedule", cfg.Crawl.Schedule, "subjects", cfg.NATS.SubjectPrefix+".>", "cluster", cfg.Cluster.Enabled)
	r, err := a.role(ctx, c.grace)
	if err != nil {
		return err
	}
	if a.receiver != nil {
		log.Info("receiving pushed events", "listen", evLn.Addr().String(), "cluster", cfg.Cluster.Enabled)
		serveHTTP(gctx, g, evLn, r.receiver(a.receiver))
	}
	if cfg.Admin.Listen != "" {
		if err := c.m.serveAdmin(gctx, g, cfg.Admin.Listen, a.adminHandler(r), log); err != nil {
			return err
		}
	}
	g.Go(func() error {
		return crawler.Scheduler{Logger: log}.Run(gctx, crawler.PruneJob(a.store, cfg.Store.EventRetention.Duration, log))
	})
	g.Go(func() error { return r.run(gctx) })
	return g.Wait()
}

// publishedLevel is the level of the line logged for every published event:
// info in the demo, where watching them is the point, and debug otherwise.
func publishedLevel(demo bool) slog.Level {
	if demo {
		return slog.LevelInfo
	}
	return slog.LevelDebug
}

// recordMode marks a mirror of the demo, or of cluster mode, in its meta:
// the demo overwrites only a mirror of its own.
func (a *app) recordMode(ctx context.Context, demo bool) error {
	switch {
	case a.cfg.Cluster.Enabled:
		return a.store.SetMeta(ctx, "mode", "cluster")
	case demo:
		return a.store.SetMeta(ctx, "mode", "demo")
	}
	return nil
}

// leaderRole is how "syncd run" does the leader's duties: directly in
// single mode, and in cluster mode as a replica, while it holds the lease.
type leaderRole struct {
	run func(ctx context.Context) error
	// leading reports whether this replica leads now; nil: always.
	leading func() bool
	// receiver wraps the webhook receiver: a standby answers 503.
	receiver func(h http.Handler) http.Handler
	// follower follows the stream while standing by; nil in single mode.
	follower *cluster.Follower
}

// role builds the leader's duties and, in cluster mode, the replica that
// runs them while it holds the lease.
func (a *app) role(ctx context.Context, grace time.Duration) (leaderRole, error) {
	if !a.cfg.Cluster.Enabled {
		return leaderRole{run: a.duties(grace, nil).Run, receiver: func(h http.Handler) http.Handler { return h }}, nil
	}
	cl, node := a.cfg.Cluster, a.cfg.Cluster.Node()
	lease, err := cluster.NewLease(ctx, a.nats.JS, cluster.LeaseConfig{Bucket: cl.Bucket, Key: cl.Key, Node: node,
		TTL: cl.LeaseTTL.Duration, Replicas: a.cfg.NATS.Replicas, Logger: a.log.With("part", "lease")})
	if err != nil {
		return leaderRole{}, err
	}
	rep := &cluster.Replica{Lease: lease, Follower: newFollower(a.nats, a.store, a.cfg, cluster.RestoreWhenEmpty, a.log),
		Promote: a.crawler.ResolveFollowed, Lead: a.duties(grace, lease.IsLeader).Run, Meta: a.store, Logger: a.log.With("part", "cluster")}
	a.metrics.WatchReplica(rep, cluster.RoleLeader, cluster.RoleStandby)
	a.metrics.WatchLag(rep.Follower.Lag)
	return leaderRole{run: rep.Run, leading: lease.IsLeader, receiver: lease.LeaderOnly, follower: rep.Follower}, nil
}

// adminHandler serves the metrics and the readiness checks; r.leading says
// whether freshness and publishing are checked (only the leader crawls and
// publishes), and whether the standby's following is.
func (a *app) adminHandler(r leaderRole) http.Handler {
	leading, m := r.leading, a.metrics
	m.WatchOutbox(a.store)
	m.WatchFailures(a.store)
	m.WatchNATS(a.nats.NC)
	if a.receiver != nil {
		m.WatchReceiver(&a.receiver.Stats)
	}
	checks := []admin.Check{{Name: "database", Run: a.store.Writable}, admin.NATSCheck(a.nats.NC), admin.RoleCheck("publish", a.relay, leading),
		admin.FreshnessCheck(a.fresh, leading), admin.BaselineCheck(a.store, leading), admin.CredentialsCheck(a.client, leading)}
	if r.follower != nil {
		checks = append(checks, admin.RoleCheck("stream", r.follower, func() bool { return !leading() }))
	}
	if s := a.snapshots; s != nil {
		m.WatchSnapshots(func() (time.Time, int64) { l := s.Last(); return l.Created, l.Bytes })
	}
	return admin.Handler(m, checks)
}
