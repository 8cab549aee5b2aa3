package config

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
)

// Validate checks values that decode fine but make no sense, section by
// section, and returns every problem found as Errors (nil when none).
// Platform settings that the demo fills in are checked separately by
// RequirePlatform.
func (c *Config) Validate() error {
	var p problems
	c.Platform.validate(&p)
	c.Crawl.validate(&p)
	c.Events.validate(&p, c.Platform.AllowInsecureHTTP)
	c.NATS.validate(&p)
	c.Store.validate(&p)
	c.Admin.validate(&p)
	c.Log.validate(&p)
	c.validateCluster(&p)
	c.validateKV(&p)
	c.Snapshot.validate(&p)
	c.Verify.validate(&p)
	c.Sync.validate(&p)
	c.validateQuery(&p)
	c.Maturity.validate(&p)
	return p.err()
}

// RequirePlatform checks the keys a real (non-demo) run cannot do without,
// and returns every one missing as Errors (nil when none is).
func (c *Config) RequirePlatform() error {
	var p problems
	pl := c.Platform
	if pl.BaseURL == "" {
		p.addf("platform.base_url", "required (the platform API address, e.g. https://console-api.example.com)")
	}
	if pl.RegistryURL == "" {
		p.addf("platform.registry_url", "required (the registry address, e.g. https://cgr.example.com)")
	}
	if pl.Group == "" {
		p.addf("platform.group", "required (the uid of the organization's root group)")
	}
	if pl.Organization == "" {
		p.addf("platform.organization", "required (the organization's name in registry paths)")
	}
	if pl.Identity == "" && pl.Token == "" && pl.TokenFile == "" && pl.TokenCommand == "" {
		p.addf(
			"platform.token",
			"required: set one of token, token_file or token_command, or assume an identity with identity and identity_token_file",
		)
	}
	return p.err()
}

func (s *Store) validate(p *problems) {
	if s.Path == "" {
		p.addf("store.path", "required")
	}
	if s.EventRetention.Duration <= 0 {
		p.addf("store.event_retention", "must be positive")
	}
	switch s.InitialEvents {
	case "none", "snapshot":
	default:
		p.addf("store.initial_events", "must be \"none\" or \"snapshot\", got %q", s.InitialEvents)
	}
}

func (a *Admin) validate(p *problems) {
	checkListen(p, "admin.listen", a.Listen)
	if a.StaleFactor < 1 {
		p.addf("admin.stale_factor", "must be at least 1, got %g", a.StaleFactor)
	}
}

func (l *Log) validate(p *problems) {
	switch strings.ToLower(l.Level) {
	case "debug", "info", "warn", "error":
	default:
		p.addf("log.level", "must be debug, info, warn or error, got %q", l.Level)
	}
	switch l.Format {
	case "auto", "text", "json":
	default:
		p.addf("log.format", "must be auto, text or json, got %q", l.Format)
	}
}

// checkListen checks an optional host:port to listen on.
func checkListen(p *problems, key, addr string) {
	if addr == "" {
		return
	}
	if _, _, err := net.SplitHostPort(addr); err != nil {
		p.addf(key, "not a host:port: %q", addr)
	}
}

// checkHTTPURL checks a URL that a credential, or keys that verify one,
// travel over: http(s), and http:// only to a loopback host unless
// allowInsecure. carries says what would cross the network in cleartext.
func checkHTTPURL(p *problems, key, raw string, allowInsecure bool, carries string) {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.addf(key, "not an http(s) URL: %q", redactURL(raw))
		return
	}
	if u.Scheme == "http" && !allowInsecure && !isLoopback(u.Hostname()) {
		p.addf(
			key,
			"http:// to %s would carry %s in cleartext: use https://, or set platform.allow_insecure_http = true if the network is trusted (http:// to loopback is always allowed)",
			u.Host,
			carries,
		)
	}
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// readable reports why path is not a regular file this process can read.
func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cannot read %q: %v", path, errors.Unwrap(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("cannot read %q: %v", path, err)
	}
	if st.IsDir() {
		return fmt.Errorf("%q is a directory, want a file", path)
	}
	return nil
}
