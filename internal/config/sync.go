package config

import "time"

// Sync configures "syncd sync --once", the one-shot command of cron jobs
// and CI.
type Sync struct {
	// Timeout is how long it waits for an unreachable platform (each
	// request's retries) or NATS server (the first connection) before it
	// gives up and exits 1: a cron job must end. --timeout overrides it.
	Timeout Duration `toml:"timeout"`
}

// DefaultSyncTimeout is [sync] timeout's default: the daemon's bound on
// one platform request's retries, which NATS now shares.
const DefaultSyncTimeout = 2 * time.Minute

func (s *Sync) validate(p *problems) {
	if s.Timeout.Duration < time.Second {
		p.addf("sync.timeout", "must be at least 1s, got %s", s.Timeout.Duration)
	}
}
