package config

import (
	"fmt"
	"strings"
	"time"
)

// MaxMaturityAges bounds [maturity] after: each age is a key per tag in
// the matured bucket and a recomputation of the tags that moved.
const MaxMaturityAges = 8

// Ages returns [maturity] after as durations, in the order given; an error
// names the first that is not a duration.
func (m Maturity) Ages() ([]time.Duration, error) {
	out := make([]time.Duration, 0, len(m.After))
	for _, s := range m.After {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("%q is not a duration (want e.g. \"72h\", \"30m\")", s)
		}
		out = append(out, d)
	}
	return out, nil
}

// validate checks [maturity] after: durations of whole seconds, at least
// 1s (the mirror keeps times to the millisecond, and an age of less is no
// cooldown), distinct, at most MaxMaturityAges.
func (m Maturity) validate(p *problems) {
	if len(m.After) > MaxMaturityAges {
		p.addf("maturity.after", "at most %d ages, got %d", MaxMaturityAges, len(m.After))
		return
	}
	seen := map[time.Duration]string{}
	for _, s := range m.After {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		switch {
		case err != nil:
			p.addf("maturity.after", "%q is not a duration (want e.g. \"72h\", \"30m\")", s)
		case d < time.Second:
			p.addf("maturity.after", "%q is less than 1s", s)
		case d%time.Second != 0:
			p.addf("maturity.after", "%q is not a whole number of seconds", s)
		case seen[d] != "":
			p.addf("maturity.after", "%q is the same age as %q", s, seen[d])
		default:
			seen[d] = s
		}
	}
}
