package main

import (
	"context"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
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
	f, err := daemon.OpenFollower(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer f.Close()
	log.Info("syncd following", "version", version(), "mirror", cfg.Store.Path, "stream", cfg.NATS.Stream, "consumer", cfg.Cluster.ConsumerName(cfg.Store.Path))
	g, gctx := errgroup.WithContext(ctx)
	if cfg.Admin.Listen != "" {
		if err := c.m.serveAdmin(gctx, g, cfg.Admin.Listen, f.AdminHandler(version()), log); err != nil {
			return err
		}
	}
	g.Go(func() error { return f.Run(gctx) })
	return g.Wait()
}
