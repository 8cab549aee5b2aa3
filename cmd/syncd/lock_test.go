package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestRun_OneWriterPerMirror runs syncd with its embedded NATS server, then
// tries a second "syncd run" and a "syncd sync --once" on the same config:
// both are refused at once with a message naming the holder, touch
// nothing, and every event the first one publishes afterwards is in its
// stream, once.
func TestRun_OneWriterPerMirror(t *testing.T) {
	sim, simURL := testutil.Sim(
		t,
		platformsim.Options{Seed: 5, Tokens: []string{e2eToken}},
		platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 3},
	)
	dir := t.TempDir()
	dbPath := filepath.Join(dir, "syncd.db")
	// The embedded server must be reachable to read its stream from here.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	natsAddr := ln.Addr().String()
	ln.Close()
	cfg := writeFile(t, "syncd.toml", fmt.Sprintf(`[platform]
base_url = %[1]q
registry_url = %[1]q
token = %[2]q
group = "org1"
organization = "acme"

[crawl]
schedule = "@every 1s"
jitter = "0s"
requests_per_second = 0.0

[nats]
listen = %[3]q

[store]
path = %[4]q
initial_events = "snapshot"

[admin]
listen = ""
`, simURL, e2eToken, natsAddr, dbPath))
	d := startDaemon(t, cfg)
	waitBaseline(t, dbPath)

	for _, args := range [][]string{{"sync", "--once"}, {"run"}} {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		code, _, stderr := runMain(ctx, append(args, "--config", cfg)...)
		cancel()
		if code != exitFailure {
			t.Errorf("syncd %s on a mirror in use exited %d, want %d: %s", args[0], code, exitFailure, stderr)
		}
		for _, want := range []string{"is in use by pid " + fmt.Sprint(os.Getpid()), "(syncd run)", dbPath} {
			if !strings.Contains(stderr, want) {
				t.Errorf("syncd %s: the refusal does not say %q: %s", args[0], want, stderr)
			}
		}
	}
	if code, ok := d.exited(); ok {
		t.Fatalf("the first syncd exited (%d) after the refused attempts:\n%s", code, d.stderr.String())
	}

	// The first one goes on, and its stream holds every event it recorded.
	for i, tg := range sim.Truth().Tags[:3] {
		if err := sim.MoveTag(tg.UID, fmt.Sprintf("sha256:%064x", 0x10c0+i)); err != nil {
			t.Fatal(err)
		}
	}
	db := openReader(t, dbPath)
	js := testutil.JetStream(t, "nats://"+natsAddr)
	var recorded, inStream int
	testutil.WaitFor(t, 30*time.Second, "every event, the three moves among them, in the stream", func() bool {
		var moves, unpublished int
		db.QueryRow(`SELECT count(*) FROM events`).Scan(&recorded)
		db.QueryRow(`SELECT count(*) FROM events WHERE type = 'tag.moved'`).Scan(&moves)
		db.QueryRow(`SELECT count(*) FROM outbox`).Scan(&unpublished)
		s, err := js.Stream(context.Background(), "SYNCD")
		if err != nil {
			return false
		}
		si, err := s.Info(context.Background(), jetstream.WithSubjectFilter("syncd.>"))
		if err != nil {
			return false
		}
		// Every message but the leader's checkpoints, which are no events.
		inStream = int(si.State.Msgs) - int(si.State.Subjects[publish.CheckpointSubject("syncd")])
		return moves == 3 && unpublished == 0 && inStream == recorded
	})
	d.stop(t)
	t.Logf("%d events recorded, %d in the stream", recorded, inStream)
}

// TestRun_WaitsForNATSAtStart starts syncd while its NATS server is down:
// it waits, saying so, instead of exiting, and goes on once the server is
// up, publishing everything.
func TestRun_WaitsForNATSAtStart(t *testing.T) {
	_, simURL := testutil.Sim(
		t,
		platformsim.Options{Seed: 6, Tokens: []string{e2eToken}},
		platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 2},
	)
	ns := testutil.NATS(t)
	ns.Stop()
	dbPath := filepath.Join(t.TempDir(), "syncd.db")
	cfg := testConfig{simURL: simURL, natsURL: ns.URL(), dbPath: dbPath, initialEvents: "snapshot"}.write(t)
	d := startDaemon(t, cfg)
	testutil.WaitFor(t, 20*time.Second, "syncd to say it waits for NATS", func() bool {
		return strings.Contains(d.stderr.String(), "NATS not reachable; waiting for it")
	})
	if code, ok := d.exited(); ok {
		t.Fatalf("syncd exited (%d) with NATS down instead of waiting:\n%s", code, d.stderr.String())
	}
	ns.Start()
	waitAllPublished(t, dbPath)
	d.stop(t)
}

// waitAllPublished waits for the baseline of the mirror at dbPath, and
// then for every event it recorded to be published.
func waitAllPublished(t *testing.T, dbPath string) {
	t.Helper()
	waitBaseline(t, dbPath)
	db := openReader(t, dbPath)
	testutil.WaitFor(t, 30*time.Second, "every event published", func() bool {
		var events, unpublished int
		db.QueryRow(`SELECT count(*) FROM events`).Scan(&events)
		db.QueryRow(`SELECT count(*) FROM outbox`).Scan(&unpublished)
		return events > 0 && unpublished == 0
	})
}

// TestRun_WaitsForJetStreamAtStart: "syncd run" connected to a node of a
// JetStream cluster that cannot elect a meta leader (two of its three
// nodes down) waits for JetStream to answer, saying so, instead of
// exiting, and syncs and publishes once a second node is back. Before,
// the stream's creation timed out after 5 s and syncd exited.
func TestRun_WaitsForJetStreamAtStart(t *testing.T) {
	_, simURL := testutil.Sim(
		t,
		platformsim.Options{Seed: 16, Tokens: []string{e2eToken}},
		platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 2},
	)
	cl := testutil.NATSClusterOf(t, 3)
	n1, n2, n3 := cl.Nodes[0], cl.Nodes[1], cl.Nodes[2]
	n2.Stop()
	n3.Stop()
	dbPath := filepath.Join(t.TempDir(), "syncd.db")
	cfg := testConfig{simURL: simURL, natsURL: n1.URL(), dbPath: dbPath, initialEvents: "snapshot"}.write(t)
	d := startDaemon(t, cfg)
	testutil.WaitFor(t, 60*time.Second, "syncd to say it waits for JetStream, or to exit", func() bool {
		_, exited := d.exited()
		return exited || strings.Contains(d.stderr.String(), "JetStream did not answer; trying again")
	})
	if code, ok := d.exited(); ok {
		t.Fatalf("syncd exited (%d) with JetStream unable to answer instead of waiting:\n%s", code, d.stderr.String())
	}
	n2.Start()
	waitAllPublished(t, dbPath)
	d.stop(t)
}

// TestRun_NotReadyWhileTheRegistryRefusesTheCredential runs syncd with a
// registry token the registry does not accept: /readyz answers 503 and says
// why (the credential refused, with the key to set, and the histories,
// read from the registry, pending: the listings end the baseline without
// it), where it used to answer 200 until the schedule fell behind.
func TestRun_NotReadyWhileTheRegistryRefusesTheCredential(t *testing.T) {
	_, simURL := testutil.Sim(
		t,
		platformsim.Options{
			Seed:           8,
			Strict:         true,
			Tokens:         []string{e2eToken},
			RegistryTokens: []string{"good-registry-token"},
		},
		platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 2},
	)
	ns := testutil.NATS(t)
	adminLn := testutil.Listen(t)
	cfg := testConfig{
		simURL:      simURL,
		natsURL:     ns.URL(),
		dbPath:      filepath.Join(t.TempDir(), "syncd.db"),
		adminListen: adminLn.Addr().String(),
		credentials: fmt.Sprintf("token = %q\nregistry_token = \"wrong-registry-token\"", e2eToken),
	}.write(
		t,
	)
	d := startDaemon(t, cfg, adminLn)
	var body string
	testutil.WaitFor(t, 30*time.Second, "/readyz to name the refused credential", func() bool {
		code, b := httpGet(t, "http://"+adminLn.Addr().String()+"/readyz")
		body = b
		return code == 503 && strings.Contains(b, "registry refused")
	})
	for _, want := range []string{"credentials", "registry_token", `"history"`} {
		if !strings.Contains(body, want) {
			t.Errorf("/readyz does not say %q: %s", want, body)
		}
	}
	if strings.Contains(body, "wrong-registry-token") {
		t.Errorf("/readyz shows the token: %s", body)
	}
	// syncd status, from another process while the daemon runs, says the
	// same: the crawl failed because the registry refused the credential,
	// and which key to set.
	testutil.WaitFor(t, 30*time.Second, "syncd status to name the refused credential", func() bool {
		code, out, _ := runMain(context.Background(), "status", "--config", cfg)
		body = out
		return code == exitOK && strings.Contains(out, "registry refused") && strings.Contains(out, "registry_token")
	})
	if strings.Contains(body, "wrong-registry-token") {
		t.Errorf("syncd status shows the token: %s", body)
	}
	d.stop(t)
}

// TestRun_NotReadyWhileThePlatformIsUnreachable points syncd at a port
// where nothing listens: /readyz answers 503 from the start (no baseline)
// instead of 200, and syncd status says which request is retried and why.
func TestRun_NotReadyWhileThePlatformIsUnreachable(t *testing.T) {
	t.Parallel() // it mostly waits: see "Parallel tests" in harness_test.go
	closed := testutil.Listen(t)
	deadURL := "http://" + closed.Addr().String()
	closed.Close()
	ns := testutil.NATS(t)
	adminLn := testutil.Listen(t)
	cfg := testConfig{
		simURL:      deadURL,
		natsURL:     ns.URL(),
		dbPath:      filepath.Join(t.TempDir(), "syncd.db"),
		adminListen: adminLn.Addr().String(),
	}.write(
		t,
	)
	d := startDaemon(t, cfg, adminLn)
	var out string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("status:\n%s\nlog:\n%s", out, d.stderr.String())
		}
	})
	testutil.WaitFor(t, 45*time.Second, "syncd status to say the platform is unreachable", func() bool {
		var code int
		code, out, _ = runMain(context.Background(), "status", "--config", cfg)
		return code == exitOK && strings.Contains(out, "retrying") && strings.Contains(out, "connection refused")
	})
	code, body := httpGet(t, "http://"+adminLn.Addr().String()+"/readyz")
	if code != 503 || !strings.Contains(body, "baseline") {
		t.Errorf("/readyz = %d %q with the platform unreachable, want 503 naming the baseline", code, body)
	}
	d.stop(t)
}
