package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/config"
)

// TestLoad_Schedules checks that a schedule asking for runs less than a
// second apart, or never apart, is refused for every job, and that once a
// second, in either syntax, is accepted.
func TestLoad_Schedules(t *testing.T) {
	keys := []string{"schedule", "sweep_schedule", "advisories_schedule", "subscriptions_schedule"}
	for _, tc := range []struct{ schedule, msg string }{
		{"@every 0s", "never waits between runs"},
		{"@every -5m", "never waits between runs"},
		{"@every 500ms", "more than once a second"},
		{"@every 1ns", "more than once a second"},
		{"@every 1500ms", "whole number of seconds"},
		{"@every soon", "unparsable schedule"},
		{"CRON_TZ=UTC @every 0s", "never waits between runs"},
	} {
		for _, key := range keys {
			t.Run(key+"/"+tc.schedule, func(t *testing.T) {
				_, err := config.Load(writeConfig(t, "[crawl]\n"+key+" = \""+tc.schedule+"\"\n"), nil)
				var ce *config.Error
				if !errors.As(err, &ce) {
					t.Fatalf("err=%v, want a *config.Error", err)
				}
				if ce.Key != "crawl."+key || ce.Line != 2 || !strings.Contains(ce.Msg, tc.msg) {
					t.Fatalf("err=%v, want crawl.%s at line 2 saying %q", err, key, tc.msg)
				}
			})
		}
	}
	for _, ok := range []string{"@every 1s", "* * * * * *", "*/1 * * * * *", "@every 2m30s", "0 */15 * * * *", "@hourly"} {
		if _, err := config.Load(writeConfig(t, "[crawl]\nschedule = \""+ok+"\"\n"), nil); err != nil {
			t.Errorf("schedule %q: %v, want it accepted", ok, err)
		}
	}
}

func TestParseSchedule(t *testing.T) {
	if s, err := config.ParseSchedule(""); s != nil || err != nil {
		t.Fatalf("ParseSchedule(\"\") = %v, %v; want nil, nil (the job is off)", s, err)
	}
	if _, err := config.ParseSchedule("@every 0s"); err == nil {
		t.Fatal("ParseSchedule(\"@every 0s\") = nil error, want it refused")
	}
}
