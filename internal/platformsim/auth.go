package platformsim

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// The audiences a credential can be for, as named by MintTokenFor and the
// control API: the platform API, or the registry (tag history and /token).
const (
	AudienceAPI      = "api"
	AudienceRegistry = "registry"
)

// audSet is the set of audiences a credential is valid for.
type audSet uint8

const (
	audAPI audSet = 1 << iota
	audRegistry
)

// mintedToken is what the simulator knows about a credential it accepts.
type mintedToken struct {
	group     string // scope of the token: the identity's parent group
	identity  string // "" for an organization admin token
	subject   string
	aud       audSet
	expiresMs int64 // simulator time, Unix ms; 0: never
}

func (m mintedToken) expired(nowMs int64) bool { return m.expiresMs != 0 && nowMs >= m.expiresMs }

// APIAudience is the audience of platform API tokens: Options.APIAudience,
// by default the simulator's base URL.
func (s *Sim) APIAudience() string {
	if s.opts.APIAudience != "" {
		return s.opts.APIAudience
	}
	return s.baseURL()
}

// RegistryAudience is the audience of registry credentials:
// Options.RegistryAudience, by default the base URL's host[:port].
func (s *Sim) RegistryAudience() string {
	if s.opts.RegistryAudience != "" {
		return s.opts.RegistryAudience
	}
	return registryHost(s.baseURL())
}

// audienceNames spells a credential's audiences for error messages.
func (s *Sim) audienceNames(a audSet) string {
	var names []string
	if a&audAPI != 0 {
		names = append(names, fmt.Sprintf("%q (the platform API)", s.APIAudience()))
	}
	if a&audRegistry != 0 {
		names = append(names, fmt.Sprintf("%q (the registry)", s.RegistryAudience()))
	}
	return strings.Join(names, " and ")
}

// credential resolves a token the simulator was configured with or minted,
// of any audience. Per-image registry tokens from /token are not
// credentials; verifyRegistryToken reads those.
func (s *Sim) credential(tok string) (mintedToken, bool) {
	if tok == "" {
		return mintedToken{}, false
	}
	for _, t := range s.opts.Tokens {
		if t == tok {
			return mintedToken{group: s.opts.RootGroup, subject: "configured-token", aud: audAPI}, true
		}
	}
	for _, t := range s.opts.RegistryTokens {
		if t == tok {
			return mintedToken{group: s.opts.RootGroup, subject: "configured-registry-token", aud: audRegistry}, true
		}
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	m, ok := s.minted[tok]
	return m, ok
}

// authenticate admits a platform API request: a known, unexpired token
// whose audience is the API. Every refusal is 401, as the gateway answers.
func (s *Sim) authenticate(r *http.Request) *apiError {
	tok := bearer(r)
	if tok == "" {
		return s.errUnauthenticated("missing bearer token in the Authorization header")
	}
	m, ok := s.credential(tok)
	if !ok {
		return s.errUnauthenticated("the bearer token is not valid for this API")
	}
	if m.expired(s.nowMs()) {
		return s.errUnauthenticated("the bearer token expired at " + fmtMs(m.expiresMs) + "; exchange for a new one")
	}
	if m.aud&audAPI == 0 {
		return s.errUnauthenticated(fmt.Sprintf("the bearer token's audience is %s, not this API's %q",
			s.audienceNames(m.aud), s.APIAudience()))
	}
	return nil
}

// MintToken issues a platform API bearer token. An empty identityUID gives
// a token with the organization's root-group scope; otherwise the token
// acts as that identity, scoped to the identity's parent group.
func (s *Sim) MintToken(identityUID string) (string, error) {
	return s.MintTokenFor(identityUID, AudienceAPI)
}

// MintTokenFor issues a token for one audience, AudienceAPI or
// AudienceRegistry, acting as identityUID ("" for the organization's root
// group). Minted tokens do not expire; exchanged ones do.
func (s *Sim) MintTokenFor(identityUID, audience string) (string, error) {
	var aud audSet
	switch audience {
	case AudienceAPI, "":
		aud = audAPI
	case AudienceRegistry:
		aud = audRegistry
	default:
		return "", fmt.Errorf("mint token: audience %q is neither %q nor %q", audience, AudienceAPI, AudienceRegistry)
	}
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("mint token: %w", err)
	}
	tok := "simtok_" + hex.EncodeToString(b[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	m := mintedToken{group: s.opts.RootGroup, subject: "sim-admin", aud: aud}
	if identityUID != "" {
		id, ok := s.identities[identityUID]
		if !ok {
			return "", errNoIdentity(identityUID)
		}
		m = mintedToken{group: parentOf(id.uid), identity: id.uid, subject: id.subject, aud: aud}
	}
	s.minted[tok] = m
	return tok, nil
}

type errNoIdentity string

func (e errNoIdentity) Error() string { return "no identity " + string(e) }

// registryCredential finds a credential sent to the registry as a bearer
// token or as the password of Basic auth, the form registry clients and
// Docker credential helpers use (user "_token").
func registryCredential(r *http.Request) string {
	if t := bearer(r); t != "" {
		return t
	}
	if _, pw, ok := r.BasicAuth(); ok {
		return pw
	}
	return ""
}

// registryHost is the host[:port] of a base URL.
func registryHost(base string) string {
	if u, err := url.Parse(base); err == nil && u.Host != "" {
		return u.Host
	}
	_, h, ok := strings.Cut(base, "://")
	if !ok {
		return base
	}
	return h
}
