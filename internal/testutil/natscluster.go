package testutil

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATSCluster is a JetStream cluster of NATS servers on loopback ports,
// routed to each other. Each node can be stopped (as if killed: no lame
// duck, no leadership handed over) and started again on the same ports and
// storage.
type NATSCluster struct {
	Nodes []*NATSServer
}

// NATSClusterOf starts n servers named n1…nN as one JetStream cluster and
// waits until JetStream answers, until the test ends.
func NATSClusterOf(tb testing.TB, n int) *NATSCluster {
	tb.Helper()
	// Routes name every node's cluster port before any starts: take free
	// ports from the system and give them back.
	ports := make([]int, n)
	for i := range ports {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ports[i] = ln.Addr().(*net.TCPAddr).Port
		ln.Close()
	}
	c := &NATSCluster{}
	for i := range n {
		var routes []string
		for j, p := range ports {
			if j != i {
				routes = append(routes, fmt.Sprintf("nats://127.0.0.1:%d", p))
			}
		}
		s := &NATSServer{tb: tb, opts: server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: server.RANDOM_PORT,
			JetStream: true, StoreDir: tb.TempDir(), NoLog: true, NoSigs: true,
			Cluster: server.ClusterOpts{Name: "syncd-test", Host: "127.0.0.1", Port: ports[i]},
			Routes:  server.RoutesFromStr(strings.Join(routes, ","))}}
		c.Nodes = append(c.Nodes, s)
	}
	for _, s := range c.Nodes {
		s.Start()
		tb.Cleanup(s.Stop)
	}
	c.WaitJetStream(tb, 30*time.Second)
	return c
}

// URLs is the client URLs of every node, comma-separated, as a client
// configured for the whole cluster names them.
func (c *NATSCluster) URLs() string {
	urls := make([]string, len(c.Nodes))
	for i, s := range c.Nodes {
		urls[i] = s.URL()
	}
	return strings.Join(urls, ",")
}

// Node returns the node named name (n1…), or nil.
func (c *NATSCluster) Node(name string) *NATSServer {
	for _, s := range c.Nodes {
		if s.opts.ServerName == name {
			return s
		}
	}
	return nil
}

// Name is the server's name in the cluster.
func (s *NATSServer) Name() string { return s.opts.ServerName }

// WaitJetStream waits until JetStream answers through the running nodes:
// the cluster has elected its meta leader.
func (c *NATSCluster) WaitJetStream(tb testing.TB, within time.Duration) {
	tb.Helper()
	nc, err := nats.Connect(c.URLs(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	if err != nil {
		tb.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatal(err)
	}
	Eventually(tb, within, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := js.AccountInfo(ctx)
		return err
	})
}
