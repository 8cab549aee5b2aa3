package daemon_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestPermissions_LeastPrivilege runs a signing leader (a cluster replica:
// crawl, relay, KV buckets, lease, checkpoints, snapshots, audit) and
// "syncd follow" on a NATS server whose users are exactly those of
// deploy/nats-permissions.conf: the follower restores the leader's
// snapshot and follows the stream to the upstream state, and neither logs
// a permissions violation. The follower's user cannot publish an event,
// and a client with only read access to the events can neither publish one
// nor delete the stream.
func TestPermissions_LeastPrivilege(t *testing.T) {
	ctx := context.Background()
	t.Setenv("NATS_SYNCD_REPLICA_PASSWORD", "replica-secret-3f9a")
	t.Setenv("NATS_SYNCD_FOLLOWER_PASSWORD", "follower-secret-81c2")
	conf, err := server.ProcessConfigFile(filepath.Join("..", "..", "deploy", "nats-permissions.conf"))
	if err != nil {
		t.Fatal(err)
	}
	reader := &server.User{Username: "reader", Password: "reader-secret",
		Permissions: &server.Permissions{Publish: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"syncd.>", "_INBOX.>"}}}}
	ns := testutil.NATS(t, func(o *server.Options) { o.Users = append(conf.Users, reader) })

	sim, simURL := testutil.Sim(t, platformsim.Options{Seed: 29, Tokens: []string{auditToken}},
		platformsim.Scale{Repos: 2, TagsPerRepo: 3, HistoryPerTag: 2, Advisories: 2, PublicImages: -1})
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	keyFile := filepath.Join(t.TempDir(), "signing.nk")
	if err := os.WriteFile(keyFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	cfg := auditConfig(t, simURL, ns.URL())
	cfg.NATS.User, cfg.NATS.Password = "syncd-replica", "replica-secret-3f9a"
	cfg.Cluster.Enabled, cfg.Cluster.NodeID, cfg.Cluster.LeaseTTL = true, "leader-1", config.Duration{
		Duration: 2 * time.Second,
	}
	cfg.Cluster.SigningKeyFile = keyFile
	cfg.KV.Enabled, cfg.Snapshot.Enabled, cfg.Snapshot.Every = true, true, config.Duration{Duration: time.Second}
	cfg.Verify.CheckpointEvery, cfg.Verify.AuditEvery = config.Duration{
		Duration: time.Second,
	}, config.Duration{
		Duration: time.Second,
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs := &testutil.Buffer{}
	log := slog.New(slog.NewTextHandler(logs, nil))
	app, err := daemon.Open(ctx, cfg, log, daemon.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { app.Close() })
	role, err := app.Leadership(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	runCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- role.Run(runCtx) }()
	t.Cleanup(func() { stop(); <-done })
	testutil.WaitFor(t, 30*time.Second, "the leader to publish its baseline and write a snapshot", func() bool {
		n, _, _ := app.Store.UnpublishedCount(ctx)
		return n == 0 && app.Snapshots.Last().Name != "" && sameAsTruth(app.Store.Reader(), sim.Truth()) == nil
	})

	fcfg := cfg
	fcfg.NATS.User, fcfg.NATS.Password = "syncd-follower", "follower-secret-81c2"
	fcfg.Cluster.Enabled, fcfg.Cluster.SigningKeyFile, fcfg.Cluster.Consumer = false, "", "follower-1"
	fcfg.Cluster.VerifyKeys = []string{app.Trust.Signer.PublicKey()}
	fcfg.Store.Path = filepath.Join(t.TempDir(), "follower.db")
	f, err := daemon.OpenFollower(ctx, fcfg, cluster.RestoreWhenEmpty, "test", log.With("role", "follower"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	fctx, stopFollower := context.WithCancel(ctx)
	followed := make(chan error, 1)
	go func() { followed <- f.Run(fctx) }()
	t.Cleanup(func() { stopFollower(); <-followed })
	testutil.Eventually(t, 30*time.Second, func() error { return sameAsTruth(f.Store.Reader(), sim.Truth()) })
	// The mirror equals the truth once the restore committed, a moment
	// before the follower records it: checked once here, it failed about
	// one run in fifteen under make test's load.
	restored := func() bool { return f.Follower.Restored().Name != "" }
	for deadline := time.Now().Add(5 * time.Second); !restored() && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
	}
	if !restored() {
		t.Errorf(
			"the follower did not restore the leader's snapshot; its log of snapshots:\n%s",
			grepLines(logs.String(), "snapshot"),
		)
	}
	// A follower with no mirror yet made the signed snapshot its mirror's
	// file, and checked it once it ran.
	if f.Snapshot == nil || f.Snapshot.Name != f.Follower.Restored().Name {
		t.Errorf("the follower restored %q, not by making it its mirror's file (adopted %+v)",
			f.Follower.Restored().Name, f.Snapshot)
	}
	testutil.WaitFor(t, 10*time.Second, "the adopted snapshot's check", func() bool {
		return strings.Contains(logs.String(), "the adopted snapshot passed its checks")
	})
	// So does a new replica, which then stands by.
	rcfg := cfg
	rcfg.Cluster.NodeID, rcfg.Store.Path = "replica-2", filepath.Join(t.TempDir(), "replica-2.db")
	replica, err := daemon.Open(ctx, rcfg, log.With("role", "replica-2"), daemon.Options{AdoptSnapshot: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { replica.Close() })
	if replica.Snapshot == nil {
		t.Errorf("the new replica's mirror was not made from the snapshot's file")
	}
	rrole, err := replica.Leadership(ctx, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	rctx, stopReplica := context.WithCancel(ctx)
	replicaDone := make(chan error, 1)
	go func() { replicaDone <- rrole.Run(rctx) }()
	t.Cleanup(func() { stopReplica(); <-replicaDone })
	testutil.Eventually(t, 30*time.Second, func() error { return sameAsTruth(replica.Store.Reader(), sim.Truth()) })
	testutil.WaitFor(t, 10*time.Second, "the new replica's check of its adopted snapshot", func() bool {
		return strings.Count(logs.String(), "the adopted snapshot passed its checks") == 2
	})
	if rrole.Current() != cluster.RoleStandby {
		t.Errorf("the new replica is %s, want %s", rrole.Current(), cluster.RoleStandby)
	}
	// A signed checkpoint of the leader's, verified and matched.
	testutil.WaitFor(t, 10*time.Second, "the follower to match a checkpoint", func() bool {
		r, ok := f.Follower.LastCheckpoint()
		return ok && r.Diff == ""
	})
	if strings.Contains(strings.ToLower(logs.String()), "permissions violation") {
		t.Errorf(
			"a permissions violation under the documented permissions:\n%s",
			grepLines(strings.ToLower(logs.String()), "permissions violation"),
		)
	}

	forged := &nats.Msg{Subject: "syncd.tag.created.evil", Data: []byte("{}")}
	for user, pass := range map[string]string{"syncd-follower": "follower-secret-81c2", "reader": "reader-secret"} {
		violations := make(chan error, 4)
		js := testutil.JetStream(t, ns.URL(), nats.UserInfo(user, pass),
			nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
				select {
				case violations <- err:
				default:
				}
			}))
		if err := refused(ctx, violations, func(ctx context.Context) error {
			_, err := js.PublishMsg(ctx, forged)
			return err
		}); err != nil {
			t.Errorf("%s publishing an event: %v", user, err)
		}
		if user == "reader" {
			if err := refused(ctx, violations, func(ctx context.Context) error {
				return js.DeleteStream(ctx, cfg.NATS.Stream)
			}); err != nil {
				t.Errorf("reader deleting the stream: %v", err)
			}
		}
	}
	if _, err := app.NATS.JS.Stream(ctx, cfg.NATS.Stream); err != nil {
		t.Errorf("the stream after the refused clients: %v", err)
	}
}

// refused runs request, which the server must refuse: it returns nil once
// the server reported a permissions violation on the connection (the
// request, which then gets no answer, is given up at once rather than
// waited out) or the request failed, and an error when it succeeded.
func refused(ctx context.Context, violations <-chan error, request func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- request(ctx) }()
	select {
	case v := <-violations:
		cancel()
		if !strings.Contains(v.Error(), "Permissions Violation") {
			return fmt.Errorf("the server reported %v, not a permissions violation", v)
		}
		if err := <-done; err == nil {
			return errors.New("the request succeeded after the server reported a permissions violation")
		}
		return nil
	case err := <-done:
		if err == nil {
			return errors.New("the request succeeded")
		}
		return nil
	}
}
