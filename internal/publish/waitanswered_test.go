package publish_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

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

	waitsThenConnects(t, n1.URL(), n2)
}

// waitsThenConnects connects to url while the cluster has no meta leader,
// and expects Connect to wait until down is started again, and then to
// succeed, with the stream there.
func waitsThenConnects(t *testing.T, url string, down *testutil.NATSServer) {
	t.Helper()
	var logs logBuffer
	c, err := connectAcrossOutage(t, configFor(url, logs.logger()), &logs, down)
	if err != nil {
		t.Fatalf("Connect: %v\n%s", err, logs.String())
	}
	defer c.Close()
	if _, err := c.JS.Stream(context.Background(), testStream); err != nil {
		t.Fatalf("the stream after Connect: %v", err)
	}
	if !strings.Contains(logs.String(), "JetStream answered after waiting") {
		t.Errorf("no line saying JetStream answered after the wait:\n%s", logs.String())
	}
}

// connectAcrossOutage runs Connect with cfg (logging to logs) while the
// cluster has no meta leader, fails the test unless Connect says it waits
// (instead of returning), starts down, and returns what Connect returns
// then.
func connectAcrossOutage(
	t *testing.T,
	cfg publish.Config,
	logs *logBuffer,
	down *testutil.NATSServer,
) (*publish.Conn, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
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
	down.Start()
	select {
	case r := <-done:
		return r.c, r.err
	case <-time.After(90 * time.Second):
		t.Fatalf("Connect still waiting 90s after a second node came back:\n%s", logs.String())
		return nil, nil
	}
}

// TestConnect_ARefusalOfAnotherSubjectDoesNotEndTheWait: a user that may
// use JetStream's API but not ask the server for its account (a
// follower's or manage_stream = false's least privilege) waits for the
// stream's lookup like anyone, until JetStream answers it (here: there is
// no such stream). Before, the lookup's error asked for the account, and
// the refusal of that request ended the wait as if the lookup had been
// refused.
func TestConnect_ARefusalOfAnotherSubjectDoesNotEndTheWait(t *testing.T) {
	user := nats.UserInfo("syncd", "secret")
	cl := testutil.NATSClusterWith(t, 3, func(o *server.Options) {
		o.Users = []*server.User{{Username: "syncd", Password: "secret", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Allow: []string{"$JS.API.>", "_INBOX.>"}}}}}
	}, user)
	n1, n2, n3 := cl.Nodes[0], cl.Nodes[1], cl.Nodes[2]
	n2.Stop()
	n3.Stop()
	js := testutil.JetStream(t, n1.URL(), user)
	testutil.Eventually(t, 30*time.Second, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		if _, err := js.Stream(ctx, testStream); !publish.Unanswered(context.Background(), err) {
			return fmt.Errorf("a stream lookup on n1 alone: %v, not yet unanswered", err)
		}
		return nil
	})
	var logs logBuffer
	cfg := configFor(n1.URL(), logs.logger())
	cfg.User, cfg.Password, cfg.CheckStreamOnly = "syncd", "secret", true
	c, err := connectAcrossOutage(t, cfg, &logs, n2)
	if c != nil {
		c.Close()
	}
	if !errors.Is(err, publish.ErrStreamNotFound) {
		t.Fatalf("Connect: %v; want the answer, that the stream does not exist\n%s", err, logs.String())
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

// TestUnanswered: what a start's request may be tried again after: its
// own timeout, JetStream unavailable for the moment, the client refusing
// it while it reconnects; not a refusal, nor anything once the caller's
// context has ended.
func TestUnanswered(t *testing.T) {
	alive := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	for _, tc := range []struct {
		name string
		ctx  context.Context
		err  error
		want bool
	}{
		{"TimedOut", alive, fmt.Errorf("create or update stream S: %w", context.DeadlineExceeded), true},
		{"ClientTimeout", alive, nats.ErrTimeout, true},
		{"Reconnecting", alive, fmt.Errorf("look up stream: %w", nats.ErrReconnectBufExceeded), true},
		{"ConnectionReconnecting", alive, nats.ErrConnectionReconnecting, true},
		{"TemporarilyUnavailable", alive,
			&jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}, true},
		{"IncompleteResults", alive, &jetstream.APIError{Code: 503, ErrorCode: 10004, Description: "incomplete results"},
			true},
		{"NoPeersYet", alive,
			&jetstream.APIError{Code: 400, ErrorCode: 10005, Description: "no suitable peers for placement"}, true},
		{"NotEnabled", alive, jetstream.ErrJetStreamNotEnabled, false},
		{"StreamNotFound", alive, jetstream.ErrStreamNotFound, false},
		{"SubjectsOverlap", alive, &jetstream.APIError{Code: 400, ErrorCode: 10065, Description: "subjects overlap"},
			false},
		{"PermissionViolation", alive, nats.ErrPermissionViolation, false},
		{"CallerGaveUp", ended, context.DeadlineExceeded, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := publish.Unanswered(tc.ctx, tc.err); got != tc.want {
				t.Errorf("Unanswered(%v) = %v, want %v", tc.err, got, tc.want)
			}
		})
	}
}
