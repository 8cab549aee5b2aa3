package config_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
)

func TestKV_DefaultsAndValidation(t *testing.T) {
	cfg := config.Default()
	if kv := cfg.KV; !kv.Enabled || kv.Tags != "syncd_tags" || kv.History != 1 ||
		kv.ReconcileInterval.Duration != time.Hour {
		t.Fatalf("kv defaults = %+v", kv)
	}
	cfg.NATS.Replicas = 3
	if got := cfg.BucketReplicas(); got != 3 {
		t.Errorf("BucketReplicas=%d, want nats.replicas 3", got)
	}
	cfg.KV.Replicas = 1
	if got := cfg.BucketReplicas(); got != 1 {
		t.Errorf("BucketReplicas=%d, want kv.replicas 1", got)
	}

	cfg.KV = config.KV{Enabled: true, Tags: "a.b", Repos: "syncd_leader", Advisories: "x", History: 65, Replicas: 6,
		ReconcileInterval: config.Duration{Duration: time.Second}}
	err := cfg.Validate()
	var errs config.Errors
	if !errors.As(err, &errs) {
		t.Fatalf("Validate = %v, want Errors", err)
	}
	var keys []string
	for _, e := range errs {
		keys = append(keys, e.Key)
	}
	for _, want := range []string{
		"kv.tags_bucket",
		"kv.repos_bucket",
		"kv.history",
		"kv.replicas",
		"kv.reconcile_interval",
	} {
		if !slices.Contains(keys, want) {
			t.Errorf("Validate reported %v, want %s among them", keys, want)
		}
	}
	if slices.Contains(keys, "kv.advisories_bucket") {
		t.Errorf("Validate reported kv.advisories_bucket, which is fine: %v", err)
	}
}
