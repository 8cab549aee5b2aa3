package config_test

import (
	"slices"
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
		if p.BaseURL != "http://127.0.0.1:9" || p.RegistryURL != p.BaseURL || p.Token != config.DemoToken || p.RegistryToken != config.DemoRegistryToken {
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
			t.Errorf("schedule %q, nats listen %q: want the user's schedule and no embedded server", cfg.Crawl.Schedule, cfg.NATS.Listen)
		}
		if got := cfg.DemoAddrs(); slices.Contains(got, config.DemoNATSListen) {
			t.Errorf("DemoAddrs=%v: an external NATS server needs no port here", got)
		}
	})
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
