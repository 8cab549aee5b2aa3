package config

import (
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// cronSpec is the schedule syntax syncd accepts: standard five fields,
// optional seconds, and descriptors such as "@every 5m" and "@hourly".
const cronSpec = cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor

// MinInterval is the shortest wait between two runs of a job that a
// schedule may ask for; cron counts whole seconds, and once a second is
// already far more than a platform needs.
const MinInterval = time.Second

// ParseSchedule parses a cron schedule as syncd's config accepts it; the
// empty string is no schedule (nil), which turns a job off. Errors quote
// the schedule.
//
// "@every" needs a whole number of seconds, at least MinInterval: the cron
// library silently turns "@every 0s", "@every -5m" and "@every 500ms" into
// every second, and "@every 1500ms" into every second too, which would hit
// the platform far more often than the config seems to say. A cron
// expression cannot fire more often than once a second, so it needs no
// such check.
func ParseSchedule(s string) (cron.Schedule, error) {
	if s == "" {
		return nil, nil
	}
	sched, err := cron.NewParser(cronSpec).Parse(s)
	if err != nil {
		return nil, fmt.Errorf("unparsable schedule %q: %w", s, err)
	}
	if _, every := sched.(cron.ConstantDelaySchedule); every {
		if err := checkEvery(s); err != nil {
			return nil, err
		}
	}
	return sched, nil
}

// checkEvery checks the interval of an "@every" schedule, which the cron
// library has already parsed.
func checkEvery(s string) error {
	_, text, _ := strings.Cut(s, "@every ")
	d, err := time.ParseDuration(text)
	switch {
	case err != nil:
		return fmt.Errorf("unparsable schedule %q: %w", s, err)
	case d <= 0:
		return fmt.Errorf(
			"%q never waits between runs (its interval is %s): want at least %s, e.g. \"@every 15m\"",
			s,
			d,
			MinInterval,
		)
	case d < MinInterval:
		return fmt.Errorf("%q would run more than once a second: want at least %s", s, MinInterval)
	case d%time.Second != 0:
		return fmt.Errorf(
			"%q is not a whole number of seconds, which cron would round down to %s: write the interval in whole seconds",
			s,
			d.Truncate(time.Second),
		)
	}
	return nil
}
