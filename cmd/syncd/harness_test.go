package main

import (
	"context"
	"database/sql"
	"fmt"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/testutil"
)

// Parallel tests: a test here that spends its time waiting (for a lease,
// a retry, a stream that appears, a subprocess) rather than computing, and
// shares nothing with the others (its own simulator, NATS server, mirror
// files and loopback ports), calls t.Parallel, so that the waits of
// several overlap. Tests that assert how long something took against a
// tight bound (a takeover within two lease TTLs, a push's latency, a stop
// within the grace period) stay sequential: Go runs them first, before any
// parallel test starts, so that nothing of this package competes with them
// for the CPU.

// testConfig writes a syncd configuration for a test: the simulator as the
// platform, a test NATS server, a mirror file, and sections as given.
type testConfig struct {
	simURL, natsURL, dbPath string
	// crawl is the body of [crawl]; default: every second, no jitter.
	crawl string
	// events is the body of [events]; empty: no receiver.
	events string
	// adminListen is [admin] listen; empty: no admin listener.
	adminListen string
	// initialEvents is [store] initial_events; empty: the default.
	initialEvents string
	// credentials replaces the [platform] token line, for tests of other
	// credentials (an identity to assume, a registry token).
	credentials string
	// nats is more lines of [nats].
	nats string
}

func (c testConfig) write(t *testing.T) string {
	t.Helper()
	if c.crawl == "" {
		c.crawl = "schedule = \"@every 1s\"\njitter = \"0s\"\nrequests_per_second = 0.0"
	}
	var store string
	if c.initialEvents != "" {
		store = fmt.Sprintf("initial_events = %q", c.initialEvents)
	}
	if c.credentials == "" {
		c.credentials = fmt.Sprintf("token = %q", e2eToken)
	}
	var b strings.Builder
	fmt.Fprintf(&b, `[platform]
base_url = %[1]q
registry_url = %[1]q
%[2]s
group = "org1"
organization = "acme"
timeout = "2s"

[crawl]
%[3]s

[nats]
url = %[4]q
%[8]s

[store]
path = %[5]q
%[7]s

[admin]
listen = %[6]q

[log]
level = "debug"
format = "json"
`, c.simURL, c.credentials, c.crawl, c.natsURL, c.dbPath, c.adminListen, store, c.nats)
	if c.events != "" {
		fmt.Fprintf(&b, "\n[events]\n%s\n", c.events)
	}
	return writeFile(t, "syncd.toml", b.String())
}

// e2eConfig is the common case: a crawl schedule and nothing else.
func e2eConfig(t *testing.T, simURL, natsURL, dbPath, schedule string) string {
	return testConfig{simURL: simURL, natsURL: natsURL, dbPath: dbPath,
		crawl: fmt.Sprintf("schedule = %q\njitter = \"0s\"\nrequests_per_second = 0.0", schedule)}.write(t)
}

// runningCmd is a syncd command running in the test process.
type runningCmd struct {
	args   []string
	cancel context.CancelFunc
	done   chan int
	stderr *syncBuffer
}

// startDaemon runs "syncd run --config cfg" until stop, handing it lns.
func startDaemon(t *testing.T, cfg string, lns ...net.Listener) *runningCmd {
	t.Helper()
	return startCommand(t, lns, "run", "--config", cfg)
}

// startCommand runs "syncd args..." until stop. The command takes the
// listeners lns (opened on :0 by testutil.Listen) for the addresses they
// have, where its config names them.
func startCommand(t *testing.T, lns []net.Listener, args ...string) *runningCmd {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	d := &runningCmd{args: args, cancel: cancel, done: make(chan int, 1), stderr: &syncBuffer{}}
	m := NewMain(&syncBuffer{}, d.stderr, nil)
	m.Listen = func(addr string) (net.Listener, error) {
		for _, ln := range lns {
			if ln.Addr().String() == addr {
				return ln, nil
			}
		}
		return net.Listen("tcp", addr)
	}
	go func() { d.done <- m.Run(ctx, args) }()
	t.Cleanup(func() {
		cancel()
		<-d.done
	})
	return d
}

// exited reports whether the command has exited, and its exit code.
func (d *runningCmd) exited() (int, bool) {
	select {
	case code := <-d.done:
		d.done <- code // for stop and the cleanup
		return code, true
	default:
		return 0, false
	}
}

// stop signals the daemon and checks that it exits 0 within 5 seconds.
func (d *runningCmd) stop(t *testing.T) {
	t.Helper()
	d.cancel()
	select {
	case code := <-d.done:
		d.done <- code // for the cleanup
		if code != exitOK {
			t.Fatalf("syncd %s exited %d; log:\n%s", d.args[0], code, d.stderr.String())
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("syncd %s did not stop within 5s of the signal", d.args[0])
	}
}

// waitBaseline waits for the mirror's first complete crawl, and for the
// extra condition (a SQL count that must be positive) when one is given.
func waitBaseline(t *testing.T, dbPath string, extra ...string) {
	t.Helper()
	testutil.WaitFor(t, 60*time.Second, "the baseline crawl", func() bool {
		if _, err := os.Stat(dbPath); err != nil {
			return false
		}
		db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro&_pragma=busy_timeout(5000)")
		if err != nil {
			return false
		}
		defer db.Close()
		var v string
		if db.QueryRow(`SELECT value FROM meta WHERE key = 'baseline_time'`).Scan(&v) != nil {
			return false
		}
		for _, q := range extra {
			var n int
			if db.QueryRow(q).Scan(&n) != nil || n == 0 {
				return false
			}
		}
		return true
	})
}
