package config

import "time"

func (s *Snapshot) validate(p *problems) {
	if !kvName.MatchString(s.Bucket) {
		p.addf("snapshot.bucket", "must be an Object Store bucket name of letters, digits, '-' and '_': %q", s.Bucket)
	}
	if !s.Enabled {
		return
	}
	// Each snapshot copies and uploads the whole mirror; the floor only
	// keeps a typo ("6" for "6h") from making that the leader's main work.
	if s.Every.Duration < time.Second {
		p.addf("snapshot.every", "must be at least 1s (hours, in practice), got %s", s.Every.Duration)
	}
	if s.Keep < 1 {
		p.addf("snapshot.keep", "must be at least 1, got %d", s.Keep)
	}
}
