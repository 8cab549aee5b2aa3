package config

import (
	"net"
	"net/url"
	"strings"
	"time"
)

func (n *NATS) validate(p *problems) {
	if n.URL != "" {
		for _, u := range strings.Split(n.URL, ",") {
			pu, err := url.Parse(strings.TrimSpace(u))
			if err != nil || pu.Host == "" ||
				!strings.HasPrefix(pu.Scheme, "nats") && !strings.HasPrefix(pu.Scheme, "tls") &&
					!strings.HasPrefix(pu.Scheme, "ws") {
				p.addf("nats.url", "not a NATS URL (want nats://host:port): %q", redactURL(u))
			}
		}
	}
	checkListen(p, "nats.listen", n.Listen)
	if !strings.EqualFold(n.SyncInterval, "always") {
		if d, err := time.ParseDuration(n.SyncInterval); err != nil || d <= 0 {
			p.addf("nats.sync_interval", `must be "always" or a positive duration such as "1s" or "2m", got %q`, n.SyncInterval)
		}
	}
	n.validateListen(p)
	if !validToken(n.SubjectPrefix) {
		p.addf("nats.subject_prefix", "must be a non-empty NATS subject without wildcards or spaces: %q", n.SubjectPrefix)
	}
	if n.Stream == "" || strings.ContainsAny(n.Stream, ".*> \t/\\") {
		p.addf("nats.stream", "must be a stream name without '.', '*', '>', '/' or spaces: %q", n.Stream)
	}
	if n.DuplicateWindow.Duration <= 0 {
		p.addf("nats.duplicate_window", "must be positive")
	}
	if n.MaxAge.Duration < 0 || (n.MaxAge.Duration > 0 && n.MaxAge.Duration < n.DuplicateWindow.Duration) {
		p.addf("nats.max_age", "must be 0 (unlimited) or at least duplicate_window")
	}
	n.validateConnection(p)
}

func validToken(subject string) bool {
	if subject == "" {
		return false
	}
	for _, tok := range strings.Split(subject, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return false
		}
	}
	return true
}

// validateConnection checks the [nats] keys about reaching an external
// server: replicas, authentication and TLS. Files are opened here so that a
// wrong path fails at start with the key's name, not at the first reconnect.
func (n *NATS) validateConnection(p *problems) {
	if n.Replicas < 1 || n.Replicas > 5 {
		p.addf("nats.replicas", "must be between 1 and 5 (JetStream's limit), got %d", n.Replicas)
	}
	external := []struct{ key, val string }{
		{"nats.credentials", n.Credentials}, {"nats.nkey_seed", n.NKeySeed}, {"nats.token", n.Token},
		{"nats.user", n.User}, {"nats.password", n.Password},
		{"nats.tls_ca", n.TLSCA}, {"nats.tls_cert", n.TLSCert}, {"nats.tls_key", n.TLSKey},
	}
	if n.URL == "" {
		// The embedded server has no TLS, and takes a token or a user and
		// password only when it listens: another key set here most likely
		// means nats.url was forgotten, and the rest of what is checked
		// below would only repeat that.
		for _, k := range external {
			if k.val != "" && !(n.Listen != "" && embeddedAuth[k.key]) {
				p.addf(
					k.key,
					"only applies to an external server (or, for token, user and password, an embedded one with nats.listen): set nats.url too",
				)
			}
		}
		if n.Replicas > 1 && n.Replicas <= 5 {
			p.addf("nats.replicas", "the embedded server is a single node: replicas must be 1 unless nats.url names a cluster")
		}
		if n.Listen != "" {
			n.validateAuth(p)
		}
		return
	}
	n.validateAuth(p)
	n.validateFiles(p)
}

// embeddedAuth are the [nats] keys that also apply to the embedded server
// when it listens: what its clients must present.
var embeddedAuth = map[string]bool{"nats.token": true, "nats.user": true, "nats.password": true}

// validateListen keeps the embedded server on loopback unless
// listen_public says otherwise, and then wants credentials: an anonymous
// client on the network could delete the stream.
func (n *NATS) validateListen(p *problems) {
	if n.URL != "" {
		if n.ListenPublic {
			p.addf("nats.listen_public", "only applies to the embedded server, and nats.url names an external one")
		}
		return
	}
	host, _, err := net.SplitHostPort(n.Listen)
	if err != nil {
		return // no listener, or checkListen said what is wrong
	}
	if !isLoopback(host) && !n.ListenPublic {
		p.addf("nats.listen", "%s is not a loopback address: the embedded NATS server would take clients from the network; "+
			"listen on 127.0.0.1, or set nats.listen_public = true with nats.token, or nats.user and nats.password", n.Listen)
	}
	if n.ListenPublic && n.Token == "" && n.User == "" {
		p.addf(
			"nats.listen_public",
			"requires credentials that every client must present: set nats.token, or nats.user and nats.password",
		)
	}
}

// validateAuth checks that at most one way to authenticate is set, and
// user and password together.
func (n *NATS) validateAuth(p *problems) {
	// Pairs name the key that is set, so the error can point at its line.
	if n.User != "" && n.Password == "" {
		p.addf("nats.user", "set nats.password too: user and password come together")
	}
	if n.Password != "" && n.User == "" {
		p.addf("nats.password", "set nats.user too: user and password come together")
	}
	var methods []string
	for _, m := range []struct{ key, val string }{
		{"nats.credentials", n.Credentials}, {"nats.nkey_seed", n.NKeySeed}, {"nats.token", n.Token}, {"nats.user", n.User},
	} {
		if m.val != "" {
			methods = append(methods, m.key)
		}
	}
	if len(methods) > 1 {
		p.addf(methods[1], "set only one way to authenticate: %s", strings.Join(methods, " and "))
	}
}

// validateFiles checks the TLS pairs and that every file named can be read.
func (n *NATS) validateFiles(p *problems) {
	if n.TLSCert != "" && n.TLSKey == "" {
		p.addf("nats.tls_cert", "set nats.tls_key too: the client certificate and its key come together")
	}
	if n.TLSKey != "" && n.TLSCert == "" {
		p.addf("nats.tls_key", "set nats.tls_cert too: the client certificate and its key come together")
	}
	for _, f := range []struct{ key, path string }{
		{"nats.credentials", n.Credentials}, {"nats.nkey_seed", n.NKeySeed},
		{"nats.tls_ca", n.TLSCA}, {"nats.tls_cert", n.TLSCert}, {"nats.tls_key", n.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		if err := readable(f.path); err != nil {
			p.addf(f.key, "%v", err)
		}
	}
}
