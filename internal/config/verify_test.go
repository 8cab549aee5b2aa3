package config_test

import (
	"errors"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
)

func TestVerify_Defaults(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "config.example.toml"), nil)
	if err != nil {
		t.Fatalf("load example: %v", err)
	}
	if got, want := cfg.Verify, config.Default().Verify; !reflect.DeepEqual(got, want) {
		t.Fatalf("example [verify] = %+v, want the defaults %+v", got, want)
	}
	if v := cfg.Verify; v.CheckpointEvery.Duration != time.Minute || v.AuditEvery.Duration != 5*time.Minute ||
		v.SweepEvery.Duration != 24*time.Hour {
		t.Errorf("[verify] = %+v, want checkpoint_every 1m, audit_every 5m and sweep_every 24h", v)
	}
	if got := cfg.NATS.SyncInterval; got != "1s" {
		t.Errorf("nats.sync_interval = %q, want 1s", got)
	}
}

func TestVerify_Validate(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		environ    []string
		wantKey    string // "" means valid
		wantMsg    string
	}{
		{
			"Set",
			"[verify]\ncheckpoint_every = \"30s\"\naudit_every = \"10m\"\n[nats]\nsync_interval = \"always\"\n",
			nil,
			"",
			"",
		},
		{"SyncDuration", "[nats]\nsync_interval = \"2m\"\n", nil, "", ""},
		{"AuditNotADuration", "[verify]\naudit_every = \"5\"\n", nil, "verify.audit_every", "not a duration"},
		{"AuditZero", "[verify]\naudit_every = \"0s\"\n", nil, "verify.audit_every", "at least 1s"},
		{"SweepTooShort", "[verify]\nsweep_every = \"30s\"\n", nil, "verify.sweep_every", "at least 1m"},
		{"CheckpointTooShort", "[verify]\ncheckpoint_every = \"500ms\"\n", nil, "verify.checkpoint_every", "at least 1s"},
		{"SyncWord", "[nats]\nsync_interval = \"sometimes\"\n", nil, "nats.sync_interval", `"always" or a positive duration`},
		{"SyncNegative", "[nats]\nsync_interval = \"-1s\"\n", nil, "nats.sync_interval", `"always" or a positive duration`},
		{"EnvOverride", "", []string{"SYNCD_VERIFY_AUDIT_EVERY=0s"}, "verify.audit_every", "SYNCD_VERIFY_AUDIT_EVERY"},
		{"EnvCheckpoint", "", []string{"SYNCD_VERIFY_CHECKPOINT_EVERY=soon"}, "verify.checkpoint_every", "not a duration"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := config.Load(writeConfig(t, tc.file), tc.environ)
			if tc.wantKey == "" {
				if err != nil {
					t.Fatalf("Load = %v, want no error", err)
				}
				return
			}
			var e *config.Error
			if !errors.As(err, &e) {
				t.Fatalf("Load = %v, want a *config.Error", err)
			}
			if e.Key != tc.wantKey || !strings.Contains(err.Error(), tc.wantMsg) {
				t.Errorf("Load = %v, want key %s and %q", err, tc.wantKey, tc.wantMsg)
			}
		})
	}
	t.Run("EnvSetsBoth", func(t *testing.T) {
		cfg, err := config.Load(
			writeConfig(t, ""),
			[]string{"SYNCD_VERIFY_AUDIT_EVERY=90s", "SYNCD_VERIFY_CHECKPOINT_EVERY=2m"},
		)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := cfg.Verify.AuditEvery.Duration, 90*time.Second; got != want {
			t.Errorf("audit_every=%s, want %s", got, want)
		}
		if got, want := cfg.Verify.CheckpointEvery.Duration, 2*time.Minute; got != want {
			t.Errorf("checkpoint_every=%s, want %s", got, want)
		}
	})
}
