package daemon_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/signing"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestFollower_CountsRejectedMessages: "syncd follow" with a signing key
// file configured (and so its public key as the one verify key) rejects an
// unsigned message and one signed with another key that a plain NATS
// client put on the stream, and its /metrics counts each by reason.
func TestFollower_CountsRejectedMessages(t *testing.T) {
	ctx := context.Background()
	ns := testutil.NATS(t)
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	dir := t.TempDir()
	keyFile := filepath.Join(dir, "signing.nk")
	if err := os.WriteFile(keyFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := config.Default()
	cfg.NATS.URL, cfg.Store.Path, cfg.Admin.Listen = ns.URL(), filepath.Join(dir, "follower.db"), ""
	cfg.Cluster.SigningKeyFile = keyFile
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	log := slog.New(slog.DiscardHandler)
	js := testutil.JetStream(t, ns.URL())
	if err := publish.EnsureStream(ctx, js, daemon.NATSConfig(cfg, log)); err != nil {
		t.Fatal(err)
	}
	f, err := daemon.OpenFollower(ctx, cfg, cluster.RestoreNever, "test", log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	srv := httptest.NewServer(f.AdminHandler())
	t.Cleanup(srv.Close)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- f.Run(rctx) }()
	t.Cleanup(func() { stop(); <-done })

	other, _ := nkeys.CreateUser()
	otherSeed, _ := other.Seed()
	forger, err := signing.ParseSigner(otherSeed)
	if err != nil {
		t.Fatal(err)
	}
	msg := func(id string) *nats.Msg {
		return &nats.Msg{Subject: cfg.NATS.SubjectPrefix + ".tag.created.g%2Fevil", Data: []byte(`{"specversion":"1.0"}`),
			Header: nats.Header{jetstream.MsgIDHeader: []string{id}}}
	}
	for _, m := range []*nats.Msg{msg("forged-1"), forger.Seal(msg("forged-2"))} {
		if _, err := js.PublishMsg(ctx, m); err != nil {
			t.Fatal(err)
		}
	}
	want := []string{
		`syncd_rejected_messages_total{reason="unsigned"} 1`,
		`syncd_rejected_messages_total{reason="bad_signature"} 1`,
	}
	testutil.WaitFor(t, 10*time.Second, "the follower's metrics to count both rejections", func() bool {
		resp, err := http.Get(srv.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return strings.Contains(string(b), want[0]) && strings.Contains(string(b), want[1])
	})
}
