package main

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/syncd-dev/syncd/internal/daemon"
)

// syncCommand is "syncd sync --once": one complete crawl and publish.
type syncCommand struct {
	m     *Main
	flags commonFlags
	once  bool
	// timeout overrides [sync] timeout when set.
	timeout time.Duration
}

func (c *syncCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("sync", usage("sync"), &c.flags)
	fs.BoolVar(
		&c.once,
		"once",
		false,
		"crawl everything once, publish every resulting event, print a summary and exit (required)",
	)
	fs.DurationVar(
		&c.timeout,
		"timeout",
		0,
		"how long to wait for an unreachable platform or NATS server before giving up (exit 1); default: [sync] timeout",
	)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if !c.once {
		return fmt.Errorf("--once is required (the daemon is \"syncd run\")")
	}
	return nil
}

func (c *syncCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	if err := cfg.RequirePlatform(); err != nil {
		return daemon.ConfigError{Err: err}
	}
	log := newLogger(c.m.Stderr, cfg.Log)
	release, err := daemon.LockMirror(cfg, "syncd sync --once", log)
	if err != nil {
		return err
	}
	defer release()
	a, err := daemon.Open(
		ctx,
		cfg,
		log,
		daemon.Options{
			Version:     version(),
			Published:   slog.LevelDebug,
			GiveUpAfter: cmp.Or(c.timeout, cfg.Sync.Timeout.Duration),
		},
	)
	if err != nil {
		return err
	}
	defer a.Close()
	sum, published, err := a.SyncOnce(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(
		c.m.Stdout,
		"synced %d repos, %d tags, %d history reads (%d records), %d advisories, %d deletions; %d events recorded and published; %d requests; crawl %s, publish %s\n",
		sum.Repos,
		sum.Tags,
		sum.HistoryReads,
		sum.HistoryRecords,
		sum.Advisories,
		sum.Deleted,
		sum.Events,
		sum.Requests,
		sum.Duration.Round(time.Millisecond),
		published.Round(time.Millisecond),
	)
	return nil
}
