package config_test

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
)

func TestMaturity_Validation(t *testing.T) {
	cfg := config.Default()
	if len(cfg.Maturity.After) != 0 || cfg.KV.Matured != "syncd_matured" {
		t.Fatalf("defaults: maturity %+v, kv.matured_bucket %q; want off and syncd_matured", cfg.Maturity, cfg.KV.Matured)
	}
	cfg.Maturity.After = []string{"72h", "1h30m"}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	ages, err := cfg.Maturity.Ages()
	if err != nil || len(ages) != 2 || ages[0] != 72*time.Hour || ages[1] != 90*time.Minute {
		t.Fatalf("Ages = %v, %v", ages, err)
	}

	for _, tc := range []struct {
		after []string
		want  string
	}{
		{[]string{"3 days"}, `"3 days" is not a duration`},
		{[]string{"500ms"}, `"500ms" is less than 1s`},
		{[]string{"1.5s"}, `"1.5s" is not a whole number of seconds`},
		{[]string{"72h", "4320m"}, `"4320m" is the same age as "72h"`},
		{[]string{"1s", "2s", "3s", "4s", "5s", "6s", "7s", "8s", "9s"}, "at most 8 ages, got 9"},
	} {
		cfg := config.Default()
		cfg.Maturity.After = tc.after
		err := cfg.Validate()
		var errs config.Errors
		if !errors.As(err, &errs) || len(errs) != 1 || errs[0].Key != "maturity.after" ||
			!strings.Contains(err.Error(), tc.want) {
			t.Errorf("after = %q: Validate = %v, want one maturity.after problem saying %s", tc.after, err, tc.want)
		}
	}

	cfg = config.Default()
	cfg.KV.Matured = cfg.KV.Tags
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "kv.matured_bucket") {
		t.Errorf("kv.matured_bucket = kv.tags_bucket: Validate = %v, want a kv.matured_bucket problem", err)
	}
}

func TestMaturity_FromEnvironment(t *testing.T) {
	cfg, err := config.Load("", []string{"SYNCD_MATURITY_AFTER=72h, 24h"})
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(cfg.Maturity.After, "|"); got != "72h|24h" {
		t.Fatalf("maturity.after from SYNCD_MATURITY_AFTER = %q", got)
	}
}
