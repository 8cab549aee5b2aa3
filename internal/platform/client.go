// Package platform is syncd's client for the platform API v2 and the
// registry's tag history API: typed calls, list iterators, AIP-193 errors,
// authentication, retries and the tag-history window walker.
package platform

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/time/rate"
)

// Config configures a Client.
type Config struct {
	BaseURL     string // platform API, e.g. https://console-api.example.com
	RegistryURL string // registry, e.g. https://cgr.example.com
	Token       TokenSource
	// Organization is the organization's name in registry paths; PublicOrg
	// the one free-tier public images live under.
	Organization, PublicOrg string
	Vendor                  string // the word in the history path /_<vendor>/history/
	HTTPClient              *http.Client
	Timeout                 time.Duration // per request attempt; default 30s
	RequestsPerSecond       float64       // 0: unlimited
	// MaxRetryTime bounds the retries of one call; default 2m.
	MaxRetryTime time.Duration
	// MaxPages bounds one listing, as the vendor's own iterator does; default 1000.
	MaxPages int
	// HistoryLimit is the most records the history API returns per request; default 1000.
	HistoryLimit int
	Logger       *slog.Logger
	Now          func() time.Time
}

// Client talks to the platform and its registry. It is safe for concurrent use.
type Client struct {
	cfg      Config
	base     *url.URL
	registry *url.URL
	limiter  *rate.Limiter
	log      *slog.Logger

	requests atomic.Int64
	retries  atomic.Int64

	regMu     sync.Mutex
	regTokens map[string]registryToken
}

// New returns a Client for cfg.
func New(cfg Config) (*Client, error) {
	base, err := url.Parse(strings.TrimRight(cfg.BaseURL, "/"))
	if err != nil || base.Host == "" {
		return nil, fmt.Errorf("platform base URL %q is not a URL", cfg.BaseURL)
	}
	registry, err := url.Parse(strings.TrimRight(cfg.RegistryURL, "/"))
	if err != nil || registry.Host == "" {
		return nil, fmt.Errorf("registry URL %q is not a URL", cfg.RegistryURL)
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.MaxRetryTime <= 0 {
		cfg.MaxRetryTime = 2 * time.Minute
	}
	if cfg.MaxPages <= 0 {
		cfg.MaxPages = 1000
	}
	if cfg.HistoryLimit <= 0 {
		cfg.HistoryLimit = 1000
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Token == nil {
		cfg.Token = StaticToken("")
	}
	lim := rate.NewLimiter(rate.Inf, 1)
	if cfg.RequestsPerSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(cfg.RequestsPerSecond), max(1, int(cfg.RequestsPerSecond)))
	}
	return &Client{cfg: cfg, base: base, registry: registry, limiter: lim, log: cfg.Logger, regTokens: make(map[string]registryToken)}, nil
}

// Requests returns how many HTTP requests the client has sent, retries included.
func (c *Client) Requests() int64 { return c.requests.Load() }

// Retries returns how many requests were retries.
func (c *Client) Retries() int64 { return c.retries.Load() }

// request is one logical call; do may send it several times.
type request struct {
	method string
	url    *url.URL
	body   any
	// auth returns the Authorization header value; nil for none.
	auth func(ctx context.Context) (string, error)
	// onUnauthorized is called once after a 401; if it returns true the
	// request is sent once more with fresh credentials.
	onUnauthorized func() bool
	// idempotent requests are retried on network errors and retryable statuses.
	idempotent bool
}

// errRetryable marks a failed attempt that may succeed when repeated.
type retryable struct {
	err   error
	after time.Duration // from Retry-After; 0 when absent
}

func (r *retryable) Error() string { return r.err.Error() }
func (r *retryable) Unwrap() error { return r.err }

// do sends req, retrying with exponential backoff and jitter on 429, 5xx,
// network errors and unreadable bodies, honouring Retry-After, and decodes a
// 2xx JSON body into out (when out is not nil).
func (c *Client) do(ctx context.Context, req request, out any) error {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(100*time.Millisecond),
		backoff.WithMaxInterval(10*time.Second),
		backoff.WithMaxElapsedTime(c.cfg.MaxRetryTime),
	)
	refreshed := false
	for attempt := 0; ; attempt++ {
		err := c.attempt(ctx, req, out)
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		var apiErr *Error
		if errors.As(err, &apiErr) && apiErr.Status == http.StatusUnauthorized && !refreshed && req.onUnauthorized != nil && req.onUnauthorized() {
			refreshed = true
			c.retries.Add(1)
			continue
		}
		var rt *retryable
		if !errors.As(err, &rt) || !req.idempotent {
			return err
		}
		wait := b.NextBackOff()
		if wait == backoff.Stop {
			return fmt.Errorf("giving up after %d attempts: %w", attempt+1, rt.err)
		}
		if rt.after > wait {
			wait = rt.after
		}
		c.log.Debug("retrying request", "method", req.method, "path", req.url.Path, "attempt", attempt+1, "wait", wait, "err", rt.err)
		c.retries.Add(1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
	}
}

func (c *Client) attempt(ctx context.Context, req request, out any) error {
	if err := c.limiter.Wait(ctx); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var body io.Reader
	if req.body != nil {
		b, err := json.Marshal(req.body)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, req.url.String(), body)
	if err != nil {
		return err
	}
	hr.Header.Set("Accept", "application/json")
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if req.auth != nil {
		v, err := req.auth(ctx)
		if err != nil {
			return err
		}
		if v != "" {
			hr.Header.Set("Authorization", v)
		}
	}
	c.requests.Add(1)
	resp, err := c.cfg.HTTPClient.Do(hr)
	if err != nil {
		if ctx.Err() != nil && !errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return err
		}
		// Network errors and per-attempt timeouts: the request may or may not
		// have arrived, so only idempotent requests retry (do checks).
		return &retryable{err: fmt.Errorf("%s %s: %w", req.method, req.url.Path, scrub(err))}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return &retryable{err: fmt.Errorf("%s %s: read body: %w", req.method, req.url.Path, err)}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		apiErr := decodeError(req.method, req.url.Path, resp.StatusCode, data)
		switch resp.StatusCode {
		case http.StatusTooManyRequests, http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return &retryable{err: apiErr, after: retryAfter(resp.Header.Get("Retry-After"), c.cfg.Now())}
		}
		return apiErr
	}
	if out == nil || len(bytes.TrimSpace(data)) == 0 && req.method == http.MethodDelete {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		// A 2xx whose body does not parse was most likely cut short on the
		// way; asking again is safe for idempotent requests.
		return &retryable{err: fmt.Errorf("%s %s: decode response: %w (body starts %q)", req.method, req.url.Path, err, excerpt(data, 80))}
	}
	return nil
}

// scrub removes the query from URL errors; syncd puts no secrets in queries,
// but a proxy's error may echo more than it should.
func scrub(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		if u, perr := url.Parse(ue.URL); perr == nil {
			u.RawQuery, u.User = "", nil
			return &url.Error{Op: ue.Op, URL: u.String(), Err: ue.Err}
		}
	}
	return err
}

// retryAfter parses both forms of Retry-After: delay seconds and HTTP-date.
func retryAfter(v string, now time.Time) time.Duration {
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && s >= 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(v); err == nil {
		if d := t.Sub(now); d > 0 {
			return d
		}
	}
	return 0
}

// platformAuth is the Authorization for platform API requests.
func (c *Client) platformAuth(ctx context.Context) (string, error) {
	tok, err := c.cfg.Token.Token(ctx)
	if err != nil {
		return "", fmt.Errorf("platform token: %w", err)
	}
	if tok == "" {
		return "", nil
	}
	return "Bearer " + tok, nil
}

func (c *Client) api(method, path string, q url.Values, body any) request {
	u := *c.base
	u.Path = strings.TrimRight(u.Path, "/") + path
	u.RawQuery = q.Encode()
	return request{
		method: method, url: &u, body: body, auth: c.platformAuth,
		onUnauthorized: func() bool { c.cfg.Token.Invalidate(); return true },
		idempotent:     method == http.MethodGet || method == http.MethodDelete || method == http.MethodPatch,
	}
}

// Ping checks that the platform answers and accepts the token.
func (c *Client) Ping(ctx context.Context) error {
	return c.do(ctx, c.api(http.MethodGet, "/ping/v2/ping", nil, nil), nil)
}
