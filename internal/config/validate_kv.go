package config

import "time"

// validateKV checks [kv]: bucket names NATS accepts, distinct from each
// other and from the lease's, and sizes JetStream allows.
func (c *Config) validateKV(p *problems) {
	kv := c.KV
	seen := map[string]string{c.Cluster.Bucket: "cluster.bucket"}
	for _, b := range []struct{ key, name string }{
		{"kv.tags_bucket", kv.Tags}, {"kv.repos_bucket", kv.Repos}, {"kv.advisories_bucket", kv.Advisories},
		{"kv.matured_bucket", kv.Matured},
	} {
		if !kvName.MatchString(b.name) {
			p.addf(b.key, "must be a KV bucket name of letters, digits, '-' and '_': %q", b.name)
			continue
		}
		if other, dup := seen[b.name]; dup {
			p.addf(b.key, "must differ from %s: both are %q", other, b.name)
			continue
		}
		seen[b.name] = b.key
	}
	if kv.History < 1 || kv.History > 64 {
		p.addf("kv.history", "must be between 1 and 64 (JetStream's limit), got %d", kv.History)
	}
	if kv.Replicas < 0 || kv.Replicas > 5 {
		p.addf("kv.replicas", "must be 0 (nats.replicas) or between 1 and 5, got %d", kv.Replicas)
	}
	// Each reconciliation reads every live resource of the mirror and every
	// key of the buckets: more often than a minute is a full scan on loop.
	if d := kv.ReconcileInterval.Duration; d < 0 || (d > 0 && d < time.Minute) {
		p.addf("kv.reconcile_interval", "must be 0 (only at start and after failures) or at least 1m, got %s", d)
	}
}
