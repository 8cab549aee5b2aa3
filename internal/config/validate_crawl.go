package config

// tagFamilies are the values [crawl] tag_families accepts.
var tagFamilies = map[string]struct{}{"dates": {}, "epochs": {}, "referrers": {}}

func (c *Crawl) validate(p *problems) {
	for _, f := range c.TagFamilies {
		if _, ok := tagFamilies[f]; !ok {
			p.addf("crawl.tag_families", "unknown tag family %q (want \"dates\", \"epochs\" or \"referrers\")", f)
		}
	}
	for _, sc := range []struct{ key, val string }{
		{"crawl.schedule", c.Schedule},
		{"crawl.sweep_schedule", c.SweepSchedule},
		{"crawl.advisories_schedule", c.AdvisoriesSchedule},
		{"crawl.subscriptions_schedule", c.SubscriptionsSchedule},
	} {
		// An empty schedule turns its job off.
		if _, err := ParseSchedule(sc.val); err != nil {
			p.addf(sc.key, "%v", err)
		}
	}
	if c.Schedule == "" {
		p.addf("crawl.schedule", "required: the incremental crawl cannot be turned off")
	}
	if c.UpdatedSinceMargin.Duration <= 0 {
		p.addf("crawl.updated_since_margin", "must be positive: the upstream's clock and commits out of order need room")
	}
	if c.Jitter.Duration < 0 {
		p.addf("crawl.jitter", "must not be negative")
	}
	if c.Concurrency < 1 || c.Concurrency > 64 {
		p.addf("crawl.concurrency", "must be between 1 and 64, got %d", c.Concurrency)
	}
	if c.RequestsPerSecond < 0 {
		p.addf("crawl.requests_per_second", "must not be negative (0 means unlimited)")
	}
}
