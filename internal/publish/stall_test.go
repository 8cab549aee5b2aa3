package publish_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestDial_StalledConnectionIsReplaced: when the network stops taking the
// bytes syncd writes to the server (every packet dropped: the kernel's
// buffers fill and the write blocks), a write fails after WriteTimeout and
// the connection is replaced once the network is back. nats.go's default
// holds the connection's lock in the blocked write for a minute (60.0 s
// measured without the option), and every call on the connection waits on
// it meanwhile, whatever its context.
func TestDial_StalledConnectionIsReplaced(t *testing.T) {
	proxy, cfg := proxiedConfig(t)
	cfg.WriteTimeout = 500 * time.Millisecond
	c := mustConnect(t, cfg)

	proxy.Stall()
	// Core publishes of 256 KiB until one blocks in the write and fails:
	// the buffers between here and the server hold a few MB.
	payload := make([]byte, 256<<10)
	start := time.Now()
	var err error
	for err == nil && time.Since(start) < 20*time.Second {
		err = c.NC.Publish("stall.test", payload)
	}
	took := time.Since(start)
	if err == nil {
		t.Fatalf("publishing into a stalled connection for %s never failed", took)
	}
	t.Logf("publishes into the stalled connection failed after %s: %v", took.Round(time.Millisecond), err)
	if took > 10*time.Second {
		t.Errorf("the first failure came after %s, want about the write timeout (%s)", took, cfg.WriteTimeout)
	}

	// A write that failed part way closed the connection, and nats.go
	// reconnects (status CONNECTED until its read loop sees it); one that
	// wrote nothing left it open, its buffer dropped. Either way publishes
	// are acknowledged again once the network is back.
	proxy.Heal()
	testutil.WaitFor(t, 10*time.Second, "a publish acknowledged after the network is back", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, err := c.JS.Publish(ctx, testPrefix+".repo.created", []byte("{}"))
		return err == nil
	})
}

// TestDial_QuietStalledConnectionIsFoundByPings: a connection that writes
// nothing (a standby between its lease reads) never blocks in a write
// when the network stalls; its pings, unanswered, find it stale, and it
// is replaced once the network is back. nats.go's default pings every
// two minutes and waits for two: four to six minutes.
func TestDial_QuietStalledConnectionIsFoundByPings(t *testing.T) {
	proxy, cfg := proxiedConfig(t)
	cfg.PingInterval = 100 * time.Millisecond
	c := mustConnect(t, cfg)
	var disconnected atomic.Bool
	c.NC.SetDisconnectErrHandler(func(*nats.Conn, error) { disconnected.Store(true) })

	proxy.Stall()
	testutil.WaitFor(t, 5*time.Second, "the stalled connection given up", disconnected.Load)
	proxy.Heal()
	testutil.WaitFor(t, 10*time.Second, "reconnected", func() bool { return c.NC.Status() == nats.CONNECTED })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.JS.Publish(ctx, testPrefix+".repo.created", []byte("{}")); err != nil {
		t.Fatalf("publish after the network is back: %v", err)
	}
}

// proxiedConfig starts a server behind a fault proxy and returns the proxy
// and the config of a test connecting through it.
func proxiedConfig(t *testing.T) (*testutil.FaultProxy, publish.Config) {
	t.Helper()
	srv := startServer(t, nil)
	proxy := testutil.NewFaultProxy(t, srv.URL()[len("nats://"):])
	return proxy, configFor("nats://"+proxy.Addr(), nil)
}
