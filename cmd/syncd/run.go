package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/robfig/cron/v3"
	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/events"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// runCommand is "syncd run": the daemon.
type runCommand struct {
	m     *Main
	flags commonFlags
	demo  bool
	grace time.Duration
}

func (c *runCommand) ParseFlags(args []string) error {
	fs := flag.NewFlagSet("syncd run", flag.ContinueOnError)
	fs.SetOutput(c.m.Stderr)
	c.flags.register(fs)
	fs.BoolVar(&c.demo, "demo", false, "run against the built-in simulator, whose data changes every few seconds, with an embedded NATS server on 127.0.0.1:4222; no account or [platform] keys needed")
	fs.DurationVar(&c.grace, "grace", 4*time.Second, "on SIGINT/SIGTERM, how long to finish the page in flight and publish what is committed; events left unpublished go out at the next start")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: syncd run [--config FILE] [--demo] [--grace DURATION] [--log-level LEVEL]

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
`)
		fs.PrintDefaults()
	}
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
	if c.demo {
		if err := startDemo(gctx, g, &cfg, log); err != nil {
			return err
		}
	} else if err := cfg.RequirePlatform(); err != nil {
		return usageError{err}
	}
	// The receiver listens before anything registers its address.
	var evLn net.Listener
	if cfg.Events.Listen != "" {
		if evLn, err = net.Listen("tcp", cfg.Events.Listen); err != nil {
			return fmt.Errorf("events listen %s: %w", cfg.Events.Listen, err)
		}
		defer evLn.Close()
		if c.demo && cfg.Events.SinkURL == "" {
			cfg.Events.SinkURL = "http://" + evLn.Addr().String()
		}
	}
	a, err := openApp(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer a.Close()
	if c.demo {
		if err := a.store.SetMeta(ctx, "mode", "demo"); err != nil {
			return err
		}
	}
	log.Info("syncd running", "version", version(), "platform", cfg.Platform.BaseURL, "mirror", cfg.Store.Path,
		"schedule", cfg.Crawl.Schedule, "subjects", cfg.NATS.SubjectPrefix+".>", "cluster", cfg.Cluster.Enabled)
	// In cluster mode only the lease holder crawls, receives and publishes.
	var rep *replica
	if cfg.Cluster.Enabled {
		if rep, err = newReplica(ctx, a); err != nil {
			return err
		}
	}

	switch {
	case a.receiver != nil && rep != nil:
		log.Info("receiving pushed events while leading", "listen", evLn.Addr().String())
		serveHTTP(gctx, g, evLn, rep.leaderOnly(a.receiver))
	case a.receiver != nil:
		serveReceiver(gctx, g, evLn, a.receiver, log)
	}
	schedules := jobSchedules(cfg)
	var jobs []crawler.Job
	if reg := a.registrar(); reg != nil && schedules["subscriptions"] != nil {
		jobs = append(jobs, crawler.Job{Name: "subscriptions", Schedule: schedules["subscriptions"], Run: reg.Ensure})
	} else {
		delete(schedules, "subscriptions")
	}
	fresh := admin.NewFreshness(schedules, cfg.Admin.StaleFactor, nil)
	a.onRun = func(job, outcome string, finished time.Time) {
		if outcome == "ok" || outcome == "partial" {
			fresh.Succeeded(job, finished)
		}
	}
	// One line per published event: at info in the demo, where watching
	// them is the point, and at debug otherwise.
	level := slog.LevelDebug
	if c.demo {
		level = slog.LevelInfo
	}
	a.onPublished = func(e store.Event) {
		a.metrics.EventPublished(e.Type, e.Age())
		log.Log(context.Background(), level, "published event", "type", e.Type,
			"subject", publish.Subject(cfg.NATS.SubjectPrefix, e.Resource, e.Action, e.Scope), "id", e.ID)
	}
	a.registerGauges()
	checks := a.readiness(fresh)
	if rep != nil {
		rep.registerGauges()
		checks = rep.standbyFresh(checks)
	}
	if cfg.Admin.Listen != "" {
		if err := serveAdmin(gctx, g, cfg.Admin.Listen, admin.Handler(a.metrics, checks), log); err != nil {
			return err
		}
	}
	if rep != nil {
		g.Go(func() error { return pruneLoop(gctx, a.store, cfg.Store.EventRetention.Duration, log) })
		return rep.run(ctx, cancel, g, gctx, jobs, c.grace)
	}
	g.Go(func() error { return a.crawler.Run(gctx, jobs...) })
	g.Go(func() error { return pruneLoop(gctx, a.store, cfg.Store.EventRetention.Duration, log) })

	// The relay outlives the rest, so that what was committed before the
	// signal is published before syncd exits.
	relayCtx, stopRelay := context.WithCancel(context.Background())
	defer stopRelay()
	relayDone := make(chan error, 1)
	go func() { relayDone <- a.relay.Run(relayCtx) }()
	workDone := make(chan error, 1)
	go func() { workDone <- g.Wait() }()

	select {
	case err := <-workDone:
		stopRelay()
		<-relayDone
		return err
	case <-ctx.Done():
	}
	deadline := time.Now().Add(c.grace)
	log.Info("shutting down: finishing the page in flight, then publishing what is committed", "grace", c.grace.String())
	cancel()
	select {
	case err := <-workDone:
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Error("stopping", "err", err)
		}
	case <-time.After(time.Until(deadline)):
		return fmt.Errorf("work still running %s after the shutdown signal; exiting anyway (the mirror is consistent: unfinished transactions roll back)", c.grace)
	}
	stopRelay()
	<-relayDone
	flushCtx, cancelFlush := context.WithDeadline(context.Background(), deadline)
	defer cancelFlush()
	if err := a.relay.Flush(flushCtx); err != nil {
		n, _, _ := a.store.UnpublishedCount(context.Background())
		log.Warn("stopped with events unpublished; they are published at the next start", "unpublished", n, "err", err)
		return nil
	}
	log.Info("stopped")
	return nil
}

// jobSchedules are the crawl jobs' schedules (validated by config.Load);
// a job whose schedule is empty is off and absent.
func jobSchedules(cfg config.Config) map[string]cron.Schedule {
	out := map[string]cron.Schedule{}
	for job, spec := range map[string]string{
		"crawl": cfg.Crawl.Schedule, "sweep": cfg.Crawl.SweepSchedule,
		"advisories": cfg.Crawl.AdvisoriesSchedule, "subscriptions": cfg.Crawl.SubscriptionsSchedule,
	} {
		if sched, _ := config.ParseSchedule(spec); sched != nil {
			out[job] = sched
		}
	}
	return out
}

// serveAdmin serves metrics and health on addr.
func serveAdmin(ctx context.Context, g *errgroup.Group, addr string, h http.Handler, log *slog.Logger) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("admin listen %s: %w (set [admin] listen to another address, or empty to turn it off)", addr, err)
	}
	log.Info("admin listening", "url", "http://"+ln.Addr().String()+"/metrics")
	serveHTTP(ctx, g, ln, h)
	return nil
}

// serveHTTP serves h on ln until ctx is done, with timeouts and header
// limits so that a slow or hostile client cannot hold connections open.
func serveHTTP(ctx context.Context, g *errgroup.Group, ln net.Listener, h http.Handler) {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return srv.Shutdown(shut)
	})
}

// serveReceiver serves pushed events on ln and works their queue.
func serveReceiver(ctx context.Context, g *errgroup.Group, ln net.Listener, rcv *events.Receiver, log *slog.Logger) {
	log.Info("receiving pushed events", "listen", ln.Addr().String())
	serveHTTP(ctx, g, ln, rcv)
	g.Go(func() error { return rcv.Run(ctx) })
}

// pruneLoop deletes published events older than retention, hourly.
func pruneLoop(ctx context.Context, st *store.Store, retention time.Duration, log *slog.Logger) error {
	t := time.NewTicker(time.Hour)
	defer t.Stop()
	for {
		if n, err := st.PruneEvents(ctx, time.Now().Add(-retention)); err != nil && ctx.Err() == nil {
			log.Warn("pruning old events failed", "err", err)
		} else if n > 0 {
			log.Info("pruned published events", "count", n, "older_than", retention.String())
		}
		if _, err := st.PruneDeliveries(ctx, time.Now().Add(-7*24*time.Hour)); err != nil && ctx.Err() == nil {
			log.Warn("pruning old delivery ids failed", "err", err)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// demoToken and demoRegistryToken are the credentials the demo simulator
// accepts: like the real platform, it wants one per audience.
const (
	demoToken         = "demo-token"
	demoRegistryToken = "demo-registry-token"
)

// startDemo starts the simulator on a loopback port with data that changes
// every few seconds, and points cfg at it and at an embedded NATS server.
func startDemo(ctx context.Context, g *errgroup.Group, cfg *config.Config, log *slog.Logger) error {
	if err := resetDemoMirror(ctx, cfg.Store.Path); err != nil {
		return err
	}
	// Strict: the simulator behaves as the vendor's service does (audiences,
	// hidden tag families, repos below subgroups, protojson on the wire).
	sim := platformsim.New(platformsim.Options{Seed: time.Now().UnixNano(), Strict: true, Tokens: []string{demoToken},
		RegistryTokens: []string{demoRegistryToken}, AllowHTTPSinks: true})
	sim.Populate(platformsim.Scale{Repos: 12, TagsPerRepo: 4, HistoryPerTag: 20, Advisories: 30, NestedRepos: 4, DateTags: 1, EpochTags: 1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo simulator: %w", err)
	}
	url := "http://" + ln.Addr().String()
	sim.SetBaseURL(url)
	srv := &http.Server{Handler: sim.Handler(), ReadHeaderTimeout: 5 * time.Second}
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-ctx.Done()
		sim.Close()
		return srv.Close()
	})
	g.Go(func() error { sim.Run(ctx, 2*time.Second, 2); return nil })
	log.Info("demo: simulator running", "url", url, "token", "(demo)")

	def := config.Default()
	cfg.Platform.BaseURL, cfg.Platform.RegistryURL = url, url
	cfg.Platform.Token, cfg.Platform.TokenFile, cfg.Platform.TokenCommand = demoToken, "", ""
	cfg.Platform.RegistryToken, cfg.Platform.RegistryTokenFile, cfg.Platform.RegistryTokenCommand, cfg.Platform.RegistryCredentialHelper = demoRegistryToken, "", "", ""
	cfg.Platform.Identity, cfg.Platform.IdentityTokenFile = "", ""
	cfg.Platform.Group, cfg.Platform.Organization = "org1", "acme"
	if cfg.NATS.URL == "" && cfg.NATS.Listen == "" {
		cfg.NATS.Listen = "127.0.0.1:4222"
	}
	// Pushes from the simulator reach syncd within seconds; the crawl
	// schedule repairs whatever a push missed.
	if cfg.Events.Listen == "" {
		cfg.Events.Listen = "127.0.0.1:0"
	}
	if cfg.Events.Issuer == "" {
		cfg.Events.Issuer = url
	}
	if cfg.Crawl.Schedule == def.Crawl.Schedule {
		cfg.Crawl.Schedule = "@every 5s"
	}
	if cfg.Crawl.SweepSchedule == def.Crawl.SweepSchedule {
		cfg.Crawl.SweepSchedule = "@every 30s"
	}
	if cfg.Crawl.AdvisoriesSchedule == def.Crawl.AdvisoriesSchedule {
		cfg.Crawl.AdvisoriesSchedule = "@every 10s"
	}
	if cfg.Crawl.Jitter == def.Crawl.Jitter {
		cfg.Crawl.Jitter.Duration = time.Second
	}
	if cfg.Crawl.RequestsPerSecond == def.Crawl.RequestsPerSecond {
		cfg.Crawl.RequestsPerSecond = 0
	}
	return nil
}

// resetDemoMirror removes a mirror left by an earlier demo, whose simulator
// is gone, so the demo starts from a fresh baseline. It refuses to touch a
// mirror of a real platform.
func resetDemoMirror(ctx context.Context, path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	st, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		return fmt.Errorf("open mirror %s: %w", path, err)
	}
	mode, err := st.Meta(ctx, "mode")
	st.Close()
	if err != nil {
		return err
	}
	if mode != "demo" {
		return usageError{fmt.Errorf("%s holds a mirror of a real platform; the demo will not overwrite it (set SYNCD_STORE_PATH to another file)", path)}
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("reset demo mirror: %w", err)
		}
	}
	return nil
}
