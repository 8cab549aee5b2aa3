package main

import (
	"context"
	"errors"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// followCommand is "syncd follow": a mirror built from the event stream.
type followCommand struct {
	m     *Main
	flags commonFlags
}

const followUsage = `Usage: syncd follow [--config FILE] [--log-level LEVEL]

Keeps a mirror at [store] path from the event stream of a syncd leader
([nats] url, stream and subject_prefix), without any request to the
platform: every event's state is applied to the same tables "syncd run"
fills. A durable JetStream consumer ([cluster] consumer, default
syncd-follow-<node_id>, or syncd-follow-<host>-<hash of the mirror path>,
the same across restarts) starts at the first message the stream holds and
resumes where it stopped. A stream that does not exist yet is waited for
(the leader creates it), with /readyz unready meanwhile; one that does not
capture <subject_prefix>.> is an error. [platform] keys are not needed.
SIGINT or SIGTERM stops it cleanly.

Examples:
  syncd follow --config follower.toml
  SYNCD_NATS_URL=nats://nats:4222 SYNCD_STORE_PATH=/srv/mirror.db syncd follow

Flags:
`

func (c *followCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("follow", followUsage, &c.flags)
	return fs.Parse(args)
}

func (c *followCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	if cfg.NATS.URL == "" {
		return usageError{&config.Error{Key: "nats.url", Msg: "required: syncd follow reads the stream of a leader's NATS server"}}
	}
	log := newLogger(c.m.Stderr, cfg.Log)
	release, err := daemon.LockMirror(cfg, "syncd follow", log)
	if err != nil {
		return err
	}
	defer release()
	st, err := daemon.OpenStore(ctx, cfg, log, store.Options{})
	if err != nil {
		return err
	}
	defer daemon.CloseStore(st, log)
	pcfg := daemon.NATSConfig(cfg, log)
	nc, err := publish.Dial(ctx, pcfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	// A follower never changes the stream: the leader manages it. A
	// follower may well start before its leader has created it, so a
	// missing stream is waited for (the follower's Run retries); one that
	// exists and does not carry the events is a mistake to fix.
	switch err := publish.CheckStream(ctx, nc.JS, pcfg); {
	case errors.Is(err, publish.ErrStreamNotFound):
		log.Warn("the stream does not exist yet; following starts when a syncd leader creates it", "stream", cfg.NATS.Stream)
	case err != nil:
		return err
	}
	if err := cluster.RecordRole(ctx, st, cluster.RoleFollower, ""); err != nil {
		return err
	}
	f := daemon.NewFollower(nc, st, cfg, log)
	log.Info("syncd following", "version", version(), "mirror", cfg.Store.Path, "stream", cfg.NATS.Stream, "consumer", cfg.Cluster.ConsumerName(cfg.Store.Path))
	g, gctx := errgroup.WithContext(ctx)
	if cfg.Admin.Listen != "" {
		m := admin.NewMetrics(version())
		m.WatchLag(f.Lag)
		m.WatchNATS(nc.NC)
		checks := []admin.Check{{Name: "database", Run: st.Writable}, {Name: "stream", Run: func(context.Context) error { return f.Err() }}, admin.NATSCheck(nc.NC)}
		if err := c.m.serveAdmin(gctx, g, cfg.Admin.Listen, admin.Handler(m, checks), log); err != nil {
			return err
		}
	}
	g.Go(func() error { return f.Run(gctx) })
	g.Go(func() error {
		return crawler.Scheduler{Logger: log}.Run(gctx, crawler.PruneJob(st, cfg.Store.EventRetention.Duration, log))
	})
	err = g.Wait()
	log.Info("stopped following", "lag", f.Lag())
	return err
}
