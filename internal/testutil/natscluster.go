package testutil

import (
	"context"
	"fmt"
	"slices"
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
	// routeProxies is, by "from>to" node name, the fault proxy through
	// which the first node dials the second's routes. Only a proxied
	// cluster's nodes (ProxiedNATSClusterOf) route through nothing else:
	// the others learn each other's own cluster ports by gossip.
	routeProxies map[string]*FaultProxy
	proxied      bool
	clusterPorts []int
	// client is the options WaitJetStream connects with.
	client []nats.Option
}

// NATSClusterOf starts n servers named n1…nN as one JetStream cluster and
// waits until JetStream answers, until the test ends.
func NATSClusterOf(tb testing.TB, n int) *NATSCluster {
	tb.Helper()
	return natsCluster(tb, n, false, nil)
}

// NATSClusterWith is NATSClusterOf with mutate applied to each node's
// options before it first starts (users and their permissions, say), and
// client the options (credentials the nodes accept) of the client that
// waits for JetStream to answer.
func NATSClusterWith(tb testing.TB, n int, mutate func(*server.Options), client ...nats.Option) *NATSCluster {
	tb.Helper()
	return natsCluster(tb, n, false, mutate, client...)
}

// ProxiedNATSClusterOf is NATSClusterOf with every route through a
// FaultProxy of its own, one per direction (node i dials node j through
// proxy i>j), so that a test can partition nodes (Isolate). The nodes
// advertise neither their client URLs (a client reaches only the
// addresses it was given: a test's proxies) nor a usable route address
// (a node that learns of a peer by gossip cannot dial it around the
// proxy).
func ProxiedNATSClusterOf(tb testing.TB, n int) *NATSCluster {
	tb.Helper()
	return natsCluster(tb, n, true, nil)
}

func natsCluster(
	tb testing.TB,
	n int,
	proxied bool,
	mutate func(*server.Options),
	client ...nats.Option,
) *NATSCluster {
	tb.Helper()
	// Each node takes a cluster port the system picks as it starts. Ports
	// taken from the system beforehand and given back for the nodes to
	// bind could be taken meanwhile (by an outgoing connection of the
	// test, a proxy's listener): a node whose cluster port was taken never
	// became ready ("not ready in 10s"), and failed a cluster test now and
	// then. So every route a node is configured with goes through a fault
	// proxy, which holds its own port and learns its target as that node
	// starts (a JetStream cluster's first node needs routes configured).
	// Unproxied, the nodes advertise their own cluster ports, so that the
	// routes they learn of by gossip go straight to them.
	c := &NATSCluster{routeProxies: map[string]*FaultProxy{}, proxied: proxied, client: client}
	for i := range n {
		s := &NATSServer{
			tb: tb,
			opts: server.Options{ServerName: fmt.Sprintf("n%d", i+1), Host: "127.0.0.1", Port: server.RANDOM_PORT,
				JetStream: true, StoreDir: tb.TempDir(), NoLog: true, NoSigs: true,
				Cluster: server.ClusterOpts{Name: "syncd-test", Host: "127.0.0.1", Port: server.RANDOM_PORT}},
		}
		if proxied {
			// Port 1 refuses: an implicit route is tried once and dropped.
			s.opts.Cluster.NoAdvertise, s.opts.Cluster.Advertise = true, "127.0.0.1:1"
		}
		var routes []string
		for j := range n {
			if j != i {
				px := NewFaultProxy(tb, "")
				c.routeProxies[fmt.Sprintf("n%d>n%d", i+1, j+1)] = px
				routes = append(routes, "nats://"+px.Addr())
			}
		}
		s.opts.Routes = server.RoutesFromStr(strings.Join(routes, ","))
		if mutate != nil {
			mutate(&s.opts)
		}
		s.keepLog(true)
		c.Nodes = append(c.Nodes, s)
	}
	for i, s := range c.Nodes {
		s.Start()
		tb.Cleanup(s.Stop)
		// Restarts keep the port, where the proxies send the routes.
		s.opts.Cluster.Port = s.Server.ClusterAddr().Port
		c.clusterPorts = append(c.clusterPorts, s.opts.Cluster.Port)
		for j := range n {
			if px := c.routeProxies[fmt.Sprintf("n%d>n%d", j+1, i+1)]; px != nil {
				px.SetTarget(fmt.Sprintf("127.0.0.1:%d", s.opts.Cluster.Port))
			}
		}
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
	opts := append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, c.client...)
	nc, err := nats.Connect(c.URLs(), opts...)
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

// Isolate black-holes every route to and from the node named name
// (ProxiedNATSClusterOf): a partition of that node from the others, its
// clients still connected to it.
func (c *NATSCluster) Isolate(name string) {
	if !c.proxied {
		panic("testutil: Isolate needs a cluster of ProxiedNATSClusterOf: the others route around the proxies")
	}
	for link, p := range c.routeProxies {
		if from, to, _ := strings.Cut(link, ">"); from == name || to == name {
			p.BlackHole()
		}
	}
}

// HealRoutes ends every route fault: the nodes route to each other again.
func (c *NATSCluster) HealRoutes() {
	for _, p := range c.routeProxies {
		p.Heal()
	}
}

// RoutesProxied is nil when no running node has a route it dialed
// straight to another node's cluster port, around the proxies.
func (c *NATSCluster) RoutesProxied() error {
	for _, s := range c.Nodes {
		if s.Server == nil {
			continue
		}
		rz, err := s.Server.Routez(nil)
		if err != nil {
			return err
		}
		for _, r := range rz.Routes {
			if r.DidSolicit && slices.Contains(c.clusterPorts, r.Port) {
				return fmt.Errorf(
					"node %s has a route to %s at %s:%d, around the fault proxies",
					s.Name(),
					r.RemoteName,
					r.IP,
					r.Port,
				)
			}
		}
	}
	return nil
}
