// Package publish turns committed events into JetStream messages: it runs
// an embedded NATS server or connects to one, provisions the stream, encodes
// events as CloudEvents and relays the outbox with at-least-once delivery and
// per-resource order.
package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config says where to publish.
type Config struct {
	URL     string // empty: run an embedded server
	Listen  string // embedded server: host:port to accept clients on; empty: in-process only
	DataDir string // embedded server: JetStream storage lives under DataDir/nats

	SubjectPrefix   string
	Stream          string
	MaxAge          time.Duration
	DuplicateWindow time.Duration
	Replicas        int
	// Source is the CloudEvents source attribute of every event.
	Source string
	Logger *slog.Logger
}

// Conn is a NATS connection with JetStream, and the embedded server behind
// it when there is one.
type Conn struct {
	NC     *nats.Conn
	JS     jetstream.JetStream
	Server *server.Server // nil when connected to an external server
	log    *slog.Logger
	closed chan struct{}
}

// Connect starts the embedded server when cfg.URL is empty, connects, and
// makes sure the stream exists.
func Connect(ctx context.Context, cfg Config) (*Conn, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Conn{log: log, closed: make(chan struct{})}
	opts := []nats.Option{
		nats.Name("syncd"),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(time.Second),
		nats.ReconnectJitter(500*time.Millisecond, 2*time.Second),
		nats.ReconnectBufSize(-1), // never buffer publishes while disconnected: the outbox is the buffer
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			if err != nil {
				log.Warn("NATS disconnected", "err", err)
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { log.Info("NATS reconnected", "server", nc.ConnectedUrlRedacted()) }),
		nats.ClosedHandler(func(*nats.Conn) { log.Debug("NATS connection closed"); close(c.closed) }),
	}
	url := cfg.URL
	if url == "" {
		ns, err := StartEmbedded(cfg.DataDir, cfg.Listen)
		if err != nil {
			return nil, err
		}
		c.Server = ns
		opts = append(opts, nats.InProcessServer(ns))
		if cfg.Listen != "" {
			log.Info("embedded NATS listening", "url", ns.ClientURL())
		}
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("connect to NATS: %w", err)
	}
	c.NC = nc
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		c.Close()
		return nil, err
	}
	c.JS = js
	if err := EnsureStream(ctx, js, cfg); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// StartEmbedded starts a NATS server with JetStream storing under
// dataDir/nats. With listen empty it accepts in-process connections only.
func StartEmbedded(dataDir, listen string) (*server.Server, error) {
	opts := &server.Options{
		ServerName: "syncd",
		JetStream:  true,
		StoreDir:   filepath.Join(dataDir, "nats"),
		NoSigs:     true,
		NoLog:      true,
	}
	if listen == "" {
		opts.DontListen = true
	} else {
		host, port, err := net.SplitHostPort(listen)
		if err != nil {
			return nil, fmt.Errorf("nats listen %q: %w", listen, err)
		}
		p, err := strconv.Atoi(port)
		if err != nil {
			return nil, fmt.Errorf("nats listen %q: bad port", listen)
		}
		opts.Host, opts.Port = host, p
		if p == 0 {
			opts.Port = server.RANDOM_PORT
		}
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	go ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS did not become ready in 15s (is the listen address in use?)")
	}
	return ns, nil
}

// EnsureStream creates the stream or updates it to cfg.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	sc := jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "syncd change events",
		Subjects:    []string{cfg.SubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		MaxAge:      cfg.MaxAge,
		Duplicates:  cfg.DuplicateWindow,
		Replicas:    max(cfg.Replicas, 1),
	}
	if _, err := js.CreateOrUpdateStream(ctx, sc); err != nil {
		return fmt.Errorf("create or update stream %s: %w", cfg.Stream, err)
	}
	return nil
}

// Close drains the connection and stops the embedded server.
func (c *Conn) Close() {
	if c.NC != nil {
		if err := c.NC.Drain(); err != nil {
			c.log.Warn("drain NATS connection", "err", err)
		}
		select {
		case <-c.closed:
		case <-time.After(5 * time.Second):
			c.log.Warn("NATS connection did not drain in 5s; closing it")
			c.NC.Close()
		}
	}
	if c.Server != nil {
		c.Server.Shutdown()
		c.Server.WaitForShutdown()
	}
}
