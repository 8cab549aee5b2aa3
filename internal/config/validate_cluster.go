package config

import (
	"regexp"
	"slices"
	"time"

	"github.com/syncd-dev/syncd/internal/signing"
)

// kvName is what NATS accepts as a KV bucket or key name (the KV's own rule,
// kept stricter: no dots, so the key is one subject token).
var kvName = regexp.MustCompile(`^[-_A-Za-z0-9]+$`)

// validateCluster checks [cluster], and what cluster mode asks of [nats]
// and [store].
func (c *Config) validateCluster(p *problems) {
	cl := c.Cluster
	if !kvName.MatchString(cl.Bucket) {
		p.addf("cluster.bucket", "must be a KV bucket name of letters, digits, '-' and '_': %q", cl.Bucket)
	}
	if !kvName.MatchString(cl.Key) {
		p.addf("cluster.key", "must be a KV key of letters, digits, '-' and '_': %q", cl.Key)
	}
	// Below a second the renewals (every third of the TTL) race the
	// server's expiry timer and ordinary network latency.
	if cl.LeaseTTL.Duration < time.Second {
		p.addf("cluster.lease_ttl", "must be at least 1s, got %s", cl.LeaseTTL.Duration)
	}
	if cl.NodeID != "" && !kvName.MatchString(cl.NodeID) {
		p.addf("cluster.node_id", "must be letters, digits, '-' and '_': %q", cl.NodeID)
	}
	if cl.Consumer != "" && !kvName.MatchString(cl.Consumer) {
		p.addf("cluster.consumer", "must be a consumer name of letters, digits, '-' and '_': %q", cl.Consumer)
	}
	c.validateTrust(p)
	if !cl.Enabled {
		return
	}
	if c.NATS.URL == "" {
		p.addf(
			"nats.url",
			"required with cluster.enabled = true: replicas share an external NATS server (the embedded one dies with its syncd)",
		)
	}
	// Followers build their mirrors from the stream alone, so the baseline
	// must be in it.
	if c.Store.InitialEvents != "snapshot" {
		p.addf(
			"store.initial_events",
			"must be \"snapshot\" with cluster.enabled = true, got %q: standbys and followers learn the baseline from the stream",
			c.Store.InitialEvents,
		)
	}
}

// validateTrust checks the signing key and the verify keys: readable by
// this process alone and well formed, and the signing key among the verify
// keys, or the replicas would reject what this one publishes as leader.
func (c *Config) validateTrust(p *problems) {
	cl := c.Cluster
	var pub string
	if cl.SigningKeyFile != "" {
		s, err := signing.LoadSigner(cl.SigningKeyFile)
		if err != nil {
			p.addf("cluster.signing_key_file", "%v", err)
		} else {
			pub = s.PublicKey()
		}
	}
	for i, k := range cl.VerifyKeys {
		if _, err := signing.ParsePublicKey(k); err != nil {
			p.addf("cluster.verify_keys", "key %d: %v", i+1, err)
		}
	}
	if pub != "" && len(cl.VerifyKeys) > 0 && !slices.Contains(cl.VerifyKeys, pub) {
		p.addf(
			"cluster.verify_keys",
			"does not list the public key of signing_key_file (%s): the other replicas would reject what this one publishes as leader",
			pub,
		)
	}
}
