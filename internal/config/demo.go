package config

import (
	"cmp"
	"time"
)

// DemoToken and DemoRegistryToken are the credentials the demo's simulator
// accepts: like the real platform, it wants one per audience.
const (
	DemoToken         = "demo-token"
	DemoRegistryToken = "demo-registry-token"
)

// DemoNATSListen is where the demo's embedded NATS server listens, so
// that "nats sub" from another shell reaches it.
const DemoNATSListen = "127.0.0.1:4222"

// DemoAddrs are the fixed addresses the demo will listen on (the admin
// listener's and the embedded NATS server's), to check before it starts.
func (c Config) DemoAddrs() []string {
	var addrs []string
	if c.Admin.Listen != "" {
		addrs = append(addrs, c.Admin.Listen)
	}
	if c.NATS.URL == "" {
		addrs = append(addrs, cmp.Or(c.NATS.Listen, DemoNATSListen))
	}
	return addrs
}

// The demo's stream, subjects and buckets: its own, whatever the
// configuration says, so that the simulator's events never land in a real
// deployment's stream, and its reconciliation never deletes a real
// deployment's keys, even in a store a real deployment's embedded server
// used too.
const (
	DemoStream        = "SYNCD_DEMO"
	DemoSubjectPrefix = "syncd_demo"
	// DemoBucketPrefix begins the names of the demo's KV and Object Store
	// buckets: syncd_demo_tags, syncd_demo_repos, syncd_demo_advisories,
	// syncd_demo_snapshots.
	DemoBucketPrefix = "syncd_demo_"
)

// RequireDemo checks what "syncd run --demo" refuses, and returns every
// problem as Errors (nil when none): a configured NATS server (it
// publishes to its own embedded one only) and cluster mode.
func (c *Config) RequireDemo() error {
	var p problems
	if c.NATS.URL != "" {
		p.addf("nats.url", "syncd run --demo publishes to its own embedded NATS server only: unset it "+
			"(the simulator's events must never reach a real deployment)")
	}
	if c.Cluster.Enabled {
		p.addf("cluster.enabled", "syncd run --demo runs alone: set it to false "+
			"(a demo must never take a real deployment's lease, stream or buckets)")
	}
	return p.err()
}

// Demo is every setting "syncd run --demo" changes: the platform is the
// simulator at url, NATS an embedded server with the demo's own stream,
// subjects and buckets, and pushes from the simulator reach syncd within
// seconds while quick schedules repair whatever a push missed. Other keys
// the user set keep their values; keys at their defaults take the demo's.
func (c *Config) Demo(url string) {
	c.NATS.Stream, c.NATS.SubjectPrefix = DemoStream, DemoSubjectPrefix
	c.KV.Tags, c.KV.Repos, c.KV.Advisories = DemoBucketPrefix+
		"tags", DemoBucketPrefix+"repos", DemoBucketPrefix+"advisories"
	c.Snapshot.Bucket = DemoBucketPrefix + "snapshots"
	p := &c.Platform
	p.BaseURL, p.RegistryURL = url, url
	p.Token, p.TokenFile, p.TokenCommand = DemoToken, "", ""
	p.RegistryToken, p.RegistryTokenFile = DemoRegistryToken, ""
	p.RegistryTokenCommand, p.RegistryCredentialHelper = "", ""
	p.Identity, p.IdentityTokenFile = "", ""
	p.Group, p.Organization = "org1", "acme"
	def := Default()
	if c.NATS.URL == "" {
		orDemo(&c.NATS.Listen, "", DemoNATSListen)
	}
	orDemo(&c.Events.Listen, "", "127.0.0.1:0")
	orDemo(&c.Events.Issuer, "", url)
	orDemo(&c.Crawl.Schedule, def.Crawl.Schedule, "@every 5s")
	orDemo(&c.Crawl.SweepSchedule, def.Crawl.SweepSchedule, "@every 30s")
	orDemo(&c.Crawl.AdvisoriesSchedule, def.Crawl.AdvisoriesSchedule, "@every 10s")
	orDemo(&c.Crawl.Jitter, def.Crawl.Jitter, Duration{Duration: time.Second})
	orDemo(&c.Crawl.RequestsPerSecond, def.Crawl.RequestsPerSecond, 0)
}

// orDemo sets *v to demo while it holds def.
func orDemo[T comparable](v *T, def, demo T) {
	if *v == def {
		*v = demo
	}
}
