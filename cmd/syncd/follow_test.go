package main

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestFollow_WaitsForTheStream: a follower started before its leader has
// created the stream keeps running, unready and saying why, and follows
// from the first event once a leader creates the stream: its mirror comes
// to equal the leader's.
func TestFollow_WaitsForTheStream(t *testing.T) {
	t.Parallel() // it mostly waits: see "Parallel tests" in harness_test.go
	ns := testutil.NATS(t)
	followerPath := filepath.Join(t.TempDir(), "follower.db")
	adminLn := testutil.Listen(t)
	adminAddr := adminLn.Addr().String()
	cfg := writeFile(t, "follow.toml", fmt.Sprintf(`[nats]
url = %q

[store]
path = %q

[admin]
listen = %q

[log]
level = "debug"
format = "json"
`, ns.URL(), followerPath, adminAddr))

	follower := startCommand(t, []net.Listener{adminLn}, "follow", "--config", cfg)

	// readyz answers the readiness status and body; 0 until the admin
	// listener is up.
	var ready string
	readyz := func() int {
		resp, err := http.Get("http://" + adminAddr + "/readyz")
		if err != nil {
			return 0
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		ready = string(b)
		return resp.StatusCode
	}
	testutil.WaitFor(t, 10*time.Second, "/readyz to say the stream is missing", func() bool {
		return readyz() == http.StatusServiceUnavailable && strings.Contains(ready, "does not exist")
	})
	if !strings.Contains(ready, `"stream"`) || !strings.Contains(ready, "SYNCD") {
		t.Errorf("/readyz body %s does not name the stream check and the stream", ready)
	}
	if code, ok := follower.exited(); ok {
		t.Fatalf("syncd follow exited %d without a stream; log:\n%s", code, follower.stderr.String())
	}
	if log := follower.stderr.String(); !strings.Contains(log, "the stream does not exist yet") {
		t.Errorf("the log does not say the stream is awaited:\n%s", log)
	}

	// A leader starts and creates the stream; its snapshot, and a move
	// after it, reach the follower.
	sim, simURL := startSim(t, 41, platformsim.Scale{Repos: 2, TagsPerRepo: 3, HistoryPerTag: 2, Advisories: 2})
	leaderPath := filepath.Join(t.TempDir(), "leader.db")
	leader := startDaemon(
		t,
		testConfig{simURL: simURL, natsURL: ns.URL(), dbPath: leaderPath, initialEvents: "snapshot"}.write(t),
	)
	waitBaseline(t, leaderPath)
	sim.Advance(time.Second)
	if err := sim.MoveTag(sim.Truth().Tags[0].UID, "sha256:"+strings.Repeat("7", 64)); err != nil {
		t.Fatal(err)
	}
	waitSameMirror(t, 30*time.Second, followerPath, leaderPath)
	testutil.WaitFor(t, 10*time.Second, "/readyz to be ready", func() bool { return readyz() == http.StatusOK })

	leader.stop(t)
	follower.stop(t)
}

// TestFollow_StreamWithoutTheEvents: a stream that exists and does not
// capture the subject prefix is a mistake to fix, not something to wait
// for: syncd follow exits at once and says what is wrong.
func TestFollow_StreamWithoutTheEvents(t *testing.T) {
	ns := testutil.NATS(t)
	js := testutil.JetStream(t, ns.URL())
	if _, err := js.CreateStream(
		context.Background(),
		jetstream.StreamConfig{Name: "SYNCD", Subjects: []string{"other.>"}},
	); err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "follow.toml", fmt.Sprintf("[nats]\nurl = %q\n\n[store]\npath = %q\n\n[admin]\nlisten = \"\"\n",
		ns.URL(), filepath.Join(t.TempDir(), "follower.db")))
	stderr := &syncBuffer{}
	code := NewMain(&syncBuffer{}, stderr, nil).Run(context.Background(), []string{"follow", "--config", cfg})
	if code == exitOK {
		t.Fatalf("syncd follow exited 0 with a stream that does not capture its subjects; log:\n%s", stderr.String())
	}
	if log := stderr.String(); !strings.Contains(log, `does not capture "syncd.>"`) {
		t.Errorf("the error does not say the stream lacks the subjects:\n%s", log)
	}
}
