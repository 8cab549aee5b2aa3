package platform

import (
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// AuthError reports a credential that was refused: by the platform API
// (401 or 403 after the one refresh), by the registry (403, or 401 after
// its token challenge), or by the STS when exchanging an external token.
// Its message names the credential, the audience it was meant for, and
// what to do; it never holds a token. Err is the underlying failure, often
// an *Error, so AsError and IsPermission see through it.
type AuthError struct {
	// Service is who refused: "platform API", "registry", "STS <url>".
	Service string
	// Credential names what was presented: "platform token", "registry
	// token", "anonymous access", "identity exchange of <uid>".
	Credential string
	// Audience is the audience the credential was meant for.
	Audience string
	// Status is the HTTP status of the refusal; 0 when no answer came.
	Status int
	// Hint says what to do about it.
	Hint string
	// Credential-wide refusals concern the credential itself (expired,
	// for another audience, of the wrong kind), not one resource it may
	// not read: every request with it will be refused until it is fixed.
	CredentialWide bool
	Err            error
}

func (e *AuthError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s refused the %s for audience %s", e.Service, e.Credential, e.Audience)
	if e.Status != 0 {
		fmt.Fprintf(&b, " (%d %s)", e.Status, http.StatusText(e.Status))
	}
	if e.Hint != "" {
		fmt.Fprintf(&b, ": %s", e.Hint)
	}
	if e.Err != nil {
		fmt.Fprintf(&b, " [%v]", e.Err)
	}
	return b.String()
}

func (e *AuthError) Unwrap() error { return e.Err }

// IsAuthError reports whether err is, or wraps, an *AuthError: a credential
// refused for its audience, which retrying will not mend.
func IsAuthError(err error) bool {
	var e *AuthError
	return errors.As(err, &e)
}

// DefaultAPIAudience is the audience of platform API tokens when
// Config.APIAudience is empty: the API's base URL, as the vendor's own
// examples exchange for.
func DefaultAPIAudience(baseURL string) string { return strings.TrimRight(baseURL, "/") }

// DefaultRegistryAudience is the audience of registry tokens when
// Config.RegistryAudience is empty: the registry URL's host[:port]
// ("cgr.dev"), or "" when registryURL is not a URL.
func DefaultRegistryAudience(registryURL string) string {
	u, err := url.Parse(registryURL)
	if err != nil {
		return ""
	}
	return u.Host
}

// audienceMismatch returns a sentence saying tok was issued for another
// audience than want, or "" when tok is not a JWT or names want. Reading
// the claim unverified is enough to tell a user which token they gave.
func audienceMismatch(tok, want string) string {
	claims, ok := jwtClaims(tok)
	if !ok || len(claims.Aud) == 0 || slices.Contains(claims.Aud, want) {
		return ""
	}
	return fmt.Sprintf("the token was issued for audience %s, not %s", strings.Join(claims.Aud, ","), want)
}

// platformAuthError explains a platform API refusal of tok.
func (c *Client) platformAuthError(status int, tok string, err error) error {
	aud := c.cfg.APIAudience
	e := &AuthError{
		Service:        "platform API",
		Credential:     "platform token",
		Audience:       aud,
		Status:         status,
		Err:            err,
		CredentialWide: true,
	}
	xt, exchanged := c.cfg.Token.(*ExchangeToken)
	if exchanged {
		e.Credential = "token of identity " + xt.Identity
	}
	switch {
	case tok == "":
		e.Hint = "no platform token is configured; set token_command = 'chainctl auth token' (or token, token_file, or identity)"
	case status == http.StatusForbidden && exchanged:
		e.Hint = fmt.Sprintf(
			"the token was accepted but identity %s lacks permission for this request; bind it a role (for example viewer) on the group",
			xt.Identity,
		)
	case status == http.StatusForbidden:
		e.Hint = "the token was accepted but its identity lacks permission for this request; bind it a role (for example viewer) on the group"
	case audienceMismatch(tok, aud) != "":
		e.Hint = fmt.Sprintf(
			"%s (a registry token?); set token_command = 'chainctl auth token --audience %s'",
			audienceMismatch(tok, aud),
			aud,
		)
	case exchanged:
		e.Hint = fmt.Sprintf(
			"the token exchanged for identity %s was not accepted; check that api_audience is %s",
			xt.Identity,
			aud,
		)
	default:
		e.Hint = fmt.Sprintf(
			"the token is expired, revoked, or issued for another audience (a registry token is refused here); set token_command = 'chainctl auth token --audience %s'",
			aud,
		)
	}
	return e
}

// registryAuthError explains a registry refusal of the credential kind
// ("platform token", "registry token", "anonymous access") given for img.
func (c *Client) registryAuthError(img Image, kind string, status int, tok string, err error) error {
	aud := c.cfg.RegistryAudience
	fix := fmt.Sprintf("set registry_token_command = 'chainctl auth token --audience %s'", aud)
	e := &AuthError{Service: "registry", Credential: kind, Audience: aud, Status: status, Err: err}
	xt, exchanged := c.cfg.PullToken.(*ExchangeToken)
	switch {
	case kind == "anonymous access":
		e.Hint = fmt.Sprintf("anonymous tokens read only the latest and latest-dev tags of public images, not %s", img.Path())
	case kind == "platform token":
		e.Hint = "a platform token was given where a registry token is needed; " + fix
	case audienceMismatch(tok, aud) != "":
		e.Hint = audienceMismatch(tok, aud) + "; " + fix
	case status == http.StatusForbidden && exchanged:
		e.Hint = fmt.Sprintf(
			"identity %s has no pull access to %s; bind it a role that may pull (for example registry.pull) on the group",
			xt.Identity,
			img.Path(),
		)
	case status == http.StatusForbidden:
		e.Hint = fmt.Sprintf(
			"the token is not a registry token with pull access to %s (a platform token is refused here); %s",
			img.Path(),
			fix,
		)
	default:
		e.Hint = "the registry token is expired or revoked, or not a registry token; " + fix
	}
	if exchanged && kind == "registry token" {
		e.Credential = "registry token of identity " + xt.Identity
	}
	e.CredentialWide = kind != "anonymous access" &&
		(status == http.StatusUnauthorized || kind == "platform token" || audienceMismatch(tok, aud) != "")
	return e
}
