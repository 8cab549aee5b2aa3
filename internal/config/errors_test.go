package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/config"
)

// TestLoad_AllErrorsAtOnce checks that one run reports every mistake in a
// file, each with its key and line, in the file's order, together with
// those from the environment, and that errors.As still finds the first.
func TestLoad_AllErrorsAtOnce(t *testing.T) {
	p := writeConfig(t, `[platform]
base_url = "http://api.example.com"
token = "a"
token_file = "/t"

[crawl]
schedule = "@every 0s"
concurrency = 0
bogus = 1

[nats]
stream = "a.b"

[log]
level = "loud"
`)
	_, err := config.Load(p, []string{"SYNCD_STORE_INITIAL_EVENTS=all", "SYNCD_NATS_SUBJEKT=x"})
	var all config.Errors
	if !errors.As(err, &all) {
		t.Fatalf("err=%v (%T), want config.Errors", err, err)
	}
	type want struct {
		key, source string
		line        int
		msg         string
	}
	wants := []want{
		{"platform.base_url", p, 2, "cleartext"},
		{"platform.token", p, 3, "only one platform credential"},
		{"crawl.schedule", p, 7, "at least 1s"},
		{"crawl.concurrency", p, 8, "between 1 and 64"},
		{"crawl.bogus", p, 9, "unknown key"},
		{"nats.stream", p, 12, "stream name"},
		{"log.level", p, 15, "debug, info, warn or error"},
		{"", "SYNCD_NATS_SUBJEKT", 0, "unknown environment override"},
		{"store.initial_events", "SYNCD_STORE_INITIAL_EVENTS", 0, "\"none\" or \"snapshot\""},
	}
	if len(all) != len(wants) {
		t.Fatalf("got %d errors, want %d:\n%v", len(all), len(wants), err)
	}
	for i, w := range wants {
		e := all[i]
		if e.Key != w.key || e.Source != w.source || e.Line != w.line || !strings.Contains(e.Msg, w.msg) {
			t.Errorf("error %d = %+v, want key %q source %q line %d saying %q", i, *e, w.key, w.source, w.line, w.msg)
		}
	}
	lines := strings.Split(err.Error(), "\n")
	if got, want := len(lines), 1+len(wants); got != want {
		t.Fatalf("Error() has %d lines, want %d (a heading, then one per problem):\n%s", got, want, err)
	}
	if !strings.HasPrefix(lines[1], "  "+p+":2: platform.base_url: ") {
		t.Errorf("second line %q, want the first problem with its file and line", lines[1])
	}
	var first *config.Error
	if !errors.As(err, &first) || first != all[0] {
		t.Errorf("errors.As found %v, want the first problem", first)
	}
}

// TestLoad_OneErrorReadsAsBefore checks that a single problem is one line
// with no heading.
func TestLoad_OneErrorReadsAsBefore(t *testing.T) {
	_, err := config.Load(writeConfig(t, "[log]\nlevel = \"loud\"\n"), nil)
	if err == nil || strings.Contains(err.Error(), "\n") ||
		!strings.HasSuffix(err.Error(), ":2: log.level: must be debug, info, warn or error, got \"loud\"") {
		t.Fatalf("err=%q, want one line naming the file, line 2 and log.level", err)
	}
}

// TestLoad_SyntaxErrorStops checks that a file that does not parse is
// reported alone: nothing after the broken line can be trusted.
func TestLoad_SyntaxErrorStops(t *testing.T) {
	_, err := config.Load(
		writeConfig(t, "[log]\nlevel = \"loud\"\nformat = json\n"),
		[]string{"SYNCD_CRAWL_CONCURRENCY=x"},
	)
	var all config.Errors
	if !errors.As(err, &all) || len(all) != 1 || all[0].Line != 3 {
		t.Fatalf("err=%v, want exactly the syntax error at line 3", err)
	}
}

func TestRequirePlatform_AllMissing(t *testing.T) {
	cfg := config.Default()
	var all config.Errors
	if !errors.As(cfg.RequirePlatform(), &all) {
		t.Fatal("RequirePlatform() of the defaults = nil, want Errors")
	}
	var keys []string
	for _, e := range all {
		keys = append(keys, e.Key)
	}
	if got, want := strings.Join(
		keys,
		" ",
	), "platform.base_url platform.registry_url platform.group platform.organization platform.token"; got != want {
		t.Fatalf("missing keys %q, want %q", got, want)
	}
}

// TestLoadForPlatform checks that missing platform keys and invalid
// values come in one list.
func TestLoadForPlatform(t *testing.T) {
	p := writeConfig(
		t,
		"[platform]\nbase_url = \"https://api.example.com\"\ngroup = \"org1\"\n\n[crawl]\nconcurrency = 100\n",
	)
	_, err := config.LoadForPlatform(p, nil)
	var all config.Errors
	if !errors.As(err, &all) {
		t.Fatalf("err=%v, want Errors", err)
	}
	var keys []string
	for _, e := range all {
		keys = append(keys, e.Key)
	}
	if got, want := strings.Join(
		keys,
		" ",
	), "crawl.concurrency platform.registry_url platform.organization platform.token"; got != want {
		t.Fatalf("keys %q, want %q:\n%v", got, want, err)
	}
	if _, err := config.Load(p, nil); err == nil || strings.Contains(err.Error(), "registry_url") {
		t.Fatalf("Load: %v, want only the invalid value", err)
	}
}
