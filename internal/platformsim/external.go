package platformsim

import (
	"fmt"
	"net/http"
	"time"
)

// The built-in external issuer stands in for a Kubernetes cluster or a CI
// system in tests: an OIDC issuer at <base>/_sim/external, with its own key,
// whose tokens an identity's claimMatch can name and /sts/exchange verifies
// over HTTP like any other issuer's.

const externalPath = "/_sim/external"

// ExternalIssuer returns the built-in external issuer's URL.
func (s *Sim) ExternalIssuer() string { return s.baseURL() + externalPath }

// ExternalToken mints a token of the built-in external issuer for subject.
// An empty audience gives the one identities expect by default (the
// simulator issuer's host name); ttl (default 10 minutes) is simulator time.
func (s *Sim) ExternalToken(subject, audience string, ttl time.Duration) (string, error) {
	if subject == "" {
		return "", fmt.Errorf("external token: subject is required")
	}
	if audience == "" {
		audience = s.externalTokenAudience()
	}
	if ttl <= 0 {
		ttl = 10 * time.Minute
	}
	now := s.now()
	tok, err := signJWTWith(&s.externalKey, map[string]any{
		"iss": s.ExternalIssuer(), "sub": subject, "aud": audience,
		"iat": now.Unix(), "exp": now.Add(ttl).Unix(),
	})
	if err != nil {
		return "", fmt.Errorf("external token: %w", err)
	}
	return tok, nil
}

// serveExternal answers the external issuer's discovery document and keys;
// it reports whether the path was one of them.
func (s *Sim) serveExternal(w http.ResponseWriter, r *http.Request) bool {
	if r.Method != http.MethodGet {
		return false
	}
	switch r.URL.Path {
	case externalPath + "/.well-known/openid-configuration":
		writeDiscovery(w, s.ExternalIssuer(), s.ExternalIssuer()+"/jwks")
	case externalPath + "/jwks":
		s.writeJWKS(w, &s.externalKey)
	default:
		return false
	}
	return true
}
