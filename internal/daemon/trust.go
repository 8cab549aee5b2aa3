package daemon

import (
	"log/slog"
	"sync/atomic"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/signing"
)

// Trust is what this syncd signs the messages it publishes with, and
// whose signatures it accepts on what it reads back from the stream.
type Trust struct {
	// Signer signs what this replica publishes as leader; nil: unsigned.
	Signer *signing.Signer
	// Verifier is the keys a follower or standby accepts; nil: every
	// message is taken.
	Verifier *signing.Verifier
	// metrics counts the rejected messages once it is set.
	metrics atomic.Pointer[admin.Metrics]
}

// LoadTrust reads [cluster] signing_key_file and verify_keys (validated
// with the config); without verify keys, the signing key's own public key
// is trusted. Without either it says, once, that followers take whatever
// the account's publishers write.
func LoadTrust(cfg config.Config, log *slog.Logger) (*Trust, error) {
	cl := cfg.Cluster
	t := &Trust{}
	keys := cl.VerifyKeys
	if cl.SigningKeyFile != "" {
		s, err := signing.LoadSigner(cl.SigningKeyFile)
		if err != nil {
			return nil, ConfigError{err}
		}
		t.Signer = s
		if len(keys) == 0 {
			keys = []string{s.PublicKey()}
		}
	}
	if len(keys) > 0 {
		v, err := signing.NewVerifier(keys)
		if err != nil {
			return nil, ConfigError{err}
		}
		t.Verifier = v
	}
	switch {
	case t.Signer == nil && t.Verifier == nil:
		log.Warn(
			"no [cluster] signing_key_file or verify_keys: messages are published unsigned, and followers and standbys apply " +
				"whatever any publisher of the NATS account writes on the stream's subjects (docs/cluster.md, \"Signed messages\")",
		)
	case t.Signer != nil:
		log.Info("signing published messages", "key", t.Signer.PublicKey(), "verify_keys", len(keys))
	default:
		log.Info("accepting only signed messages", "verify_keys", len(keys))
	}
	return t, nil
}

// countTo has m count the messages rejected from now on.
func (t *Trust) countTo(m *admin.Metrics) { t.metrics.Store(m) }

// rejected counts a message set aside for reason.
func (t *Trust) rejected(reason string) {
	if m := t.metrics.Load(); m != nil {
		m.MessageRejected(reason)
	}
}
