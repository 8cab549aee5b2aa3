package config

import "net/url"

// validate checks [events]; allowInsecure is [platform]
// allow_insecure_http, which covers the issuer too.
func (e *Events) validate(p *problems, allowInsecure bool) {
	checkListen(p, "events.listen", e.Listen)
	if e.SinkURL != "" {
		u, err := url.Parse(e.SinkURL)
		if err != nil || u.Host == "" || (u.Scheme != "https" && !(u.Scheme == "http" && isLoopback(u.Hostname()))) {
			p.addf("events.sink_url", "must be an https:// URL (http:// only on loopback): %q", redactURL(e.SinkURL))
		}
		if e.Listen == "" {
			p.addf("events.listen", "required when sink_url is set: the address the receiver listens on")
		}
		if e.Issuer == "" {
			p.addf("events.issuer", "required when sink_url is set: the vendor's OIDC issuer that signs deliveries")
		}
	}
	if e.Issuer != "" {
		checkHTTPURL(p, "events.issuer", e.Issuer, allowInsecure,
			"the keys that verify pushed events (whoever can alter them can forge deliveries)")
	}
	if e.Audience == "" {
		p.addf("events.audience", "required")
	}
	if e.MaxBody < 1024 {
		p.addf("events.max_body", "must be at least 1024 bytes, got %d", e.MaxBody)
	}
	if e.QueueSize < 1 {
		p.addf("events.queue_size", "must be positive, got %d", e.QueueSize)
	}
}
