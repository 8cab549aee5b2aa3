package publish_test

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestDial_StalledConnectionIsReplaced: when the network stops taking the
// bytes syncd writes to the server (every packet dropped: the kernel's
// buffers fill and the write blocks), the connection is given up after
// WriteTimeout and a new one made once the network is back. nats.go's
// default holds the connection's lock in the blocked write for a minute,
// and every call on the connection waits on it whatever its context: a
// publish with a deadline of 200 ms waits here for at most about the
// write timeout.
func TestDial_StalledConnectionIsReplaced(t *testing.T) {
	srv := startServer(t, nil)
	proxy := testutil.NewFaultProxy(t, srv.URL()[len("nats://"):])
	cfg := configFor("nats://"+proxy.Addr(), nil)
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
	// Meanwhile a call with a context of its own is not held for long.
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begun := time.Now()
	_, _ = c.JS.Publish(ctx, testPrefix+".repo.created", []byte("{}"))
	if waited := time.Since(begun); waited > cfg.WriteTimeout+2*time.Second {
		t.Errorf("a publish with a 200ms deadline waited %s on the stalled connection", waited)
	}

	proxy.Heal()
	testutil.WaitFor(t, 10*time.Second, "reconnected", func() bool { return c.NC.Status() == nats.CONNECTED })
	ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := c.JS.Publish(ctx, testPrefix+".repo.created", []byte("{}")); err != nil {
		t.Fatalf("publish after the network is back: %v", err)
	}
}
