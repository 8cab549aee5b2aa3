package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/store"
)

// ServeHTTP serves h on ln until ctx is done, with timeouts and header
// limits so that a slow or hostile client cannot hold connections open.
func ServeHTTP(ctx context.Context, ln net.Listener, h http.Handler) error {
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       2 * time.Minute,
		MaxHeaderBytes:    64 << 10,
	}
	// A server that fails ends the wait for ctx too.
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-gctx.Done()
		shut, cancel := context.WithTimeout(context.Background(), shutdownWait)
		defer cancel()
		if err := srv.Shutdown(shut); errors.Is(err, context.DeadlineExceeded) {
			// A request still running after the wait (a push being
			// delivered, a page being read) is cut: syncd is stopping,
			// and its client retries elsewhere or later.
			return srv.Close()
		} else if err != nil {
			return err
		}
		return nil
	})
	return g.Wait()
}

// shutdownWait is how long ServeHTTP lets requests in flight finish once
// its context is done.
const shutdownWait = time.Second

// ServeSim points sim at ln's address (a loopback one when ln listens on
// every address) and returns that URL, and the function that serves sim on
// ln until ctx is done, changing its data every so often (0: never) by
// changes.
func ServeSim(
	ctx context.Context,
	sim *platformsim.Sim,
	ln net.Listener,
	every time.Duration,
	changes int,
) (url string, serve func() error) {
	addr := ln.Addr().(*net.TCPAddr)
	url = "http://" + addr.String()
	if addr.IP.IsUnspecified() {
		url = fmt.Sprintf("http://127.0.0.1:%d", addr.Port)
	}
	sim.SetBaseURL(url)
	return url, func() error {
		var g errgroup.Group
		if every > 0 {
			g.Go(func() error { sim.Run(ctx, every, changes); return nil })
		}
		g.Go(func() error { return ServeHTTP(ctx, ln, sim.Handler()) })
		err := g.Wait()
		sim.Close()
		return err
	}
}

// StartDemo prepares "syncd run --demo": it checks the demo's fixed ports,
// replaces the mirror of an earlier demo (refusing a real platform's,
// with a ConfigError), starts a simulator on a loopback port whose data
// changes every few seconds, and points cfg at it and at an embedded NATS
// server. serve serves the simulator until ctx is done.
func StartDemo(ctx context.Context, cfg *config.Config, log *slog.Logger) (serve func() error, err error) {
	// The ports first: a demo that cannot run must not have replaced the
	// mirror of one that does.
	for _, addr := range cfg.DemoAddrs() {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			return nil, fmt.Errorf(
				"demo: %s is in use (another syncd demo, or another server?); nothing was touched: %w",
				addr,
				err,
			)
		}
		ln.Close()
	}
	if err := store.ResetDemo(ctx, cfg.Store.Path); errors.Is(err, store.ErrNotDemo) {
		return nil, ConfigError{err}
	} else if err != nil {
		return nil, err
	}
	// Strict: the simulator behaves as the vendor's service does (audiences,
	// hidden tag families, repos below subgroups, protojson on the wire).
	sim := platformsim.New(
		platformsim.Options{Seed: time.Now().UnixNano(), Strict: true, Tokens: []string{config.DemoToken},
			RegistryTokens: []string{config.DemoRegistryToken}, AllowHTTPSinks: true},
	)
	sim.Populate(
		platformsim.Scale{
			Repos:         12,
			TagsPerRepo:   4,
			HistoryPerTag: 20,
			Advisories:    30,
			NestedRepos:   4,
			DateTags:      1,
			EpochTags:     1,
		},
	)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("demo simulator: %w", err)
	}
	url, serve := ServeSim(ctx, sim, ln, 2*time.Second, 2)
	log.Info("demo: simulator running", "url", url, "token", "(demo)")
	cfg.Demo(url)
	return serve, nil
}
