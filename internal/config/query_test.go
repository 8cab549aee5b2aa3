package config_test

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
)

func TestQuery_DefaultsAndValidation(t *testing.T) {
	cfg := config.Default()
	if q := cfg.Query; !q.Enabled ||
		q.Prefix != "syncd-query" ||
		q.MaxWait.Duration != 5*time.Second ||
		q.MaxLimit != 1000 ||
		q.Concurrency != 4 ||
		q.MaxPending != 256 {
		t.Fatalf("query defaults = %+v", q)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatalf("defaults: %v", err)
	}
	keysOf := func(err error) []string {
		t.Helper()
		var errs config.Errors
		if !errors.As(err, &errs) {
			t.Fatalf("Validate = %v, want Errors", err)
		}
		var keys []string
		for _, e := range errs {
			keys = append(keys, e.Key)
		}
		return keys
	}

	cfg.Query = config.Query{
		Enabled:     true,
		Prefix:      "q.*",
		MaxWait:     config.Duration{Duration: 2 * time.Minute},
		MaxLimit:    0,
		Concurrency: 300,
		MaxPending:  10,
	}
	keys := keysOf(cfg.Validate())
	for _, want := range []string{
		"query.prefix",
		"query.max_wait",
		"query.max_limit",
		"query.concurrency",
		"query.max_pending",
	} {
		if !slices.Contains(keys, want) {
			t.Errorf("Validate reported %v, want %s among them", keys, want)
		}
	}

	// Inside the stream's subjects, or NATS's own: refused, naming why.
	for _, prefix := range []string{"syncd", "syncd.query", "$SRV"} {
		cfg := config.Default()
		cfg.Query.Prefix = prefix
		err := cfg.Validate()
		if keys := keysOf(err); !slices.Equal(keys, []string{"query.prefix"}) {
			t.Errorf("prefix %q: %v", prefix, err)
		}
		if prefix != "$SRV" && !strings.Contains(err.Error(), "capture") {
			t.Errorf("prefix %q: %v, want it to say the stream would capture the queries", prefix, err)
		}
	}
	// Outside them: fine, and so are bad bounds while the service is off.
	cfg = config.Default()
	cfg.Query.Prefix = "syncdq.acme"
	cfg.NATS.SubjectPrefix = "acme.syncd"
	if err := cfg.Validate(); err != nil {
		t.Errorf("prefix syncdq.acme beside acme.syncd: %v", err)
	}
	cfg.Query.Enabled, cfg.Query.MaxLimit = false, -1
	if err := cfg.Validate(); err != nil {
		t.Errorf("bounds of a disabled service: %v", err)
	}
}
