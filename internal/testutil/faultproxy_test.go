package testutil

import (
	"context"
	"fmt"

	"bufio"
	"bytes"
	"errors"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"
	"io"
	"net"
	"os"
	"syscall"
	"testing"
	"time"
)

// echoServer answers every line with itself, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// roundTrip writes a line and reads it back within d; the error says why
// not (a timeout, EOF).
func roundTrip(c net.Conn, r *bufio.Reader, d time.Duration) error {
	c.SetDeadline(time.Now().Add(d))
	defer c.SetDeadline(time.Time{})
	if _, err := c.Write([]byte("ping\n")); err != nil {
		return err
	}
	line, err := r.ReadString('\n')
	if err == nil && line != "ping\n" {
		return errors.New("echo garbled: " + line)
	}
	return err
}

func dialProxy(t *testing.T, p *FaultProxy) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c, bufio.NewReader(c)
}

// TestFaultProxy: bytes pass; latency delays a round trip by twice the
// delay; a black hole keeps the connection open and silent (a read times
// out, no EOF or reset) and answers nothing on a new connection; Heal
// closes the connections that lost bytes and new ones pass; Cut closes
// every connection and each new one.
func TestFaultProxy(t *testing.T) {
	p := NewFaultProxy(t, echoServer(t))
	c, r := dialProxy(t, p)
	if err := roundTrip(c, r, time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}

	p.Latency(100 * time.Millisecond)
	start := time.Now()
	if err := roundTrip(c, r, 2*time.Second); err != nil {
		t.Fatalf("with latency: %v", err)
	}
	if rtt := time.Since(start); rtt < 200*time.Millisecond {
		t.Errorf("round trip with 100ms latency each way took %s, want at least 200ms", rtt)
	}
	p.Latency(0)

	p.BlackHole()
	if err := roundTrip(c, r, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("in the black hole: %v, want a timeout (no EOF, no reset)", err)
	}
	c2, r2 := dialProxy(t, p)
	if err := roundTrip(c2, r2, 300*time.Millisecond); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("new connection in the black hole: %v, want a timeout", err)
	}

	p.Heal()
	for _, conn := range []struct {
		c net.Conn
		r *bufio.Reader
	}{{c, r}, {c2, r2}} {
		conn.c.SetReadDeadline(time.Now().Add(time.Second))
		if _, err := conn.r.ReadString('\n'); !errors.Is(err, io.EOF) {
			t.Errorf("a connection that lost bytes after Heal: %v, want EOF", err)
		}
	}
	c3, r3 := dialProxy(t, p)
	if err := roundTrip(c3, r3, time.Second); err != nil {
		t.Fatalf("after Heal: %v", err)
	}

	p.Cut()
	c3.SetReadDeadline(time.Now().Add(time.Second))
	if _, err := r3.ReadString('\n'); !errors.Is(err, io.EOF) {
		t.Errorf("an open connection after Cut: %v, want EOF", err)
	}
	c4, r4 := dialProxy(t, p)
	if err := roundTrip(c4, r4, time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Errorf("a new connection after Cut: %v, want it closed at once", err)
	}
	WaitFor(t, 2*time.Second, "no connection left through the proxy", func() bool { return p.Conns() == 0 })
	p.Heal()
	c5, r5 := dialProxy(t, p)
	if err := roundTrip(c5, r5, time.Second); err != nil {
		t.Fatalf("after Cut and Heal: %v", err)
	}
}

// TestFaultProxy_SetTarget: a proxy whose target is not known yet closes
// each connection it accepts; once told the target, new connections pass.
// A proxied cluster's route proxies are made so, before their nodes pick
// their cluster ports.
func TestFaultProxy_SetTarget(t *testing.T) {
	p := NewFaultProxy(t, "")
	c, r := dialProxy(t, p)
	if err := roundTrip(c, r, time.Second); !errors.Is(err, io.EOF) && !errors.Is(err, syscall.ECONNRESET) {
		t.Fatalf("through a proxy with no target: %v, want the connection closed", err)
	}
	p.SetTarget(echoServer(t))
	c2, r2 := dialProxy(t, p)
	if err := roundTrip(c2, r2, time.Second); err != nil {
		t.Fatalf("after SetTarget: %v", err)
	}
}

// TestNATSCluster_NodeRestarts: the nodes of a cluster pick their cluster
// ports as they start; a node stopped and started again keeps its ports,
// and the cluster answers again with every node routed.
func TestNATSCluster_NodeRestarts(t *testing.T) {
	if os.Getenv("SYNCD_TEST_CLUSTER") == "" {
		t.Skip("make cluster-test runs it (SYNCD_TEST_CLUSTER=1): Raft elections take seconds")
	}
	c := NATSClusterOf(t, 3)
	for _, i := range []int{0, 2} {
		n := c.Nodes[i]
		url := n.URL()
		n.Stop()
		n.Start()
		if n.URL() != url {
			t.Fatalf("node %s came back at %s, was %s", n.Name(), n.URL(), url)
		}
	}
	c.WaitJetStream(t, 30*time.Second)
	Eventually(t, 30*time.Second, func() error {
		for _, n := range c.Nodes {
			if got := n.Server.NumRoutes(); got < 2 {
				return fmt.Errorf("node %s has %d routes, want 2 or more", n.Name(), got)
			}
		}
		return nil
	})
}

// TestProxiedNATSCluster_Isolate: in a cluster routed through fault
// proxies, no route goes around them; a node isolated from the others
// while it leads a stream (R3) loses it to the majority, which goes on
// storing messages; healed, the node routes again and holds them too.
func TestProxiedNATSCluster_Isolate(t *testing.T) {
	if os.Getenv("SYNCD_TEST_CLUSTER") == "" {
		t.Skip("make cluster-test runs it (SYNCD_TEST_CLUSTER=1): Raft elections take seconds")
	}
	c := ProxiedNATSClusterOf(t, 3)
	if err := c.RoutesProxied(); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	js := JetStream(t, c.Nodes[0].URL())
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t"}, Replicas: 3})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t", []byte("1")); err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	leader := info.Cluster.Leader
	c.Isolate(leader)
	var other *NATSServer
	for _, n := range c.Nodes {
		if n.Name() != leader {
			other = n
		}
	}
	ojs := JetStream(t, other.URL())
	Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(ctx, time.Second)
		defer cancel()
		_, err := ojs.Publish(ctx, "t", []byte("2"))
		return err
	})
	c.HealRoutes()
	Eventually(t, 30*time.Second, func() error {
		if err := c.RoutesProxied(); err != nil {
			return err
		}
		jsz, err := c.Node(leader).Server.Jsz(&server.JSzOptions{Accounts: true, Streams: true})
		if err != nil {
			return err
		}
		for _, a := range jsz.AccountDetails {
			for _, st := range a.Streams {
				if st.Name == "T" && st.State.Msgs == 2 {
					return nil
				}
			}
		}
		return fmt.Errorf("the healed node %s does not hold both messages yet", leader)
	})
}

// TestFaultProxy_Stall: a stalled proxy reads nothing, so a large write
// blocks (it times out having written part of it) while the connection
// stays open; Heal resumes it: what was written arrives, in order.
func TestFaultProxy_Stall(t *testing.T) {
	p := NewFaultProxy(t, echoServer(t))
	c, r := dialProxy(t, p)
	if err := roundTrip(c, r, time.Second); err != nil {
		t.Fatalf("through the proxy: %v", err)
	}
	p.Stall()
	big := append(bytes.Repeat([]byte("x"), 64<<20), '\n')
	c.SetWriteDeadline(time.Now().Add(500 * time.Millisecond))
	n, err := c.Write(big)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n >= len(big) {
		t.Fatalf("a 64 MiB write into a stalled proxy: %d bytes, %v; want a timeout having written part", n, err)
	}
	p.Heal()
	// The echo sends back what got through, the rest of the line never
	// having been written: read it back, then end the line.
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("\n")); err != nil {
		t.Fatalf("write after Heal: %v", err)
	}
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := r.ReadString('\n')
	if err != nil || len(line) != n+1 {
		t.Fatalf("after Heal read back %d bytes (%v), want the %d written and the newline", len(line), err, n)
	}
}
