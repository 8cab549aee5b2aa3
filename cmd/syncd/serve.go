package main

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/daemon"
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
	g.Go(func() error { return daemon.ServeHTTP(ctx, ln, h) })
	return nil
}
