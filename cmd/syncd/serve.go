package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/platformsim"
)

// listen listens on addr, or takes the listener Main.Listen gives for it.
func (m *Main) listen(addr string) (net.Listener, error) {
	if m.Listen != nil {
		return m.Listen(addr)
	}
	return net.Listen("tcp", addr)
}

// serveAdmin serves metrics and health on addr.
func (m *Main) serveAdmin(ctx context.Context, g *errgroup.Group, addr string, h http.Handler, log *slog.Logger) error {
	ln, err := m.listen(addr)
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

// serveSim serves the simulator on ln until ctx is done, changing its data
// every so often (0: never) by changes, and returns its URL: a loopback one
// when ln listens on every address.
func serveSim(ctx context.Context, g *errgroup.Group, sim *platformsim.Sim, ln net.Listener, every time.Duration, changes int) string {
	addr := ln.Addr().(*net.TCPAddr)
	url := "http://" + addr.String()
	if addr.IP.IsUnspecified() {
		url = fmt.Sprintf("http://127.0.0.1:%d", addr.Port)
	}
	sim.SetBaseURL(url)
	serveHTTP(ctx, g, ln, sim.Handler())
	g.Go(func() error {
		<-ctx.Done()
		sim.Close()
		return nil
	})
	if every > 0 {
		g.Go(func() error { sim.Run(ctx, every, changes); return nil })
	}
	return url
}
