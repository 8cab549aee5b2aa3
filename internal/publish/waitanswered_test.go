package publish_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestConnect_WaitsForJetStreamToAnswer starts syncd's connection to one
// node of a three-node JetStream cluster whose two other nodes are down:
// the node accepts the connection, but no meta leader answers the stream's
// creation. Connect waits, with a warning per try, and creates the stream
// once a second node is back; before, it returned the request's timeout,
// and syncd run exited at start whenever the cluster was electing a
// leader. With ConnectWait set (sync --once), it gives up.
func TestConnect_WaitsForJetStreamToAnswer(t *testing.T) {
	cl := testutil.NATSClusterOf(t, 3)
	n1, n2, n3 := cl.Nodes[0], cl.Nodes[1], cl.Nodes[2]
	n2.Stop()
	n3.Stop()

	t.Run("GivesUpAfterConnectWait", func(t *testing.T) {
		var logs logBuffer
		cfg := configFor(n1.URL(), logs.logger())
		cfg.ConnectWait = time.Second
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		c, err := publish.Connect(ctx, cfg)
		if err == nil {
			c.Close()
			t.Fatal("Connect succeeded without a meta leader")
		}
		if !strings.Contains(err.Error(), "giving up after") || !strings.Contains(err.Error(), "stream "+testStream) {
			t.Fatalf("Connect: %v; want it to give up on the stream after ConnectWait", err)
		}
	})

	var logs logBuffer
	cfg := configFor(n1.URL(), logs.logger())
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	type result struct {
		c   *publish.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		c, err := publish.Connect(ctx, cfg)
		done <- result{c, err}
	}()
	waiting := func() bool { return strings.Contains(logs.String(), "JetStream did not answer; trying again") }
	deadline := time.After(60 * time.Second)
	for !waiting() {
		select {
		case r := <-done:
			if r.c != nil {
				r.c.Close()
			}
			t.Fatalf("Connect returned (%v) without a meta leader, instead of waiting for one\n%s", r.err, logs.String())
		case <-deadline:
			t.Fatalf("no warning of the wait within 60s:\n%s", logs.String())
		case <-time.After(50 * time.Millisecond):
		}
	}
	n2.Start()
	var r result
	select {
	case r = <-done:
	case <-time.After(90 * time.Second):
		t.Fatalf("Connect still waiting 90s after a second node came back:\n%s", logs.String())
	}
	if r.err != nil {
		t.Fatalf("Connect: %v\n%s", r.err, logs.String())
	}
	defer r.c.Close()
	if _, err := r.c.JS.Stream(ctx, testStream); err != nil {
		t.Fatalf("the stream after Connect: %v", err)
	}
	if !strings.Contains(logs.String(), "JetStream answered after waiting") {
		t.Errorf("no line saying JetStream answered after the wait:\n%s", logs.String())
	}
}

// TestConnect_APermissionViolationEndsTheWait: a user that may not publish
// to JetStream's API gets no answer to the stream's creation either (the
// server drops the request and reports the violation apart), but that is
// a refusal, not a cluster electing its leaders: Connect returns the
// violation, rather than waiting for ever.
func TestConnect_APermissionViolationEndsTheWait(t *testing.T) {
	s := testutil.NATS(t, func(o *server.Options) {
		o.Users = []*server.User{{Username: "syncd", Password: "secret",
			Permissions: &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{"_INBOX.>"}}}}}
	})
	var logs logBuffer
	cfg := configFor(s.URL(), logs.logger())
	cfg.User, cfg.Password = "syncd", "secret"
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := publish.Connect(ctx, cfg)
	if err == nil {
		c.Close()
		t.Fatal("Connect succeeded without the permission to create the stream")
	}
	if ctx.Err() != nil {
		t.Fatalf("Connect returned only when its context ended: %v", err)
	}
	want := `Permissions Violation for Publish to "$JS.API.STREAM.UPDATE.` + testStream + `"`
	if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "NATS refused the request") {
		t.Fatalf("Connect: %v; want the refusal (%s)", err, want)
	}
	if strings.Contains(logs.String(), "trying again") {
		t.Errorf("Connect tried a refused request again:\n%s", logs.String())
	}
}
