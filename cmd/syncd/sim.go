package main

import (
	"context"
	"fmt"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

// simCommand is "syncd sim": the platform simulator alone.
type simCommand struct {
	m        *Main
	flags    commonFlags
	addr     string
	seed     int64
	token    string
	regToken string
	strict   bool
	// httpSinks lets subscriptions name http:// sinks, for a syncd on
	// loopback.
	httpSinks bool
	scale     platformsim.Scale
	every     time.Duration
	perStep   int
	inclusiv  bool
}

func (c *simCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("sim", usage("sim"), &c.flags)
	fs.StringVar(&c.addr, "addr", "127.0.0.1:8080", "`host:port` to serve the platform API and the registry on")
	fs.Int64Var(&c.seed, "seed", 1, "seed of the generated organization and of its changes")
	fs.StringVar(&c.token, "token", "sim-token", "platform bearer `token` the simulator accepts")
	fs.StringVar(
		&c.regToken,
		"registry-token",
		"sim-registry-token",
		"registry `token` (the registry's audience) the simulator accepts",
	)
	fs.BoolVar(
		&c.httpSinks,
		"allow-http-sinks",
		false,
		"accept http:// subscription sinks on loopback (the platform wants https://), so pushes reach a local syncd",
	)
	fs.BoolVar(
		&c.strict,
		"strict",
		false,
		"behave as the vendor's service does: a platform token refused at the registry, tag families hidden unless asked",
	)
	fs.IntVar(
		&c.scale.NestedRepos,
		"nested-repos",
		0,
		"repos placed below subgroups (their registry path is charts/<name> and the like)",
	)
	fs.IntVar(&c.scale.DateTags, "date-tags", 0, "date-stamped tags (<version>-20yymmdd) per repo")
	fs.IntVar(&c.scale.EpochTags, "epoch-tags", 0, "epoch tags (<version>-r<N>) per repo")
	fs.IntVar(&c.scale.Repos, "repos", 20, "repos to generate")
	fs.IntVar(&c.scale.TagsPerRepo, "tags-per-repo", 5, "tags per repo")
	fs.IntVar(&c.scale.HistoryPerTag, "history-per-tag", 20, "history records per tag")
	fs.IntVar(&c.scale.Advisories, "advisories", 50, "advisories to generate")
	fs.DurationVar(&c.every, "change-every", 2*time.Second, "how often the data changes (0: never)")
	fs.IntVar(&c.perStep, "changes", 2, "changes applied each time")
	fs.BoolVar(
		&c.inclusiv,
		"history-start-inclusive",
		false,
		"treat the tag history start bound as inclusive (the spec leaves it open, so clients must cope with both)",
	)
	return fs.Parse(args)
}

func (c *simCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	log := newLogger(c.m.Stderr, cfg.Log)
	sim := platformsim.New(
		platformsim.Options{
			Seed:           c.seed,
			Tokens:         []string{c.token},
			RegistryTokens: []string{c.regToken},
			Strict:         c.strict,
			AllowHTTPSinks: c.httpSinks,
			StartInclusive: c.inclusiv,
			Vendor:         cfg.Platform.Vendor,
			PublicOrg:      cfg.Platform.PublicOrg,
		},
	)
	sim.Populate(c.scale)
	ln, err := c.m.listen(c.addr)
	if err != nil {
		// Runtime, as for every command's listeners: exit 1, not 2.
		return fmt.Errorf("--addr: %w", err)
	}
	g, gctx := errgroup.WithContext(ctx)
	url, serve := daemon.ServeSim(gctx, sim, ln, c.every, c.perStep)
	g.Go(serve)
	log.Info("simulator serving", "url", url, "org", "acme", "root_group", "org1", "repos", c.scale.Repos)
	return g.Wait()
}
