package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
)

// runCommand is "syncd run": the daemon.
type runCommand struct {
	m     *Main
	flags commonFlags
	demo  bool
	grace time.Duration
}

func (c *runCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("run", usage("run"), &c.flags)
	fs.BoolVar(
		&c.demo,
		"demo",
		false,
		"run against the built-in simulator and an embedded NATS server on 127.0.0.1:4222; no [platform] keys needed",
	)
	fs.DurationVar(
		&c.grace,
		"grace",
		4*time.Second,
		"on SIGINT/SIGTERM, how long to finish the page in flight and publish what is committed",
	)
	return fs.Parse(args)
}

func (c *runCommand) Run(ctx context.Context) error {
	load := config.Load
	if c.demo {
		load = config.LoadForDemo // never a configured NATS server, nor cluster mode
	}
	cfg, err := c.m.loadConfigWith(load, c.flags)
	if err != nil {
		return err
	}
	log := newLogger(c.m.Stderr, cfg.Log)
	// Bad input changes nothing: the platform keys are checked before the
	// mirror is locked (which creates its directory), and the lock is
	// taken before the demo replaces an earlier demo's mirror.
	if !c.demo {
		if err := cfg.RequirePlatform(); err != nil {
			return daemon.ConfigError{Err: err}
		}
	}
	command := "syncd run"
	if c.demo {
		command = "syncd run --demo"
	}
	release, err := daemon.LockMirror(cfg, command, log)
	if err != nil {
		return err
	}
	defer release()
	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	g, gctx := errgroup.WithContext(runCtx)
	if c.demo {
		serveSim, err := daemon.StartDemo(gctx, &cfg, log)
		if err != nil {
			return err
		}
		g.Go(serveSim)
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
	return c.serve(ctx, gctx, g, cfg, evLn, log)
}

// serve opens the parts and runs the leader's role, the receiver on evLn
// and the admin listener in g until gctx is done.
func (c *runCommand) serve(
	ctx, gctx context.Context,
	g *errgroup.Group,
	cfg config.Config,
	evLn net.Listener,
	log *slog.Logger,
) error {
	a, err := daemon.Open(ctx, cfg, log, daemon.Options{Version: version(), Published: publishedLevel(c.demo),
		AdoptSnapshot: true})
	if err != nil {
		return err
	}
	defer a.Close()
	if err := a.RecordMode(ctx, c.demo); err != nil {
		return err
	}
	log.Info("syncd running", "version", version(), "platform", cfg.Platform.BaseURL, "mirror", cfg.Store.Path,
		"schedule", cfg.Crawl.Schedule, "subjects", cfg.NATS.SubjectPrefix+".>", "cluster", cfg.Cluster.Enabled)
	r, err := a.Leadership(ctx, c.grace)
	if err != nil {
		return err
	}
	q, err := a.Query(ctx, r)
	if err != nil {
		return err
	}
	if a.Receiver != nil {
		log.Info("receiving pushed events", "listen", evLn.Addr().String(), "cluster", cfg.Cluster.Enabled)
		g.Go(func() error { return daemon.ServeHTTP(gctx, evLn, r.Receiver(a.Receiver)) })
	}
	if cfg.Admin.Listen != "" {
		if err := c.m.serveAdmin(gctx, g, cfg.Admin.Listen, a.AdminHandler(r), log); err != nil {
			return err
		}
	}
	if q != nil {
		g.Go(func() error { return q.Run(gctx) })
	}
	g.Go(func() error { return daemon.Prune(gctx, a.Store, cfg, log) })
	g.Go(func() error { return r.Run(gctx) })
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
