package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"runtime/debug"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/lmittmann/tint"
	"github.com/mattn/go-isatty"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncd-dev/syncd/internal/admin"
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

// app holds the parts a running syncd is made of, opened in order and
// closed in reverse.
type app struct {
	cfg     config.Config
	log     *slog.Logger
	store   *store.Store
	client  *platform.Client
	nats    *publish.Conn
	relay   *publish.Relay
	crawler *crawler.Crawler
	// receiver takes pushed events; nil when [events] listen is empty.
	receiver *events.Receiver
	metrics  *admin.Metrics
	// onRun is told of every finished crawl job, after the metrics.
	onRun func(job, outcome string, finished time.Time)
	// onPublished is told of every event JetStream acknowledged.
	onPublished func(store.Event)
}

// openApp opens the store, the platform client, NATS and the relay, and the
// crawler.
func openApp(ctx context.Context, cfg config.Config, log *slog.Logger) (*app, error) {
	a := &app{cfg: cfg, log: log, metrics: admin.NewMetrics(version())}
	var err error
	a.store, err = store.Open(ctx, cfg.Store.Path, store.Options{InitialEvents: cfg.Store.InitialEvents, Logger: log.With("part", "store"), OnEvents: a.metrics.EventsRecorded})
	if err != nil {
		return nil, fmt.Errorf("open mirror %s: %w", cfg.Store.Path, err)
	}
	a.client, err = newClient(cfg, log, a.metrics.ObserveRequest)
	if err != nil {
		a.Close()
		return nil, usageError{err}
	}
	pcfg := publish.Config{
		URL: cfg.NATS.URL, Listen: cfg.NATS.Listen, DataDir: filepath.Dir(cfg.Store.Path),
		Credentials: cfg.NATS.Credentials, NKeySeed: cfg.NATS.NKeySeed, Token: cfg.NATS.Token,
		User: cfg.NATS.User, Password: cfg.NATS.Password,
		TLSCA: cfg.NATS.TLSCA, TLSCert: cfg.NATS.TLSCert, TLSKey: cfg.NATS.TLSKey,
		SubjectPrefix: cfg.NATS.SubjectPrefix, Stream: cfg.NATS.Stream, MaxAge: cfg.NATS.MaxAge.Duration,
		DuplicateWindow: cfg.NATS.DuplicateWindow.Duration, Replicas: cfg.NATS.Replicas, CheckStreamOnly: !cfg.NATS.ManageStream,
		Source: eventSource(cfg.Platform), Logger: log.With("part", "publish"),
	}
	a.nats, err = publish.Connect(ctx, pcfg)
	if err != nil {
		a.Close()
		return nil, err
	}
	a.relay = publish.NewRelay(a.nats.JS, a.store, pcfg, publish.WithOnPublished(func(e store.Event) {
		if a.onPublished != nil {
			a.onPublished(e)
		}
	}))
	// Schedules were validated by config.Load.
	sched, _ := config.ParseSchedule(cfg.Crawl.Schedule)
	sweep, _ := config.ParseSchedule(cfg.Crawl.SweepSchedule)
	advisories, _ := config.ParseSchedule(cfg.Crawl.AdvisoriesSchedule)
	a.crawler = crawler.New(a.client, a.store, crawler.Config{
		Group: cfg.Platform.Group, Include: cfg.Crawl.Include, Exclude: cfg.Crawl.Exclude,
		PublicImages: cfg.Crawl.PublicImages, PublicOrg: cfg.Platform.PublicOrg, Families: crawler.ParseFamilies(cfg.Crawl.TagFamilies),
		Concurrency: cfg.Crawl.Concurrency, Schedule: sched, SweepSchedule: sweep, AdvisoriesSchedule: advisories,
		Jitter: cfg.Crawl.Jitter.Duration, Logger: log.With("part", "crawler"),
		OnRun: func(job, outcome string, sum crawler.Summary, finished time.Time) {
			a.metrics.ObserveRun(job, outcome, sum.Duration, finished, map[string]int64{
				"repos": sum.Repos, "tags": sum.Tags, "tag_history": sum.HistoryRecords, "advisories": sum.Advisories})
			if a.onRun != nil {
				a.onRun(job, outcome, finished)
			}
		},
	})
	if cfg.Events.Listen != "" {
		prefix := cfg.Events.TypePrefix
		if prefix == "" {
			prefix = "dev." + cfg.Platform.Vendor + "."
		}
		a.receiver = events.NewReceiver(events.Config{
			Issuer: cfg.Events.Issuer, Audience: cfg.Events.Audience, Groups: []string{cfg.Platform.Group},
			TypePrefix: prefix, MaxBody: cfg.Events.MaxBody, QueueSize: cfg.Events.QueueSize,
			Logger: log.With("part", "events"),
		}, a.crawler, a.store)
	}
	return a, nil
}

// registerGauges adds the series read at scrape time.
func (a *app) registerGauges() {
	m := a.metrics
	m.GaugeFunc("syncd_outbox_unpublished_events", "Events committed but not yet acknowledged by JetStream.", func() float64 {
		n, _, err := a.store.UnpublishedCount(context.Background())
		if err != nil {
			return -1
		}
		return float64(n)
	})
	m.GaugeFunc("syncd_outbox_oldest_unpublished_age_seconds", "Age of the oldest event waiting for JetStream (0: none).", func() float64 {
		_, oldest, err := a.store.UnpublishedCount(context.Background())
		if err != nil || oldest.IsZero() {
			return 0
		}
		return time.Since(oldest).Seconds()
	})
	for _, kind := range []string{"repo", "tag"} {
		m.GaugeFuncWith("syncd_crawl_failures", "Repos and tags whose reads failed and are retried with backoff (syncd status lists them).",
			prometheus.Labels{"kind": kind}, func() float64 {
				fs, err := a.store.Failures(context.Background())
				if err != nil {
					return -1
				}
				n := 0
				for _, f := range fs {
					if f.Kind == kind {
						n++
					}
				}
				return float64(n)
			})
	}
	m.GaugeFunc("syncd_nats_connected", "1 while the NATS connection is up.", func() float64 {
		if a.nats.NC.IsConnected() {
			return 1
		}
		return 0
	})
	if r := a.receiver; r != nil {
		for outcome, v := range map[string]*atomic.Int64{"accepted": &r.Stats.Accepted, "duplicate": &r.Stats.Duplicate, "ignored": &r.Stats.Ignored, "unknown": &r.Stats.Unknown} {
			m.CounterFunc("syncd_webhooks_received_total", "Verified pushed events by outcome.", prometheus.Labels{"outcome": outcome}, func() float64 { return float64(v.Load()) })
		}
		for _, reason := range events.RejectReasons() {
			m.CounterFunc("syncd_webhooks_rejected_total", "Pushed events rejected, by reason.", prometheus.Labels{"reason": reason},
				func() float64 { return float64(r.Stats.RejectedCount(reason)) })
		}
	}
}

// readiness are the checks behind /readyz.
func (a *app) readiness(fresh *admin.Freshness) []admin.Check {
	return []admin.Check{
		{Name: "database", Run: a.store.Writable},
		{Name: "nats", Run: func(context.Context) error {
			if !a.nats.NC.IsConnected() {
				return fmt.Errorf("not connected to NATS (%s)", a.nats.NC.Status())
			}
			return nil
		}},
		{Name: "freshness", Run: func(context.Context) error {
			if stale := fresh.Stale(); len(stale) > 0 {
				var parts []string
				for job, age := range stale {
					parts = append(parts, fmt.Sprintf("%s last succeeded %s ago", job, age.Round(time.Second)))
				}
				sort.Strings(parts)
				return errors.New(strings.Join(parts, "; "))
			}
			return nil
		}},
	}
}

// registrar keeps syncd's event subscription; nil when [events] sink_url
// is empty (crawl only).
func (a *app) registrar() *events.Registrar {
	if a.cfg.Events.SinkURL == "" {
		return nil
	}
	return &events.Registrar{Client: a.client, Store: a.store, Groups: []string{a.cfg.Platform.Group},
		Sink: a.cfg.Events.SinkURL, Logger: a.log.With("part", "events")}
}

// eventSource is the CloudEvents source of syncd's events: the platform
// and group they describe.
func eventSource(p config.Platform) string {
	return strings.TrimRight(p.BaseURL, "/") + "/" + p.Group
}

// Close closes what openApp opened, in reverse order, logging each error.
func (a *app) Close() error {
	var errs []error
	if a.nats != nil {
		a.nats.Close()
	}
	if a.store != nil {
		if err := a.store.Close(); err != nil {
			a.log.Error("close mirror", "err", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
