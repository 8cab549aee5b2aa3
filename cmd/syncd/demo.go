package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/store"
)

// demoToken and demoRegistryToken are the credentials the demo simulator
// accepts: like the real platform, it wants one per audience.
const (
	demoToken         = "demo-token"
	demoRegistryToken = "demo-registry-token"
)

// demoNATSListen is where the demo's embedded NATS server listens, so that
// "nats sub" from another shell reaches it.
const demoNATSListen = "127.0.0.1:4222"

// startDemo starts the simulator on a loopback port with data that changes
// every few seconds, and points cfg at it and at an embedded NATS server.
func startDemo(ctx context.Context, g *errgroup.Group, cfg *config.Config, log *slog.Logger) error {
	// The ports first: a demo that cannot run must not have replaced the
	// mirror of one that does.
	if err := demoPortsFree(*cfg); err != nil {
		return err
	}
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
	url := serveSim(ctx, g, sim, ln, 2*time.Second, 2)
	log.Info("demo: simulator running", "url", url, "token", "(demo)")
	demoConfig(cfg, url)
	return nil
}

// demoConfig is every setting the demo changes: the platform is the
// simulator at url, NATS an embedded server, and pushes from the simulator
// reach syncd within seconds while quick schedules repair whatever a push
// missed. Keys the user set keep their values; keys at their defaults take
// the demo's.
func demoConfig(cfg *config.Config, url string) {
	p := &cfg.Platform
	p.BaseURL, p.RegistryURL = url, url
	p.Token, p.TokenFile, p.TokenCommand = demoToken, "", ""
	p.RegistryToken, p.RegistryTokenFile, p.RegistryTokenCommand, p.RegistryCredentialHelper = demoRegistryToken, "", "", ""
	p.Identity, p.IdentityTokenFile = "", ""
	p.Group, p.Organization = "org1", "acme"
	def := config.Default()
	if cfg.NATS.URL == "" {
		orDemo(&cfg.NATS.Listen, "", demoNATSListen)
	}
	orDemo(&cfg.Events.Listen, "", "127.0.0.1:0")
	orDemo(&cfg.Events.Issuer, "", url)
	orDemo(&cfg.Crawl.Schedule, def.Crawl.Schedule, "@every 5s")
	orDemo(&cfg.Crawl.SweepSchedule, def.Crawl.SweepSchedule, "@every 30s")
	orDemo(&cfg.Crawl.AdvisoriesSchedule, def.Crawl.AdvisoriesSchedule, "@every 10s")
	orDemo(&cfg.Crawl.Jitter, def.Crawl.Jitter, config.Duration{Duration: time.Second})
	orDemo(&cfg.Crawl.RequestsPerSecond, def.Crawl.RequestsPerSecond, 0)
}

// orDemo sets *v to demo while it holds def.
func orDemo[T comparable](v *T, def, demo T) {
	if *v == def {
		*v = demo
	}
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

// demoPortsFree checks that the fixed ports the demo listens on are free:
// the embedded NATS server's and the admin listener's.
func demoPortsFree(cfg config.Config) error {
	addrs := []string{cfg.Admin.Listen}
	if cfg.NATS.URL == "" {
		addrs = append(addrs, cmp.Or(cfg.NATS.Listen, demoNATSListen))
	}
	for _, addr := range addrs {
		if addr == "" {
			continue
		}
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("demo: %s is in use (another syncd demo, or another server?); nothing was touched: %w", addr, err)
		}
		ln.Close()
	}
	return nil
}
