package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/preflight"
)

// checkCommand is "syncd check": the configuration, then one request per
// credential and audience, and one NATS round trip, each with a verdict.
type checkCommand struct {
	m       *Main
	flags   commonFlags
	timeout time.Duration
}

func (c *checkCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("check", usage("check"), &c.flags)
	fs.DurationVar(&c.timeout, "timeout", 20*time.Second, "how long each check may take, retries included")
	return fs.Parse(args)
}

// checkFailed is the error of a check run in which some check failed; the
// lines printed say which and why.
type checkFailed struct{ failed, of int }

func (e checkFailed) Error() string { return fmt.Sprintf("%d of %d checks failed", e.failed, e.of) }

func (c *checkCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfigWith(config.LoadForPlatform, c.flags)
	if err != nil {
		return err
	}
	source := c.flags.configPath
	if source == "" {
		source = "defaults and environment"
	}
	fmt.Fprintf(c.m.Stdout, "ok    config %s: every key valid\n", source)
	log := newLogger(c.m.Stderr, cfg.Log)

	checks, err := preflight.Checks(cfg, log)
	if err != nil {
		return daemon.ConfigError{Err: err}
	}
	failed := 0
	for _, ch := range checks {
		cctx, cancel := context.WithTimeout(ctx, c.timeout)
		detail, err := ch.Run(cctx)
		cancel()
		switch {
		case errors.Is(err, preflight.ErrSkipped):
			fmt.Fprintf(c.m.Stdout, "skip  %s: %s\n", ch.Subject, detail)
		case err != nil:
			failed++
			fmt.Fprintf(c.m.Stdout, "FAIL  %s: %v\n", ch.Subject, err)
		default:
			fmt.Fprintf(c.m.Stdout, "ok    %s: %s\n", ch.Subject, detail)
		}
	}
	if failed > 0 {
		return checkFailed{failed, len(checks)}
	}
	return nil
}
