package main

import (
	"context"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
)

// followCommand is "syncd follow": a mirror built from the event stream.
type followCommand struct {
	m       *Main
	flags   commonFlags
	restore cluster.RestoreMode
}

func (c *followCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("follow", usage("follow"), &c.flags)
	fs.Var(
		&c.restore,
		"from-snapshot",
		"start the mirror from the newest snapshot in the [snapshot] bucket: auto (when empty), true or false (see above)",
	)
	return fs.Parse(args)
}

func (c *followCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	if cfg.NATS.URL == "" {
		return daemon.ConfigError{
			Err: &config.Error{Key: "nats.url", Msg: "required: syncd follow reads the stream of a leader's NATS server"},
		}
	}
	log := newLogger(c.m.Stderr, cfg.Log)
	release, err := daemon.LockMirror(cfg, "syncd follow", log)
	if err != nil {
		return err
	}
	defer release()
	f, err := daemon.OpenFollower(ctx, cfg, c.restore, version(), log)
	if err != nil {
		return err
	}
	defer f.Close()
	log.Info(
		"syncd following",
		"version",
		version(),
		"mirror",
		cfg.Store.Path,
		"stream",
		cfg.NATS.Stream,
		"consumer",
		cfg.Cluster.ConsumerName(cfg.Store.Path),
	)
	q, err := f.Query(ctx, version())
	if err != nil {
		return err
	}
	g, gctx := errgroup.WithContext(ctx)
	if cfg.Admin.Listen != "" {
		if err := c.m.serveAdmin(gctx, g, cfg.Admin.Listen, f.AdminHandler(), log); err != nil {
			return err
		}
	}
	if q != nil {
		g.Go(func() error { return q.Run(gctx) })
	}
	g.Go(func() error { return f.Run(gctx) })
	return g.Wait()
}
