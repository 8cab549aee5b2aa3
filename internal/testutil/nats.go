package testutil

import (
	"cmp"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSServer is a NATS server with JetStream on a loopback port, which a
// test can stop and start again on the same port and storage.
type NATSServer struct {
	// Server is the running server; nil while stopped.
	Server *server.Server
	tb     testing.TB
	opts   server.Options
	// log is what the server logged, which a failed test keeps.
	log *serverLog
}

// NATS starts a NATS server with JetStream on a loopback port the system
// picks, storing under a temporary directory, until the test ends; mutate,
// when given, adjusts its options (accounts, TLS, limits).
func NATS(tb testing.TB, mutate ...func(*server.Options)) *NATSServer {
	tb.Helper()
	s := &NATSServer{tb: tb, opts: server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true,
		StoreDir: tb.TempDir(), NoLog: true, NoSigs: true}}
	for _, m := range mutate {
		m(&s.opts)
	}
	s.keepLog(false)
	s.Start()
	tb.Cleanup(s.Stop)
	return s
}

// URL is the server's client URL; it stays the same across a restart.
func (s *NATSServer) URL() string { return fmt.Sprintf("nats://%s:%d", s.opts.Host, s.opts.Port) }

// Start starts the server again after Stop, on the same port and storage.
func (s *NATSServer) Start() {
	s.tb.Helper()
	opts := s.opts // the server keeps and changes what it is given
	ns, err := server.NewServer(&opts)
	if err != nil {
		s.tb.Fatalf("new NATS server: %v", err)
	}
	if s.log != nil {
		ns.SetLoggerV2(s.log, false, false, false)
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		s.tb.Fatalf("NATS server on port %d not ready in 10s", s.opts.Port)
	}
	s.Server = ns
	s.opts.Port = ns.Addr().(*net.TCPAddr).Port
}

// keepLog has the server log into a buffer that a failed test keeps
// (serverLog.keepOnFailure).
func (s *NATSServer) keepLog(clustered bool) {
	s.log = &serverLog{}
	// Named once it has its port: servers of no name in one test each
	// keep a log of their own.
	s.log.keepOnFailure(s.tb, clustered, func() string { return cmp.Or(s.opts.ServerName, fmt.Sprint(s.opts.Port)) })
}

// Configure changes the options the next Start starts the server with
// (its port and storage stay), as an operator's edited configuration.
func (s *NATSServer) Configure(mutate func(*server.Options)) { mutate(&s.opts) }

// Stop shuts the server down and waits until it has.
func (s *NATSServer) Stop() {
	if s.Server != nil {
		s.Server.Shutdown()
		s.Server.WaitForShutdown()
		s.Server = nil
	}
}

// JetStream connects a client to the NATS server at url, closed when the
// test ends.
func JetStream(tb testing.TB, url string, opts ...nats.Option) jetstream.JetStream {
	tb.Helper()
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	return js
}
