package config_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/config"
)

func TestCluster_Defaults(t *testing.T) {
	cfg, err := config.Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	cl := cfg.Cluster
	if cl.Enabled || cl.Bucket != "syncd_leader" || cl.Key != "leader" || cl.LeaseTTL.Duration != 10*time.Second {
		t.Fatalf("cluster defaults = %+v", cl)
	}
	node := cl.Node()
	if node == "" || node != cl.Node() {
		t.Fatalf("Node()=%q, want a stable non-empty name", node)
	}
	// Without a node_id: the same name for the same mirror, every time and
	// in every process (no pid in it), another for another mirror.
	a, b := cl.ConsumerName("data/syncd.db"), cl.ConsumerName("other/syncd.db")
	if a != cl.ConsumerName("data/syncd.db") || a == b || !strings.HasPrefix(a, "syncd-follow-") ||
		strings.Contains(a, fmt.Sprint(os.Getpid())) {
		t.Errorf("ConsumerName: %q and %q; want a stable name per mirror, without the pid", a, b)
	}
	cl.NodeID = "host.a-12"
	if got := cl.ConsumerName("x"); got != "syncd-follow-host_a-12" {
		t.Errorf("ConsumerName=%q, want syncd-follow-host_a-12", got)
	}
	cl.Consumer = "mine"
	if got := cl.ConsumerName("x"); got != "mine" {
		t.Errorf("ConsumerName=%q, want the configured mine", got)
	}
}

func TestCluster_Validate(t *testing.T) {
	const base = "[nats]\nurl = \"nats://127.0.0.1:4222\"\n[store]\ninitial_events = \"snapshot\"\n"
	for _, tc := range []struct {
		name, file, key, msg string
	}{
		{
			"NeedsNATSURL",
			"[cluster]\nenabled = true\n[store]\ninitial_events = \"snapshot\"\n",
			"nats.url",
			"cluster.enabled",
		},
		{
			"NeedsSnapshot",
			"[nats]\nurl = \"nats://127.0.0.1:4222\"\n[cluster]\nenabled = true\n",
			"store.initial_events",
			"snapshot",
		},
		{"ShortTTL", base + "[cluster]\nenabled = true\nlease_ttl = \"500ms\"\n", "cluster.lease_ttl", "at least 1s"},
		{"BadBucket", base + "[cluster]\nbucket = \"a.b\"\n", "cluster.bucket", "KV bucket"},
		{"BadKey", base + "[cluster]\nkey = \"a b\"\n", "cluster.key", "KV key"},
		{"BadNode", base + "[cluster]\nnode_id = \"n*1\"\n", "cluster.node_id", "letters"},
		{"BadConsumer", base + "[cluster]\nconsumer = \"c.1\"\n", "cluster.consumer", "consumer name"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(writeConfig(t, tc.file), nil)
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("err=%v, want a *config.Error", err)
			}
			if ce.Key != tc.key || !strings.Contains(ce.Msg, tc.msg) {
				t.Fatalf("err=%v, want key %s and a message containing %q", err, tc.key, tc.msg)
			}
		})
	}
	t.Run("Valid", func(t *testing.T) {
		cfg, err := config.Load(
			writeConfig(t, base+"[cluster]\nenabled = true\nnode_id = \"a-1\"\nlease_ttl = \"2s\"\n"),
			nil,
		)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := cfg.Cluster.Node(), "a-1"; got != want {
			t.Errorf("Node()=%q, want %q", got, want)
		}
	})
}

func TestSnapshot_Validate(t *testing.T) {
	cfg := config.Default()
	cfg.Snapshot.Every.Duration, cfg.Snapshot.Keep, cfg.Snapshot.Bucket = 0, 0, "a.b"
	err := cfg.Validate()
	for _, key := range []string{"snapshot.every", "snapshot.keep", "snapshot.bucket"} {
		if err == nil || !strings.Contains(err.Error(), key) {
			t.Errorf("Validate = %v, want an error naming %s", err, key)
		}
	}
	cfg.Snapshot.Enabled = false
	cfg.Snapshot.Bucket = "ok"
	if err := cfg.Validate(); err != nil {
		t.Errorf("disabled snapshots: Validate = %v, want nil", err)
	}
}

// TestCluster_SigningKeys: a readable 0600 nkey seed and well-formed
// verify keys listing its public key load; each mistake fails naming its
// key and its problem.
func TestCluster_SigningKeys(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	other, _ := nkeys.CreateUser()
	otherPub, _ := other.PublicKey()
	dir := t.TempDir()
	key := filepath.Join(dir, "signing.nk")
	if err := os.WriteFile(key, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	open := filepath.Join(dir, "open.nk")
	if err := os.WriteFile(open, seed, 0o644); err != nil {
		t.Fatal(err)
	}
	bad := filepath.Join(dir, "bad.nk")
	if err := os.WriteFile(bad, []byte("SUnotaseed"), 0o600); err != nil {
		t.Fatal(err)
	}
	section := func(file string, keys ...string) string {
		return fmt.Sprintf("[cluster]\nsigning_key_file = %q\nverify_keys = [%s]\n", file, strings.Join(keys, ", "))
	}
	q := func(s string) string { return fmt.Sprintf("%q", s) }
	cfg, err := config.Load(writeConfig(t, section(key, q(pub), q(otherPub))), nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Cluster.SigningKeyFile != key || len(cfg.Cluster.VerifyKeys) != 2 {
		t.Errorf("cluster = %+v", cfg.Cluster)
	}
	for _, tc := range []struct{ name, file, key, msg string }{
		{"Missing", section(filepath.Join(dir, "none")), "cluster.signing_key_file", "no such file"},
		{"Open", section(open), "cluster.signing_key_file", "chmod 600"},
		{"Malformed", section(bad), "cluster.signing_key_file", "malformed nkey seed"},
		{"BadVerifyKey", section("", q(pub), q("UABC")), "cluster.verify_keys", "key 2: "},
		{"SeedAsVerifyKey", section("", q(string(seed))), "cluster.verify_keys", "not an nkey public key"},
		{"SigningKeyNotListed", section(key, q(otherPub)), "cluster.verify_keys", pub},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(writeConfig(t, tc.file), nil)
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("err=%v, want a *config.Error", err)
			}
			if ce.Key != tc.key || !strings.Contains(ce.Msg, tc.msg) {
				t.Fatalf("err=%v, want key %s and a message containing %q", err, tc.key, tc.msg)
			}
			if strings.Contains(err.Error(), string(seed[2:20])) {
				t.Errorf("the error shows the seed: %v", err)
			}
		})
	}
}
