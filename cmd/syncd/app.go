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
	"strings"
	"time"

	"github.com/lmittmann/tint"
	"github.com/mattn/go-isatty"

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
		return slog.New(tint.NewHandler(w, &tint.Options{Level: level, TimeFormat: time.TimeOnly}))
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
}

func tokenSource(p config.Platform) platform.TokenSource {
	switch {
	case p.TokenFile != "":
		return &platform.FileToken{Path: p.TokenFile}
	case p.TokenCommand != "":
		return &platform.CommandToken{Command: p.TokenCommand}
	default:
		return platform.StaticToken(p.Token)
	}
}

// openApp opens the store, the platform client, NATS and the relay, and the
// crawler.
func openApp(ctx context.Context, cfg config.Config, log *slog.Logger) (*app, error) {
	a := &app{cfg: cfg, log: log}
	var err error
	a.store, err = store.Open(ctx, cfg.Store.Path, store.Options{InitialEvents: cfg.Store.InitialEvents, Logger: log.With("part", "store")})
	if err != nil {
		return nil, fmt.Errorf("open mirror %s: %w", cfg.Store.Path, err)
	}
	a.client, err = platform.New(platform.Config{
		BaseURL: cfg.Platform.BaseURL, RegistryURL: cfg.Platform.RegistryURL, Token: tokenSource(cfg.Platform),
		Organization: cfg.Platform.Organization, PublicOrg: cfg.Platform.PublicOrg, Vendor: cfg.Platform.Vendor,
		Timeout: cfg.Platform.Timeout.Duration, RequestsPerSecond: cfg.Crawl.RequestsPerSecond, Logger: log.With("part", "platform"),
	})
	if err != nil {
		a.Close()
		return nil, usageError{err}
	}
	pcfg := publish.Config{
		URL: cfg.NATS.URL, Listen: cfg.NATS.Listen, DataDir: filepath.Dir(cfg.Store.Path),
		SubjectPrefix: cfg.NATS.SubjectPrefix, Stream: cfg.NATS.Stream, MaxAge: cfg.NATS.MaxAge.Duration,
		DuplicateWindow: cfg.NATS.DuplicateWindow.Duration, Source: eventSource(cfg.Platform), Logger: log.With("part", "publish"),
	}
	a.nats, err = publish.Connect(ctx, pcfg)
	if err != nil {
		a.Close()
		return nil, err
	}
	a.relay = publish.NewRelay(a.nats.JS, a.store, pcfg)
	// Schedules were validated by config.Load.
	sched, _ := config.ParseSchedule(cfg.Crawl.Schedule)
	sweep, _ := config.ParseSchedule(cfg.Crawl.SweepSchedule)
	advisories, _ := config.ParseSchedule(cfg.Crawl.AdvisoriesSchedule)
	a.crawler = crawler.New(a.client, a.store, crawler.Config{
		Group: cfg.Platform.Group, Include: cfg.Crawl.Include, Exclude: cfg.Crawl.Exclude,
		PublicImages: cfg.Crawl.PublicImages, PublicOrg: cfg.Platform.PublicOrg,
		Concurrency: cfg.Crawl.Concurrency, Schedule: sched, SweepSchedule: sweep, AdvisoriesSchedule: advisories,
		Jitter: cfg.Crawl.Jitter.Duration, Logger: log.With("part", "crawler"),
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
