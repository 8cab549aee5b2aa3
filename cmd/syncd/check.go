package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
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
	fs := c.m.flagSet("check", checkUsage, &c.flags)
	fs.DurationVar(&c.timeout, "timeout", 20*time.Second, "how long each check may take, retries included")
	return fs.Parse(args)
}

const checkUsage = `Usage: syncd check [--config FILE] [--timeout D]

Checks a configuration before "syncd run" is trusted with it. First every
key: all problems are printed at once, and the exit status is 2. Then one
request per credential, each to the audience it is for:

  platform API  lists one repo of [platform] group with the platform
                credential (an identity's is exchanged at sts_url first)
  registry      reads the tag history of one tag of that repo with the
                registry credential (or asks /token for the image when the
                repo has no tag; skipped when the group has no repo)
  NATS          connects to [nats] url and asks JetStream for the account
                (or, with manage_stream = false, for the stream); skipped
                for the embedded server, which "syncd run" starts itself

and prints one line per check: "ok", or "FAIL" with what to fix. Nothing is
written anywhere. Exit status: 0 when every check passed, 1 when one failed,
2 for bad flags or configuration.

Examples:
  syncd check --config /etc/syncd/syncd.toml
  SYNCD_PLATFORM_REGISTRY_TOKEN_COMMAND='chainctl auth token --audience cgr.dev' syncd check --config syncd.toml

Flags:
`

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
		return usageError{err}
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
