package config

import (
	"strings"
	"time"
)

// validateQuery checks [query]: a prefix the stream does not capture, and
// bounds that keep one replica's answers within its means.
func (c *Config) validateQuery(p *problems) {
	q := c.Query
	switch sp := c.NATS.SubjectPrefix; {
	case !validToken(q.Prefix) || strings.HasPrefix(q.Prefix, "$"):
		p.addf(
			"query.prefix",
			"must be a NATS subject without wildcards or spaces, not beginning with '$' (reserved for NATS's own): %q",
			q.Prefix,
		)
	case q.Prefix == sp || strings.HasPrefix(q.Prefix, sp+"."):
		p.addf(
			"query.prefix",
			"%q lies inside the stream's subjects %s.> (nats.subject_prefix): the stream would capture every query; choose another, such as %q",
			q.Prefix,
			sp,
			sp+"-query",
		)
	}
	if !q.Enabled {
		return
	}
	if q.MaxWait.Duration <= 0 || q.MaxWait.Duration > time.Minute {
		p.addf(
			"query.max_wait",
			"must be between 1ms and 1m (a request waits this long for its min_seq, holding its place), got %s",
			q.MaxWait.Duration,
		)
	}
	if q.MaxLimit < 1 || q.MaxLimit > 100_000 {
		p.addf("query.max_limit", "must be between 1 and 100000, got %d", q.MaxLimit)
	}
	if q.Concurrency < 1 || q.Concurrency > 256 {
		p.addf("query.concurrency", "must be between 1 and 256, got %d", q.Concurrency)
	}
	if q.MaxPending < q.Concurrency || q.MaxPending > 100_000 {
		p.addf("query.max_pending", "must be between query.concurrency (%d) and 100000, got %d", q.Concurrency, q.MaxPending)
	}
}
