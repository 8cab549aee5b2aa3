package config_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
)

func TestConfig_Demo(t *testing.T) {
	t.Run("DefaultsTakeTheDemos", func(t *testing.T) {
		cfg := config.Default()
		cfg.Platform.Token = "a real token"
		cfg.Demo("http://127.0.0.1:9")
		p := cfg.Platform
		if p.BaseURL != "http://127.0.0.1:9" || p.RegistryURL != p.BaseURL || p.Token != config.DemoToken ||
			p.RegistryToken != config.DemoRegistryToken {
			t.Errorf("platform=%+v, want the simulator and its tokens", p)
		}
		if cfg.Crawl.Schedule != "@every 5s" || cfg.Crawl.Jitter.Duration != time.Second || cfg.Crawl.RequestsPerSecond != 0 {
			t.Errorf("crawl=%+v, want the demo's quick schedules", cfg.Crawl)
		}
		if cfg.NATS.Listen != config.DemoNATSListen || cfg.Events.Listen == "" || cfg.Events.Issuer != p.BaseURL {
			t.Errorf("nats listen %q, events %+v: want the demo's", cfg.NATS.Listen, cfg.Events)
		}
	})
	t.Run("UserSettingsKept", func(t *testing.T) {
		cfg := config.Default()
		cfg.Crawl.Schedule, cfg.NATS.URL = "@every 1m", "nats://127.0.0.1:4333"
		cfg.Demo("http://127.0.0.1:9")
		if cfg.Crawl.Schedule != "@every 1m" || cfg.NATS.Listen != "" {
			t.Errorf(
				"schedule %q, nats listen %q: want the user's schedule and no embedded server",
				cfg.Crawl.Schedule,
				cfg.NATS.Listen,
			)
		}
		if got := cfg.DemoAddrs(); slices.Contains(got, config.DemoNATSListen) {
			t.Errorf("DemoAddrs=%v: an external NATS server needs no port here", got)
		}
	})
}

// TestConfig_DemoNames: the demo's stream, subjects and buckets are its
// own whatever the configuration says, and a configured NATS server or
// cluster mode is refused, naming the key.
func TestConfig_DemoNames(t *testing.T) {
	cfg := config.Default()
	cfg.NATS.Stream, cfg.KV.Tags, cfg.Snapshot.Bucket = "PROD", "prod_tags", "prod_snapshots"
	cfg.Demo("http://127.0.0.1:9")
	if cfg.NATS.Stream != config.DemoStream || cfg.NATS.SubjectPrefix != config.DemoSubjectPrefix {
		t.Errorf("stream %q, subjects %q: want the demo's", cfg.NATS.Stream, cfg.NATS.SubjectPrefix)
	}
	for _, b := range []string{cfg.KV.Tags, cfg.KV.Repos, cfg.KV.Advisories, cfg.Snapshot.Bucket} {
		if !strings.HasPrefix(b, config.DemoBucketPrefix) {
			t.Errorf("bucket %q: want the demo's", b)
		}
	}
	path := writeConfig(t, "[cluster]\nenabled = true\n")
	_, err := config.LoadForDemo(path, []string{"SYNCD_NATS_URL=nats://127.0.0.1:4222"})
	for _, want := range []string{
		"SYNCD_NATS_URL: nats.url: syncd run --demo",
		"syncd.toml:2: cluster.enabled: syncd run --demo",
	} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("LoadForDemo = %v, want it to say %q", err, want)
		}
	}
}

func TestConfig_EventTypePrefix(t *testing.T) {
	cfg := config.Default()
	if got, want := cfg.EventTypePrefix(), "dev.chainguard."; got != want {
		t.Errorf("default prefix=%q, want %q", got, want)
	}
	cfg.Platform.Vendor = "example"
	if got, want := cfg.EventTypePrefix(), "dev.example."; got != want {
		t.Errorf("prefix of vendor example=%q, want %q", got, want)
	}
	cfg.Events.TypePrefix = "com.acme."
	if got, want := cfg.EventTypePrefix(), "com.acme."; got != want {
		t.Errorf("type_prefix set: prefix=%q, want %q", got, want)
	}
}
