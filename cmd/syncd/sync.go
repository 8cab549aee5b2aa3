package main

import (
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
}

const syncUsage = `Usage: syncd sync --once [--config FILE] [--log-level LEVEL]

Runs one full sweep (repos, tags, tag history, advisories, and deletions each
confirmed by the platform), waits until every resulting event is acknowledged
by JetStream, prints a summary and exits 0. For cron jobs and CI: use it
instead of "syncd run", not beside it on the same mirror.

It needs the same [platform] keys as "syncd run". Exit status: 1 when the
crawl or the publishing failed (the reason is printed; what was committed
stays in the mirror and its events in the outbox), 2 for bad flags or
configuration.

Examples:
  syncd sync --once --config syncd.toml
  # crontab: every 30 minutes, logs as JSON to a file
  */30 * * * * syncd sync --once --config /etc/syncd/syncd.toml 2>>/var/log/syncd-sync.log

Flags:
`

func (c *syncCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("sync", syncUsage, &c.flags)
	fs.BoolVar(&c.once, "once", false, "crawl everything once, publish every resulting event, print a summary and exit (required, so that \"syncd sync\" alone is not mistaken for the daemon)")
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
		return usageError{err}
	}
	log := newLogger(c.m.Stderr, cfg.Log)
	release, err := daemon.LockMirror(cfg, "syncd sync --once", log)
	if err != nil {
		return err
	}
	defer release()
	a, err := daemon.Open(ctx, cfg, log, daemon.Options{Version: version(), Published: slog.LevelDebug})
	if err != nil {
		return err
	}
	defer a.Close()
	sum, published, err := a.SyncOnce(ctx)
	if err != nil {
		return err
	}
	fmt.Fprintf(c.m.Stdout, "synced %d repos, %d tags, %d history reads (%d records), %d advisories, %d deletions; %d events recorded and published; %d requests; crawl %s, publish %s\n",
		sum.Repos, sum.Tags, sum.HistoryReads, sum.HistoryRecords, sum.Advisories, sum.Deleted, sum.Events, sum.Requests,
		sum.Duration.Round(time.Millisecond), published.Round(time.Millisecond))
	return nil
}
