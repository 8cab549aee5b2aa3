package platformsim

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
)

// Token exchange (STS). A service assumes an identity by presenting an
// external OIDC token (a Kubernetes service-account token, a CI token) at
// <issuer>/sts/exchange; the simulator checks it against the identity's
// claimMatch and the external issuer's published keys, and mints a
// short-lived token per requested audience (sdk sts/sts.go,
// proto/platform/oidc/v1/oidc.platform.proto).

// jwtClaims are the claims of an external token the exchange reads.
type jwtClaims struct {
	Issuer    string   `json:"iss"`
	Subject   string   `json:"sub"`
	Audience  audClaim `json:"aud"`
	Expiry    int64    `json:"exp"`
	NotBefore int64    `json:"nbf"`
}

// audClaim is a JWT `aud`: one string or a list of them.
type audClaim []string

func (a *audClaim) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = audClaim{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}

// unverifiedClaims decodes a JWT's payload without checking its signature,
// to learn which identity and issuer it claims before fetching keys.
func unverifiedClaims(tok string) (jwtClaims, error) {
	var c jwtClaims
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return c, fmt.Errorf("not a JWT (want three dot-separated parts)")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return c, fmt.Errorf("payload is not base64url: %w", err)
	}
	if err := json.Unmarshal(b, &c); err != nil {
		return c, fmt.Errorf("payload is not JSON claims: %w", err)
	}
	return c, nil
}

// externalTokenAudience is the `aud` an external token must carry when the
// identity's claimMatch names none: the simulator issuer's host name, as
// upstream defaults to its own issuer's.
func (s *Sim) externalTokenAudience() string {
	if s.opts.ExternalTokenAudience != "" {
		return s.opts.ExternalTokenAudience
	}
	if u, err := url.Parse(s.baseURL()); err == nil {
		return u.Hostname()
	}
	return ""
}

func (s *Sim) errPermissionDenied(msg string) *apiError {
	return s.newError(codePermissionDenied, "Permission denied: "+msg)
}

// exchangeRequest is what one exchange asks for.
type exchangeRequest struct {
	identity string
	auds     []string
	aud      audSet
}

// parseExchange reads the request fields, sent as a form body (the SDK) or
// as a query (the docs' curl); aud repeats or holds a comma list.
func (s *Sim) parseExchange(r *http.Request) (exchangeRequest, *apiError) {
	var x exchangeRequest
	if err := r.ParseForm(); err != nil {
		return x, s.errInvalid("body", "must be form-encoded: "+err.Error())
	}
	x.identity = r.Form.Get("identity")
	if x.identity == "" {
		return x, s.errInvalid("identity", "is required: the uid of the identity to assume")
	}
	for _, v := range r.Form["aud"] {
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" && !slices.Contains(x.auds, a) {
				x.auds = append(x.auds, a)
			}
		}
	}
	if len(x.auds) == 0 {
		return x, s.errInvalid("aud", fmt.Sprintf("is required: %q for the platform API, %q for the registry",
			s.APIAudience(), s.RegistryAudience()))
	}
	for _, a := range x.auds {
		switch a {
		case s.APIAudience():
			x.aud |= audAPI
		case s.RegistryAudience():
			x.aud |= audRegistry
		default:
			return x, s.errInvalid(
				"aud",
				fmt.Sprintf("%q is not an audience of this platform; use %q for the platform API or %q for the registry",
					a, s.APIAudience(), s.RegistryAudience()),
			)
		}
	}
	return x, nil
}

// serveExchange answers POST and GET /sts/exchange.
func (s *Sim) serveExchange(w http.ResponseWriter, r *http.Request, _ route) {
	ext := bearer(r)
	if ext == "" {
		writeError(w, s.errUnauthenticated("missing the external OIDC token in the Authorization header (Bearer)"))
		return
	}
	x, e := s.parseExchange(r)
	if e != nil {
		writeError(w, e)
		return
	}
	claims, err := unverifiedClaims(ext)
	if err != nil {
		writeError(w, s.errUnauthenticated("the external token is unreadable: "+err.Error()))
		return
	}
	s.mu.RLock()
	id, ok := s.identities[x.identity]
	var want identity
	if ok {
		want = *id
	}
	s.mu.RUnlock()
	if !ok {
		writeError(w, s.errNotFound("identity", x.identity))
		return
	}
	if e := s.checkExternalToken(r, ext, claims, want); e != nil {
		writeError(w, e)
		return
	}
	tok, expires, err := s.mintExchanged(want, x)
	if err != nil {
		writeError(w, s.newError(codeInternal, "Internal: mint token: "+err.Error()))
		return
	}
	s.stats.exchanged()
	writeJSON(w, http.StatusOK, map[string]any{
		"token":        tok,
		"refreshToken": "simrefresh_" + randomHex(16),
		"expiry":       time.UnixMilli(expires).UTC().Format(time.RFC3339),
	})
}

// checkExternalToken verifies an external token against an identity's
// claimMatch: issuer and subject exactly, the signature with the issuer's
// keys discovered over HTTP, expiry in simulator time, and the audience.
// Messages name what did not match, never the token.
func (s *Sim) checkExternalToken(r *http.Request, raw string, c jwtClaims, id identity) *apiError {
	if id.issuer == "" {
		return s.errPermissionDenied(
			fmt.Sprintf("identity %s has no claimMatch: it cannot be assumed by token exchange", id.uid),
		)
	}
	if c.Issuer != id.issuer {
		return s.errPermissionDenied(
			fmt.Sprintf("the token's issuer %q does not match the claimMatch issuer %q of identity %s",
				c.Issuer, id.issuer, id.uid),
		)
	}
	if c.Subject != id.subject {
		return s.errPermissionDenied(
			fmt.Sprintf("the token's subject %q does not match the claimMatch subject %q of identity %s",
				c.Subject, id.subject, id.uid),
		)
	}
	if e := s.verifySignature(r, raw, c.Issuer); e != nil {
		return e
	}
	now := s.now()
	if c.Expiry == 0 {
		return s.errUnauthenticated("the token has no exp claim")
	}
	if exp := time.Unix(c.Expiry, 0); !now.Before(exp) {
		return s.errUnauthenticated("the token expired at " + exp.UTC().Format(time.RFC3339))
	}
	if c.NotBefore != 0 && now.Before(time.Unix(c.NotBefore, 0)) {
		return s.errUnauthenticated("the token is not valid before " + time.Unix(c.NotBefore, 0).UTC().Format(time.RFC3339))
	}
	wantAud := id.audience
	if wantAud == "" {
		wantAud = s.externalTokenAudience()
	}
	if !slices.Contains(c.Audience, wantAud) {
		return s.errPermissionDenied(fmt.Sprintf("the token's audience %q does not include %q, which identity %s expects",
			[]string(c.Audience), wantAud, id.uid))
	}
	return nil
}

// verifySignature checks a token's signature with the keys its issuer
// publishes, discovered at <issuer>/.well-known/openid-configuration with a
// real HTTP fetch, as upstream does for any issuer. Expiry is checked by the
// caller in simulator time.
func (s *Sim) verifySignature(r *http.Request, raw, issuer string) *apiError {
	ctx := oidc.ClientContext(r.Context(), s.opts.IssuerClient)
	p, err := oidc.NewProvider(ctx, issuer)
	if err != nil {
		return s.errUnauthenticated(fmt.Sprintf("cannot discover issuer %q to verify the token: %v", issuer, err))
	}
	v := p.VerifierContext(ctx, &oidc.Config{SkipClientIDCheck: true, SkipExpiryCheck: true})
	if _, err := v.Verify(ctx, raw); err != nil {
		return s.errUnauthenticated(
			fmt.Sprintf("the token's signature does not verify with the keys of issuer %q: %v", issuer, err),
		)
	}
	return nil
}

// mintExchanged issues the token an exchange returns: a JWT from the
// simulator's issuer acting as the identity, for the requested audiences,
// valid for Options.ExchangeTokenTTL of simulator time.
func (s *Sim) mintExchanged(id identity, x exchangeRequest) (string, int64, error) {
	now := s.now()
	expires := now.Add(s.opts.ExchangeTokenTTL)
	tok, err := s.signJWT(map[string]any{
		"iss": s.Issuer(), "sub": id.uid, "aud": x.auds,
		"iat": now.Unix(), "exp": expires.Unix(), "jti": randomHex(12),
	})
	if err != nil {
		return "", 0, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if cur, ok := s.identities[id.uid]; ok {
		cur.lastSeenMs = now.UnixMilli()
	}
	s.minted[tok] = mintedToken{group: parentOf(id.uid), identity: id.uid, subject: id.subject,
		aud: x.aud, expiresMs: expires.UnixMilli()}
	return tok, expires.UnixMilli(), nil
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
