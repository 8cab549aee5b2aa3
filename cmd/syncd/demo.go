package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/store"
)

// startDemo starts the simulator on a loopback port with data that changes
// every few seconds, and points cfg at it and at an embedded NATS server.
func startDemo(ctx context.Context, g *errgroup.Group, cfg *config.Config, log *slog.Logger) error {
	// The ports first: a demo that cannot run must not have replaced the
	// mirror of one that does.
	for _, addr := range cfg.DemoAddrs() {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return fmt.Errorf("demo: %s is in use (another syncd demo, or another server?); nothing was touched: %w", addr, err)
		}
		ln.Close()
	}
	if err := store.ResetDemo(ctx, cfg.Store.Path); errors.Is(err, store.ErrNotDemo) {
		return usageError{err}
	} else if err != nil {
		return err
	}
	// Strict: the simulator behaves as the vendor's service does (audiences,
	// hidden tag families, repos below subgroups, protojson on the wire).
	sim := platformsim.New(platformsim.Options{Seed: time.Now().UnixNano(), Strict: true, Tokens: []string{config.DemoToken},
		RegistryTokens: []string{config.DemoRegistryToken}, AllowHTTPSinks: true})
	sim.Populate(platformsim.Scale{Repos: 12, TagsPerRepo: 4, HistoryPerTag: 20, Advisories: 30, NestedRepos: 4, DateTags: 1, EpochTags: 1})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fmt.Errorf("demo simulator: %w", err)
	}
	url := serveSim(ctx, g, sim, ln, 2*time.Second, 2)
	log.Info("demo: simulator running", "url", url, "token", "(demo)")
	cfg.Demo(url)
	return nil
}
