package config

import "time"

func (v *Verify) validate(p *problems) {
	// The floors keep a typo ("5" for "5m") from making the checks the
	// leader's main work: a checkpoint is a message on the stream, an
	// audit reads the stream back.
	for _, d := range []struct {
		key   string
		value time.Duration
	}{{"verify.checkpoint_every", v.CheckpointEvery.Duration}, {"verify.audit_every", v.AuditEvery.Duration}} {
		if d.value < time.Second {
			p.addf(d.key, "must be a duration of at least 1s (minutes, in practice), got %s", d.value)
		}
	}
	// A sweep reads the whole stream back.
	if d := v.SweepEvery.Duration; d < time.Minute {
		p.addf("verify.sweep_every", "must be a duration of at least 1m (hours, in practice), got %s", d)
	}
}
