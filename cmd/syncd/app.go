package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"strings"
	"time"

	"github.com/lmittmann/tint"
	"github.com/mattn/go-isatty"
	"github.com/robfig/cron/v3"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/events"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

func version() string {
	if bi, ok := debug.ReadBuildInfo(); ok && bi.Main.Version != "" {
		return bi.Main.Version
	}
	return "(devel)"
}

// commonFlags are the flags every command takes.
type commonFlags struct {
	configPath string
	logLevel   string
}

func (f *commonFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.configPath, "config", "", "TOML configuration `file` (every key is in config.example.toml); without it, the defaults. SYNCD_<SECTION>_<KEY> environment variables override either")
	fs.StringVar(&f.logLevel, "log-level", "", "log `level`: debug, info, warn or error (overrides [log] level)")
}

// flagSet is the flag set of "syncd <name>", with the common flags; its
// --help prints usage and then the flags.
func (m *Main) flagSet(name, usage string, common *commonFlags) *flag.FlagSet {
	fs := flag.NewFlagSet("syncd "+name, flag.ContinueOnError)
	fs.SetOutput(m.Stderr)
	common.register(fs)
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), usage)
		fs.PrintDefaults()
	}
	return fs
}

// loadConfig loads the configuration; its errors exit 2.
func (m *Main) loadConfig(f commonFlags) (config.Config, error) {
	cfg, err := config.Load(f.configPath, m.Environ)
	if err != nil {
		return cfg, usageError{err}
	}
	if f.logLevel != "" {
		cfg.Log.Level = f.logLevel
		if err := cfg.Validate(); err != nil {
			return cfg, usageError{fmt.Errorf("--log-level: %w", err)}
		}
	}
	return cfg, nil
}

// newLogger logs with tint on a terminal and JSON otherwise.
func newLogger(w io.Writer, c config.Log) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(c.Level))
	format := c.Format
	if format == "auto" {
		format = "json"
		if f, ok := w.(*os.File); ok && isatty.IsTerminal(f.Fd()) {
			format = "text"
		}
	}
	if format == "text" {
		return slog.New(tint.NewTextHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly}))
	}
	return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
}

// schedules are the jobs' schedules, parsed once from [crawl]; a job whose
// schedule is empty is off and absent.
type schedules map[string]cron.Schedule

func parseSchedules(c config.Crawl) (schedules, error) {
	out := schedules{}
	for job, spec := range map[string]string{crawler.JobCrawl: c.Schedule, crawler.JobSweep: c.SweepSchedule,
		crawler.JobAdvisories: c.AdvisoriesSchedule, crawler.JobSubscriptions: c.SubscriptionsSchedule} {
		sched, err := config.ParseSchedule(spec)
		if err != nil {
			return nil, usageError{fmt.Errorf("crawl: %s schedule %q: %w", job, spec, err)}
		}
		if sched != nil {
			out[job] = sched
		}
	}
	return out, nil
}

// app is a syncd that crawls and publishes: its parts, opened in order by
// openApp and closed in reverse, and the observers each part was given.
type app struct {
	cfg      config.Config
	log      *slog.Logger
	jobs     schedules
	metrics  *admin.Metrics
	fresh    *admin.Freshness
	store    *store.Store
	client   *platform.Client
	nats     *publish.Conn
	relay    *publish.Relay
	crawler  *crawler.Crawler
	receiver *events.Receiver // nil when [events] listen is empty
	// registrar keeps the event subscription; nil when [events] sink_url
	// is empty (crawl only).
	registrar *events.Registrar
	// snapshots writes the leader's snapshots; nil when [snapshot] enabled
	// is false.
	snapshots *cluster.Snapshotter
}

// openApp opens the parts. published is the level of the line logged for
// every published event.
func openApp(ctx context.Context, cfg config.Config, log *slog.Logger, published slog.Level) (*app, error) {
	a := &app{cfg: cfg, log: log, metrics: admin.NewMetrics(version())}
	var err error
	if a.jobs, err = parseSchedules(cfg.Crawl); err != nil {
		return nil, err
	}
	if cfg.Events.SinkURL == "" {
		delete(a.jobs, crawler.JobSubscriptions)
	}
	a.fresh = admin.NewFreshness(a.jobs, cfg.Admin.StaleFactor, nil)
	if a.store, err = openStore(ctx, cfg, log, store.Options{OnEvents: a.metrics.EventsRecorded}); err != nil {
		return nil, err
	}
	if a.client, err = newClient(cfg, log, a.metrics.ObserveRequest); err != nil {
		a.Close()
		return nil, usageError{err}
	}
	pcfg := natsConfig(cfg, log)
	if a.nats, err = publish.Connect(ctx, pcfg); err != nil {
		a.Close()
		return nil, err
	}
	relayOpts := []publish.RelayOption{publish.WithOnPublished(a.observePublished(pcfg.Format(), published))}
	if cfg.KV.Enabled {
		kv, err := publish.OpenKV(ctx, a.nats.JS, kvConfig(cfg, log), a.store)
		if err != nil {
			a.Close()
			return nil, err
		}
		relayOpts = append(relayOpts, publish.WithKV(kv))
	}
	a.relay = publish.NewRelay(a.nats.JS, a.store, pcfg, relayOpts...)
	a.crawler = newCrawler(cfg, a.client, a.store, a.jobs, a.observeRun, log)
	a.receiver = newReceiver(cfg, a.crawler, a.store, log)
	a.registrar = newRegistrar(cfg, a.client, a.store, log)
	if sc := cfg.Snapshot; sc.Enabled {
		a.snapshots = cluster.NewSnapshotter(a.nats.JS, a.store, cluster.SnapshotConfig{Bucket: sc.Bucket, Replicas: cfg.NATS.Replicas,
			Stream: cfg.NATS.Stream, Every: sc.Every.Duration, Keep: sc.Keep, Dir: filepath.Dir(cfg.Store.Path), Logger: log.With("part", "snapshot")})
	}
	return a, nil
}

// observeRun is told of every finished crawl job.
func (a *app) observeRun(job, outcome string, sum crawler.Summary, finished time.Time) {
	a.metrics.ObserveRun(job, outcome, sum.Duration, finished, map[string]int64{
		"repos": sum.Repos, "tags": sum.Tags, "tag_history": sum.HistoryRecords, "advisories": sum.Advisories})
	a.fresh.Observe(job, outcome, finished)
}

// observePublished counts every event JetStream acknowledged and logs one
// line for it.
func (a *app) observePublished(format publish.Format, level slog.Level) func(store.Event) {
	return func(e store.Event) {
		a.metrics.EventPublished(e.Type, e.Age())
		a.log.Log(context.Background(), level, "published event", "type", e.Type, "subject", format.Subject(e), "id", e.ID)
	}
}

// extraJobs are the jobs the crawler runs beside its own: reconciling the subscription.
func (a *app) extraJobs() []crawler.Job {
	if a.registrar == nil || a.jobs[crawler.JobSubscriptions] == nil {
		return nil
	}
	return []crawler.Job{{Name: crawler.JobSubscriptions, Schedule: a.jobs[crawler.JobSubscriptions], Run: a.registrar.Ensure}}
}

// duties are the leader's: the crawler's jobs, the receiver's queue and
// the relay, shut down within grace; drain as in cluster.Duties.
func (a *app) duties(grace time.Duration, drain func() bool) *cluster.Duties {
	jobs := a.extraJobs()
	work := []func(context.Context) error{func(ctx context.Context) error { return a.crawler.Run(ctx, jobs...) }}
	if a.receiver != nil {
		work = append(work, a.receiver.Run)
	}
	if a.snapshots != nil {
		work = append(work, a.snapshots.Run)
	}
	return &cluster.Duties{Work: work, Relay: a.relay, Outbox: a.store, Grace: grace, Drain: drain, Logger: a.log}
}

// Close closes what openApp opened, in reverse order, logging each error.
func (a *app) Close() error {
	if a.nats != nil {
		a.nats.Close()
	}
	if a.store != nil {
		return closeStore(a.store, a.log)
	}
	return nil
}

// openStore opens the mirror at [store] path.
func openStore(ctx context.Context, cfg config.Config, log *slog.Logger, opts store.Options) (*store.Store, error) {
	opts.InitialEvents, opts.Logger = cfg.Store.InitialEvents, log.With("part", "store")
	st, err := store.Open(ctx, cfg.Store.Path, opts)
	if err != nil {
		return nil, fmt.Errorf("open mirror %s: %w", cfg.Store.Path, err)
	}
	return st, nil
}

// lockMirror takes the mirror's lock for this process, as command, before
// anything opens it: one process writes a mirror (and the embedded NATS
// store beside it) at a time. The lock goes with the process.
func lockMirror(cfg config.Config, command string, log *slog.Logger) (release func(), err error) {
	l, err := store.LockMirror(cfg.Store.Path, command)
	if err != nil {
		return nil, err
	}
	return func() {
		if err := l.Release(); err != nil {
			log.Error("release the mirror's lock", "err", err)
		}
	}, nil
}

func closeStore(st *store.Store, log *slog.Logger) error {
	err := st.Close()
	if err != nil {
		log.Error("close mirror", "err", err)
	}
	return err
}

// natsConfig is where and how events are published.
func natsConfig(cfg config.Config, log *slog.Logger) publish.Config {
	n := cfg.NATS
	return publish.Config{
		URL: n.URL, Listen: n.Listen, DataDir: filepath.Dir(cfg.Store.Path),
		Credentials: n.Credentials, NKeySeed: n.NKeySeed, Token: n.Token, User: n.User, Password: n.Password,
		TLSCA: n.TLSCA, TLSCert: n.TLSCert, TLSKey: n.TLSKey,
		SubjectPrefix: n.SubjectPrefix, Stream: n.Stream, MaxAge: n.MaxAge.Duration,
		DuplicateWindow: n.DuplicateWindow.Duration, Replicas: n.Replicas, CheckStreamOnly: !n.ManageStream,
		// The CloudEvents source: the platform and group the events describe.
		Source: strings.TrimRight(cfg.Platform.BaseURL, "/") + "/" + cfg.Platform.Group,
		Logger: log.With("part", "publish"),
	}
}

// kvConfig is the publish.KVConfig of [kv].
func kvConfig(cfg config.Config, log *slog.Logger) publish.KVConfig {
	k := cfg.KV
	return publish.KVConfig{Tags: k.Tags, Repos: k.Repos, Advisories: k.Advisories, History: k.History,
		Replicas: cfg.BucketReplicas(), CheckOnly: !cfg.NATS.ManageStream, ReconcileInterval: k.ReconcileInterval.Duration,
		Logger: log.With("part", "kv")}
}

func newCrawler(cfg config.Config, client *platform.Client, st *store.Store, jobs schedules,
	onRun func(job, outcome string, sum crawler.Summary, finished time.Time), log *slog.Logger) *crawler.Crawler {
	c := cfg.Crawl
	return crawler.New(client, st, crawler.Config{
		Group: cfg.Platform.Group, Include: c.Include, Exclude: c.Exclude,
		PublicImages: c.PublicImages, PublicOrg: cfg.Platform.PublicOrg, Families: crawler.ParseFamilies(c.TagFamilies),
		UpdatedSinceMargin: c.UpdatedSinceMargin.Duration, Concurrency: c.Concurrency, Schedule: jobs[crawler.JobCrawl], SweepSchedule: jobs[crawler.JobSweep],
		AdvisoriesSchedule: jobs[crawler.JobAdvisories], Jitter: c.Jitter.Duration, Logger: log.With("part", "crawler"), OnRun: onRun,
	})
}

// newReceiver takes the platform's pushed events; nil when [events] listen
// is empty.
func newReceiver(cfg config.Config, jobs events.Jobs, st *store.Store, log *slog.Logger) *events.Receiver {
	e := cfg.Events
	if e.Listen == "" {
		return nil
	}
	// The platform's event types begin with dev.<vendor>.
	prefix := e.TypePrefix
	if prefix == "" {
		prefix = "dev." + cfg.Platform.Vendor + "."
	}
	return events.NewReceiver(events.Config{Issuer: e.Issuer, Audience: e.Audience, Groups: []string{cfg.Platform.Group},
		TypePrefix: prefix, MaxBody: e.MaxBody, QueueSize: e.QueueSize, Logger: log.With("part", "events")}, jobs, st)
}

// newRegistrar keeps syncd's event subscription; nil when [events]
// sink_url is empty.
func newRegistrar(cfg config.Config, client *platform.Client, st *store.Store, log *slog.Logger) *events.Registrar {
	if cfg.Events.SinkURL == "" {
		return nil
	}
	return &events.Registrar{Client: client, Store: st, Groups: []string{cfg.Platform.Group},
		Sink: cfg.Events.SinkURL, Logger: log.With("part", "events")}
}

// newFollower follows the stream into st, recording its lag there; restore
// says when it starts from a snapshot.
func newFollower(nc *publish.Conn, st *store.Store, cfg config.Config, restore cluster.RestoreMode, log *slog.Logger) *cluster.Follower {
	return cluster.NewFollower(nc.JS, st, cluster.FollowerConfig{Stream: cfg.NATS.Stream, SubjectPrefix: cfg.NATS.SubjectPrefix,
		Consumer: cfg.Cluster.ConsumerName(cfg.Store.Path), Meta: st, Logger: log.With("part", "follow"),
		SnapshotBucket: cfg.Snapshot.Bucket, Restore: restore, SnapshotDir: filepath.Dir(cfg.Store.Path)})
}
