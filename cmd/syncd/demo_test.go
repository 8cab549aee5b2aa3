package main

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// production is what a real deployment keeps on a NATS server: stream
// SYNCD with one event, and a key in bucket syncd_tags.
const (
	prodSubject = "syncd.tag.created.prod-app"
	prodKey     = "prod-app.v1"
)

// plantProduction writes production's stream and key through js.
func plantProduction(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SYNCD", Subjects: []string{"syncd.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, prodSubject, []byte(`{"id":"prod"}`)); err != nil {
		t.Fatal(err)
	}
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "syncd_tags"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, prodKey, []byte(`{"digest":"sha256:prod"}`)); err != nil {
		t.Fatal(err)
	}
}

// checkProduction fails t unless production's stream holds exactly its
// one event and its key is still there.
func checkProduction(t *testing.T, js jetstream.JetStream) {
	t.Helper()
	ctx := context.Background()
	s, err := js.Stream(ctx, "SYNCD")
	if err != nil {
		t.Fatalf("stream SYNCD: %v", err)
	}
	if st := s.CachedInfo().State; st.Msgs != 1 {
		t.Errorf("stream SYNCD holds %d messages, want production's 1 alone", st.Msgs)
	}
	kv, err := js.KeyValue(ctx, "syncd_tags")
	if err != nil {
		t.Fatalf("bucket syncd_tags: %v", err)
	}
	if _, err := kv.Get(ctx, prodKey); err != nil {
		t.Errorf("key %s of syncd_tags: %v, want it left as it was", prodKey, err)
	}
}

// demoConfig is a demo's config file: a mirror in a temporary directory,
// the embedded server on a loopback port the system picks, no admin
// listener (its fixed port may be taken), and JSON logs.
func demoConfig(t *testing.T, dir string) string {
	return writeFile(t, "demo.toml", `[nats]
listen = "127.0.0.1:0"

[store]
path = "`+filepath.Join(dir, "syncd.db")+`"

[admin]
listen = ""

[log]
format = "json"
`)
}

// TestRunDemo_LeavesProductionAlone: "syncd run --demo" never writes to a
// real NATS deployment. With [nats] url set (SYNCD_NATS_URL here, as in
// the report: the demo published 17 events into SYNCD and its
// reconciliation deleted a key) it exits 2 naming the key and touches
// nothing; and on its own embedded server, whose store already holds a
// production stream and bucket, it publishes into its own stream and
// buckets only.
func TestRunDemo_LeavesProductionAlone(t *testing.T) {
	t.Run("ConfiguredURLRefused", func(t *testing.T) {
		ns := testutil.NATS(t)
		js := testutil.JetStream(t, ns.URL())
		plantProduction(t, js)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var out, errb syncBuffer
		code := NewMain(
			&out,
			&errb,
			[]string{"SYNCD_NATS_URL=" + ns.URL()},
		).Run(ctx, []string{"run", "--demo", "--config", demoConfig(t, t.TempDir())})
		if code != exitUsage || !strings.Contains(errb.String(), "SYNCD_NATS_URL: nats.url:") {
			t.Errorf(
				"run --demo with SYNCD_NATS_URL exited %d, want 2 naming SYNCD_NATS_URL and nats.url; stderr:\n%s",
				code,
				errb.String(),
			)
		}
		checkProduction(t, js)
	})
	t.Run("ClusterRefused", func(t *testing.T) {
		cfg := writeFile(t, "demo.toml", "[cluster]\nenabled = true\n\n[admin]\nlisten = \"\"\n")
		code, _, stderr := runMain(context.Background(), "run", "--demo", "--config", cfg)
		if code != exitUsage || !strings.Contains(stderr, "cluster.enabled:") || !strings.Contains(stderr, "--demo") {
			t.Errorf("run --demo in cluster mode exited %d, want 2 naming cluster.enabled; stderr:\n%s", code, stderr)
		}
	})
	t.Run("SharedStoreUntouched", func(t *testing.T) {
		dir := t.TempDir()
		ns, err := publish.StartEmbedded(publish.Config{DataDir: dir}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		plantProduction(t, testutil.JetStream(t, "", nats.InProcessServer(ns)))
		ns.Shutdown()
		ns.WaitForShutdown()

		d := startCommand(t, nil, "run", "--demo", "--config", demoConfig(t, dir))
		testutil.WaitFor(t, 60*time.Second, "the demo to publish events", func() bool {
			if code, done := d.exited(); done {
				t.Fatalf("the demo exited %d; log:\n%s", code, d.stderr.String())
			}
			return strings.Count(d.stderr.String(), `"msg":"published event"`) >= 3
		})
		d.stop(t)

		ns, err = publish.StartEmbedded(publish.Config{DataDir: dir}, slog.New(slog.DiscardHandler))
		if err != nil {
			t.Fatal(err)
		}
		defer func() { ns.Shutdown(); ns.WaitForShutdown() }()
		js := testutil.JetStream(t, "", nats.InProcessServer(ns))
		checkProduction(t, js)
		demo, err := js.Stream(context.Background(), "SYNCD_DEMO")
		if err != nil {
			t.Fatalf("the demo's own stream SYNCD_DEMO: %v", err)
		}
		if demo.CachedInfo().State.Msgs == 0 {
			t.Errorf("the demo's own stream SYNCD_DEMO is empty, want its events there")
		}
	})
}
