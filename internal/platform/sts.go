package platform

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/singleflight"
)

// ExchangeToken assumes an identity: it exchanges an external OIDC token
// (a Kubernetes projected service-account token, a cloud workload token)
// at the vendor's security token service for a token of Audience, the way
// the vendor's SDK does (POST <STSURL>/sts/exchange, form fields aud and
// identity, the external token as bearer). The identity's claimMatch must
// name the external token's issuer and subject.
//
// The token is cached until shortly before its expiry (a minute, or a tenth
// of its lifetime when that is shorter) and then exchanged again, with the
// external token read afresh each time, since it rotates too. Concurrent
// callers share one exchange. Errors name the identity, the audience and
// the STS's answer, and are *AuthError when the STS refused.
type ExchangeToken struct {
	STSURL   string // the vendor's issuer, e.g. https://issuer.example.dev
	Identity string // the uid of the identity to assume
	Audience string // the audience wanted: the API base URL, or the registry host
	// ExternalToken supplies the token presented to the STS; it is
	// invalidated and read again before every exchange.
	ExternalToken TokenSource
	HTTPClient    *http.Client     // default: one with a 30s timeout that follows no redirect
	Now           func() time.Time // default: time.Now

	mu      sync.Mutex
	token   string
	renewAt time.Time
	gen     uint64 // bumped by Invalidate, so an exchange begun before it is not cached after it
	flight  singleflight.Group
}

// exchangeLifetime is what the vendor's SDK assumes when the STS gives no expiry.
const exchangeLifetime = time.Hour

// Token implements TokenSource.
func (x *ExchangeToken) Token(ctx context.Context) (string, error) {
	if tok, ok := x.cached(); ok {
		return tok, nil
	}
	tok, err := shared(ctx, &x.flight, "exchange", x.exchange)
	if err != nil && ctx.Err() != nil {
		return "", fmt.Errorf("exchange token for identity %s: %w", x.Identity, err)
	}
	return tok, err
}

// Invalidate implements TokenSource: the next Token exchanges again.
func (x *ExchangeToken) Invalidate() {
	x.mu.Lock()
	x.token = ""
	x.gen++
	x.mu.Unlock()
}

func (x *ExchangeToken) now() time.Time {
	if x.Now != nil {
		return x.Now()
	}
	return time.Now()
}

// cached returns the token while it is fresh.
func (x *ExchangeToken) cached() (string, bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	return x.token, x.token != "" && x.now().Before(x.renewAt)
}

// exchange performs one exchange and caches its token. A caller that
// found the cache empty just before an exchange ended finds the new token
// here, rather than exchanging again.
func (x *ExchangeToken) exchange(ctx context.Context) (string, error) {
	if tok, ok := x.cached(); ok {
		return tok, nil
	}
	x.mu.Lock()
	gen := x.gen
	x.mu.Unlock()
	if x.ExternalToken == nil {
		return "", x.refused(0, "no external token is configured to exchange; set identity_token_file", nil)
	}
	x.ExternalToken.Invalidate()
	ext, err := x.ExternalToken.Token(ctx)
	if err != nil {
		return "", x.refused(0, "could not read the external token to exchange", err)
	}
	tok, expiry, err := x.post(ctx, ext)
	if err != nil {
		return "", err
	}
	now := x.now()
	if expiry.IsZero() {
		expiry = now.Add(exchangeLifetime)
	}
	margin := max(min(time.Minute, expiry.Sub(now)/10), 0)
	// An expiry already past (the STS's clock ahead of ours) must not make
	// every call exchange again: the token is used for a few seconds, and
	// a refusal invalidates it sooner.
	renewAt := expiry.Add(-margin)
	if floor := now.Add(5 * time.Second); renewAt.Before(floor) {
		renewAt = floor
	}
	x.mu.Lock()
	if x.gen == gen {
		x.token, x.renewAt = tok, renewAt
	}
	x.mu.Unlock()
	return tok, nil
}

// exchangeAttempts bounds the attempts of one exchange; only an
// unavailable STS (502, 503, 504, or no connection) is asked again, as the
// vendor's SDK does.
const exchangeAttempts = 3

// post sends the exchange request, repeating it while the STS is unavailable.
func (x *ExchangeToken) post(ctx context.Context, ext string) (string, time.Time, error) {
	endpoint, err := url.JoinPath(x.STSURL, "/sts/exchange")
	if err != nil || !strings.Contains(x.STSURL, "://") {
		return "", time.Time{}, x.refused(0, fmt.Sprintf("sts_url %q is not a URL", x.STSURL), err)
	}
	form := url.Values{"aud": {x.Audience}, "identity": {x.Identity}}.Encode()
	hc := x.HTTPClient
	if hc == nil {
		// A redirect is answered, not followed, as the vendor's SDK does:
		// the external token goes to the STS and nowhere else.
		hc = &http.Client{
			Timeout:       30 * time.Second,
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		}
	}
	var lastErr error
	for attempt := range exchangeAttempts {
		if attempt > 0 {
			t := time.NewTimer(time.Duration(attempt) * 100 * time.Millisecond)
			select {
			case <-ctx.Done():
				t.Stop()
				return "", time.Time{}, fmt.Errorf(
					"exchange token for identity %s: %w (last attempt: %v)",
					x.Identity,
					ctx.Err(),
					lastErr,
				)
			case <-t.C:
			}
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodPost, endpoint, strings.NewReader(form))
		if err != nil {
			return "", time.Time{}, x.refused(0, "could not build the exchange request", err)
		}
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		req.Header.Set("Accept", "application/json")
		req.Header.Set("Authorization", "Bearer "+ext)
		resp, err := hc.Do(req)
		if err != nil {
			lastErr = x.refused(0, "the STS could not be reached; check sts_url", scrub(err))
			if isDialError(err) {
				continue
			}
			return "", time.Time{}, lastErr
		}
		body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		resp.Body.Close()
		if err != nil {
			return "", time.Time{}, x.refused(0, "the STS's answer was cut short", err)
		}
		switch resp.StatusCode {
		case http.StatusOK:
			return x.decode(body)
		case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			lastErr = x.refused(resp.StatusCode, "the STS is unavailable", stsAnswer(resp.StatusCode, body))
			continue
		}
		return "", time.Time{}, x.refused(resp.StatusCode, x.hint(resp.StatusCode), stsAnswer(resp.StatusCode, body))
	}
	return "", time.Time{}, lastErr
}

// decode reads the STS's RawToken. Its refresh token (refreshToken, or
// refresh_token) is not used: exchanging the external token again is
// simpler, and the external token is at hand anyway.
func (x *ExchangeToken) decode(body []byte) (string, time.Time, error) {
	var out struct {
		Token  string    `json:"token"`
		Expiry time.Time `json:"expiry"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return "", time.Time{}, x.refused(http.StatusOK, "the STS's answer is not a token", fmt.Errorf("decode: %w", err))
	}
	if out.Token == "" {
		return "", time.Time{}, x.refused(http.StatusOK, "the STS's answer holds no token", nil)
	}
	return out.Token, out.Expiry, nil
}

func (x *ExchangeToken) hint(status int) string {
	switch status {
	case http.StatusUnauthorized, http.StatusForbidden:
		return fmt.Sprintf(
			"the external token does not match identity %s: check that the identity's claimMatch names its issuer and subject, that its audience is the one the identity expects, and that it has not expired",
			x.Identity,
		)
	case http.StatusNotFound:
		return fmt.Sprintf("no identity %s, or sts_url is not the vendor's issuer", x.Identity)
	case http.StatusBadRequest:
		return "the STS refused the request; check identity and the audience"
	}
	return "the exchange failed"
}

func (x *ExchangeToken) refused(status int, hint string, err error) error {
	return &AuthError{Service: "STS " + x.STSURL, Credential: "identity exchange of " + x.Identity,
		Audience: x.Audience, Status: status, Hint: hint, Err: err}
}

// stsAnswer is the STS's error answer as an error: its status and message.
func stsAnswer(status int, body []byte) error {
	var s struct {
		Message string `json:"message"`
	}
	msg := excerpt(body, 200)
	if json.Unmarshal(body, &s) == nil && s.Message != "" {
		msg = s.Message
	}
	if msg == "" {
		return errors.New(http.StatusText(status))
	}
	return fmt.Errorf("%d %s: %s", status, http.StatusText(status), msg)
}
