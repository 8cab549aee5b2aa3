package platform

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"golang.org/x/sync/singleflight"
	"golang.org/x/time/rate"
)

// Config configures a Client.
type Config struct {
	BaseURL     string // platform API, e.g. https://console-api.example.com
	RegistryURL string // registry, e.g. https://cgr.example.com
	// Token is the platform API credential (audience APIAudience).
	Token TokenSource
	// PullToken, when set, is the registry credential (audience
	// RegistryAudience) for private images: from `chainctl auth token
	// --audience cgr.dev`, a Docker credential helper, or an exchange. It
	// is sent as a bearer on history requests; when the registry answers
	// with a token challenge instead, it is sent as Basic `_token:<token>`
	// to the challenge's realm for a per-image token, as registry clients
	// do. Unset, the platform token is presented at the registry's /token,
	// which a registry that checks audiences refuses (403).
	PullToken TokenSource
	// APIAudience and RegistryAudience name the audiences of the two
	// credentials in error messages; defaults DefaultAPIAudience(BaseURL)
	// and DefaultRegistryAudience(RegistryURL).
	APIAudience, RegistryAudience string
	// Organization is the organization's name in registry paths; PublicOrg
	// the one free-tier public images live under.
	Organization, PublicOrg string
	Vendor                  string // the word in the history path /_<vendor>/history/
	HTTPClient              *http.Client
	Timeout                 time.Duration // per request attempt; default 30s
	RequestsPerSecond       float64       // 0: unlimited
	// MaxInFlight bounds the requests on the wire at once, from sending
	// one to reading its answer's last byte (0: unbounded). A caller may
	// then keep more calls going than that, so that a request is ready to
	// go the moment one ends: decoding an answer, waiting for a token or
	// for the rate limiter do not hold a place.
	MaxInFlight int
	// MaxRetryTime bounds the retries of one call; default 2m.
	MaxRetryTime time.Duration
	// RetryInitialInterval is the first backoff wait (default 100ms);
	// RetryMaxInterval caps one wait (default 10s). Waits grow
	// exponentially between them, with jitter.
	RetryInitialInterval, RetryMaxInterval time.Duration
	// MaxRetryAfter caps how long one Retry-After is honoured (default
	// 1m): a server asking for longer gets its request repeated after
	// MaxRetryAfter, within MaxRetryTime.
	MaxRetryAfter time.Duration
	// MaxPages bounds one listing, as the vendor's own iterator does; default 1000.
	MaxPages int
	// HistoryLimit is the most records the history API returns per request; default 1000.
	HistoryLimit int
	Logger       *slog.Logger
	// Observe, when set, is told of every HTTP response (code 0: none came),
	// for metrics. retry says the request was a repeat.
	Observe func(endpoint string, code int, retry bool)
	Now     func() time.Time
}

// Client talks to the platform and its registry. It is safe for concurrent use.
type Client struct {
	cfg      Config
	base     *url.URL
	registry *url.URL
	limiter  *rate.Limiter
	log      *slog.Logger
	// inFlight bounds the requests on the wire, when MaxInFlight does;
	// nil otherwise.
	inFlight *places

	requests atomic.Int64
	retries  atomic.Int64
	// refused holds, by service, the credential-wide refusal of the
	// latest request that presented a credential there, until one succeeds.
	refused sync.Map
	// warnRetries limits the warnings about retries to one a minute;
	// retriesSinceWarn counts the retries each one stands for.
	warnRetries      rate.Sometimes
	retriesSinceWarn atomic.Int64
	// retrying is the request being retried now (nil since a request
	// succeeded), for "syncd status".
	retrying atomic.Pointer[Retrying]

	regMu     sync.Mutex
	regTokens map[string]registryToken
	// regFlight makes concurrent readers of one image share one /token request.
	regFlight singleflight.Group
	// challenge is the registry's token challenge, once a 401 has shown
	// one: from then on private images are read with per-image tokens
	// from its realm.
	challenge atomic.Pointer[bearerChallenge]
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
		tr := http.DefaultTransport.(*http.Transport).Clone()
		// The crawler runs several requests at once against one host; the
		// default of two idle connections per host would churn connections.
		tr.MaxIdleConnsPerHost = 32
		cfg.HTTPClient = &http.Client{Transport: tr}
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 30 * time.Second
	}
	if cfg.MaxRetryTime <= 0 {
		cfg.MaxRetryTime = 2 * time.Minute
	}
	if cfg.RetryInitialInterval <= 0 {
		cfg.RetryInitialInterval = 100 * time.Millisecond
	}
	if cfg.RetryMaxInterval <= 0 {
		cfg.RetryMaxInterval = 10 * time.Second
	}
	cfg.RetryMaxInterval = max(cfg.RetryMaxInterval, cfg.RetryInitialInterval)
	if cfg.MaxRetryAfter <= 0 {
		cfg.MaxRetryAfter = time.Minute
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
	if cfg.APIAudience == "" {
		cfg.APIAudience = DefaultAPIAudience(cfg.BaseURL)
	}
	if cfg.RegistryAudience == "" {
		cfg.RegistryAudience = DefaultRegistryAudience(registry.String())
	}
	lim := rate.NewLimiter(rate.Inf, 1)
	if cfg.RequestsPerSecond > 0 {
		lim = rate.NewLimiter(rate.Limit(cfg.RequestsPerSecond), max(1, int(cfg.RequestsPerSecond)))
	}
	c := &Client{
		cfg:         cfg,
		base:        base,
		registry:    registry,
		limiter:     lim,
		log:         cfg.Logger,
		regTokens:   make(map[string]registryToken),
		warnRetries: rate.Sometimes{First: 1, Interval: time.Minute},
	}
	if cfg.MaxInFlight > 0 {
		c.inFlight = newPlaces(cfg.MaxInFlight)
	}
	return c, nil
}

// MaxInFlight is the most requests the client has on the wire at once; 0
// when it does not bound them.
func (c *Client) MaxInFlight() int { return c.cfg.MaxInFlight }

// enter waits for a place on the wire, when MaxInFlight bounds them, and
// returns the func that gives it back (see InBackground).
func (c *Client) enter(ctx context.Context) (func(), error) {
	if c.inFlight == nil {
		return func() {}, nil
	}
	return c.inFlight.enter(ctx)
}

// Requests returns how many HTTP requests the client has sent, retries included.
func (c *Client) Requests() int64 { return c.requests.Load() }

// Retries returns how many requests were retries.
func (c *Client) Retries() int64 { return c.retries.Load() }

// ErrOutcomeUnknown marks a failed request that is not idempotent (a
// create) and failed in a way that leaves open whether the server acted on
// it: a network error after sending, a 5xx, or an unreadable success
// answer. It is not repeated, because a repeat could create the resource
// twice; the caller can look for the resource and decide.
var ErrOutcomeUnknown = errors.New(
	"the request may or may not have taken effect; not repeated, since a repeat could apply it twice",
)

// request is one logical call; do may send it several times.
type request struct {
	method string
	url    *url.URL
	body   any
	// auth returns the Authorization header value; nil for none.
	auth func(ctx context.Context) (string, error)
	// refresh is called once after a 401 (with that answer), before the
	// request is sent once more with fresh credentials; nil means a 401
	// is final.
	refresh func(*Error)
	// authErr, when set, turns a final 401 or 403 into an error that says
	// which credential was refused and what to do; tok is the token that
	// was presented, for the message to reason about, never to show.
	authErr func(status int, tok string, err error) error
	// forget, when set, is told of a final 401 or 403, to drop a refused
	// credential so that the next call fetches a fresh one rather than
	// presenting it until it expires (the user may have fixed it meanwhile).
	forget func(status int)
	// idempotent requests are retried on network errors and retryable
	// statuses; the others only where the server surely did not act.
	idempotent bool
	// service is "platform API" or "registry" for requests that present a
	// credential: a success clears that service's recorded refusal.
	service string
}

// retryable marks a failed attempt that may succeed when repeated.
type retryable struct {
	err   error
	after time.Duration // from Retry-After; 0 when absent
	// unprocessed is true when the server surely did not act on the
	// request (429, or no connection was made), so even a create may be
	// repeated.
	unprocessed bool
}

func (r *retryable) Error() string { return r.err.Error() }
func (r *retryable) Unwrap() error { return r.err }

// do sends req, retrying with exponential backoff and jitter on 429, 5xx,
// network errors and unreadable bodies, honouring Retry-After, and decodes a
// 2xx JSON body into out (when out is not nil).
func (c *Client) do(ctx context.Context, req request, out any) error {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(c.cfg.RetryInitialInterval),
		backoff.WithMaxInterval(c.cfg.RetryMaxInterval),
		// The deadline below bounds the whole call, Retry-After waits
		// included, which backoff's own elapsed-time limit does not see.
		backoff.WithMaxElapsedTime(0),
	)
	giveUp := time.Now().Add(c.cfg.MaxRetryTime)
	refreshed := false
	// maybeApplied records that an earlier attempt may have reached the
	// server, so a 404 to a repeated DELETE means it was done then.
	maybeApplied := false
	for attempt := 1; ; attempt++ {
		tok, err := c.attempt(ctx, req, out, attempt > 1)
		if err == nil {
			if req.service != "" {
				c.refused.Delete(req.service)
			}
			if attempt > 1 || c.retrying.Load() != nil {
				c.retrying.Store(nil)
			}
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("%s %s: %w", req.method, req.url.Path, ctx.Err())
		}
		if IsAuthError(err) {
			// Getting the credential failed already, and said why (a
			// refused /token or exchange, after its own refresh): there is
			// nothing to refresh or explain again.
			c.noteRefusal(req.service, err)
			return err
		}
		var apiErr *Error
		if errors.As(err, &apiErr) {
			if apiErr.Status == http.StatusUnauthorized && !refreshed && req.refresh != nil {
				req.refresh(apiErr)
				refreshed = true
				c.retries.Add(1)
				continue
			}
			if apiErr.Status == http.StatusUnauthorized || apiErr.Status == http.StatusForbidden {
				if req.forget != nil {
					req.forget(apiErr.Status)
				}
				if req.authErr != nil {
					err := req.authErr(apiErr.Status, tok, err)
					c.noteRefusal(req.service, err)
					return err
				}
			}
			if apiErr.Status == http.StatusNotFound && maybeApplied && req.method == http.MethodDelete {
				return nil
			}
		}
		var rt *retryable
		if !errors.As(err, &rt) {
			return err
		}
		if !req.idempotent && !rt.unprocessed {
			return fmt.Errorf("%w (%w)", err, ErrOutcomeUnknown)
		}
		maybeApplied = maybeApplied || !rt.unprocessed
		wait := b.NextBackOff()
		if rt.after > 0 {
			wait = max(wait, min(rt.after, c.cfg.MaxRetryAfter))
		}
		if time.Now().Add(wait).After(giveUp) {
			return fmt.Errorf("giving up after %d attempts: %w", attempt, rt.err)
		}
		c.log.Debug(
			"retrying request",
			"method",
			req.method,
			"path",
			req.url.Path,
			"attempt",
			attempt,
			"wait",
			wait,
			"err",
			rt.err,
		)
		// An operator sees retries without debug logs, but not one line
		// per request of a burst: at most one warning every warnEvery,
		// counting the retries since the last.
		c.retrying.Store(&Retrying{Endpoint: endpointOf(req.method, req.url.Path, c.cfg.Vendor), Attempt: attempt,
			NextTry: time.Now().Add(wait), Err: rt.err.Error()})
		retried := c.retriesSinceWarn.Add(1)
		c.warnRetries.Do(func() {
			c.retriesSinceWarn.Store(0)
			c.log.Warn(
				"the platform is failing requests; retrying with backoff",
				"method",
				req.method,
				"endpoint",
				endpointOf(req.method, req.url.Path, c.cfg.Vendor),
				"attempt",
				attempt,
				"next_try_in",
				wait.Round(time.Millisecond).String(),
				"retries_since_last_warning",
				retried,
				"err",
				rt.err,
			)
		})
		c.retries.Add(1)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%s %s: %w", req.method, req.url.Path, ctx.Err())
		case <-t.C:
		}
	}
}

// attempt sends req once; retry says it is not the first time. It returns
// the bearer token it presented, for do to explain a refusal with.
func (c *Client) attempt(ctx context.Context, req request, out any, retry bool) (tok string, err error) {
	err = c.send(ctx, req, out, retry, &tok)
	return tok, err
}

// send is attempt's body; it sets *tok once the credential is known.
func (c *Client) send(ctx context.Context, req request, out any, retry bool, tok *string) error {
	if err := c.limiter.Wait(ctx); err != nil {
		return fmt.Errorf("%s %s: rate limit: %w", req.method, req.url.Path, err)
	}
	var body []byte
	if req.body != nil {
		b, err := json.Marshal(req.body)
		if err != nil {
			return fmt.Errorf("%s %s: encode body: %w", req.method, req.url.Path, err)
		}
		body = b
	}
	// Credentials come first, outside the attempt's timeout: fetching a
	// registry token is a call of its own, with its own retries.
	var authz string
	if req.auth != nil {
		v, err := req.auth(ctx)
		if err != nil {
			return fmt.Errorf("%s %s: %w", req.method, req.url.Path, err)
		}
		authz = v
		*tok = presentedToken(v)
	}
	// The wait for a place on the wire is not part of the attempt's time.
	leave, err := c.enter(ctx)
	if err != nil {
		return fmt.Errorf("%s %s: wait for a place on the wire: %w", req.method, req.url.Path, err)
	}
	defer leave()
	ctx, cancel := context.WithTimeout(ctx, c.cfg.Timeout)
	defer cancel()
	var rd io.Reader
	if body != nil {
		rd = bytes.NewReader(body)
	}
	hr, err := http.NewRequestWithContext(ctx, req.method, req.url.String(), rd)
	if err != nil {
		return fmt.Errorf("%s %s: %w", req.method, req.url.Path, err)
	}
	hr.Header.Set("Accept", "application/json")
	if body != nil {
		hr.Header.Set("Content-Type", "application/json")
	}
	if authz != "" {
		hr.Header.Set("Authorization", authz)
	}
	c.requests.Add(1)
	resp, err := c.cfg.HTTPClient.Do(hr)
	if c.cfg.Observe != nil {
		code := 0
		if err == nil {
			code = resp.StatusCode
		}
		c.cfg.Observe(endpointOf(req.method, req.url.Path, c.cfg.Vendor), code, retry)
	}
	if err != nil {
		// Network errors and per-attempt timeouts: the request may or may
		// not have arrived, unless no connection was ever made.
		return &retryable{err: fmt.Errorf("%s %s: %w", req.method, req.url.Path, scrub(err)), unprocessed: isDialError(err)}
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	// The answer is read: its decoding need not hold a place on the wire.
	leave()
	// The read waiting for that place was made ready to run after this
	// goroutine, and would wait for the decoding unless the other
	// processor is idle: yielding sends it first. It filled 15.75 of 16
	// places in a latency-bound sync before, 15.98 after.
	runtime.Gosched()
	if err != nil {
		return &retryable{err: fmt.Errorf("%s %s: read body: %w", req.method, req.url.Path, err)}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		apiErr := decodeError(req.method, req.url.Path, resp.StatusCode, data)
		if resp.StatusCode == http.StatusUnauthorized {
			apiErr.challenge = resp.Header.Get("WWW-Authenticate")
		}
		switch resp.StatusCode {
		case http.StatusTooManyRequests:
			// A rate-limited request was not processed, so it may be
			// repeated whatever it is.
			return &retryable{err: apiErr, after: retryAfter(resp.Header, c.cfg.Now()), unprocessed: true}
		case http.StatusInternalServerError, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
			return &retryable{err: apiErr, after: retryAfter(resp.Header, c.cfg.Now())}
		}
		return apiErr
	}
	if out == nil || len(bytes.TrimSpace(data)) == 0 && req.method == http.MethodDelete {
		return nil
	}
	if err := json.Unmarshal(data, out); err != nil {
		// A 2xx whose body does not parse was most likely cut short on the
		// way; asking again is safe for idempotent requests.
		return &retryable{
			err: fmt.Errorf("%s %s: decode response: %w (body starts %q)", req.method, req.url.Path, err, excerpt(data, 80)),
		}
	}
	return nil
}

// isDialError reports whether err happened while connecting, before any of
// the request was sent.
func isDialError(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}

// endpointOf names the endpoint a request went to, with uids and names
// replaced by placeholders so that metrics have few labels:
// "GET /registry/v2/repos/{uid}", "GET /v2/{image}/history".
func endpointOf(method, path, vendor string) string {
	if i := strings.Index(path, "/_"+vendor+"/history/"); i >= 0 && strings.HasPrefix(path, "/v2/") {
		return method + " /v2/{image}/history"
	}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	// Platform paths are /<domain>/v2/<collection>[/<uid>...].
	if len(parts) > 3 && parts[1] == "v2" {
		return method + " /" + strings.Join(parts[:3], "/") + "/{uid}"
	}
	return method + " /" + strings.Join(parts, "/")
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
// A date is measured from the answer's own Date header when there is one,
// so a skewed local clock does not stretch or cut the wait.
func retryAfter(h http.Header, now time.Time) time.Duration {
	v := strings.TrimSpace(h.Get("Retry-After"))
	if v == "" {
		return 0
	}
	if s, err := strconv.Atoi(v); err == nil {
		return time.Duration(max(s, 0)) * time.Second
	}
	t, err := http.ParseTime(v)
	if err != nil {
		return 0
	}
	if d, err := http.ParseTime(h.Get("Date")); err == nil {
		now = d
	}
	return max(t.Sub(now), 0)
}

// presentedToken is the token inside an Authorization value: a bearer
// token, or the password of Basic credentials.
func presentedToken(authz string) string {
	scheme, v, _ := strings.Cut(authz, " ")
	if !strings.EqualFold(scheme, "Basic") {
		return v
	}
	b, err := base64.StdEncoding.DecodeString(v)
	if err != nil {
		return ""
	}
	_, pass, _ := strings.Cut(string(b), ":")
	return pass
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

// forgetRefusedPlatformToken drops the platform token after a final 401.
// A 403 says the token is good but may not do this, which a fresh one
// would not change; dropping it would only cost an exchange or a helper
// run for every forbidden request.
func (c *Client) forgetRefusedPlatformToken(status int) {
	if status == http.StatusUnauthorized {
		c.cfg.Token.Invalidate()
	}
}

func (c *Client) api(method, path string, q url.Values, body any) request {
	u := *c.base
	u.Path = strings.TrimRight(u.Path, "/") + path
	u.RawQuery = q.Encode()
	return request{
		method: method, url: &u, body: body, auth: c.platformAuth, service: servicePlatform,
		refresh:    func(*Error) { c.cfg.Token.Invalidate() },
		forget:     c.forgetRefusedPlatformToken,
		authErr:    c.platformAuthError,
		idempotent: method == http.MethodGet || method == http.MethodDelete || method == http.MethodPatch,
	}
}

// resourcePath joins a collection path and a uid. Uids are hierarchical
// ("org/repo/tag"), so their slashes stay; an empty uid or segment, or a
// dot segment, would address another resource (an empty uid turns a Get
// into a List), so those are refused before anything is sent.
func resourcePath(collection, uid string) (string, error) {
	if uid == "" {
		return "", fmt.Errorf("%s: empty uid", collection)
	}
	for _, seg := range strings.Split(uid, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return "", fmt.Errorf("%s: malformed uid %q", collection, uid)
		}
	}
	return collection + "/" + uid, nil
}

// call sends one platform API request on the resource uid under collection.
func (c *Client) call(ctx context.Context, method, collection, uid string, body, out any) error {
	p, err := resourcePath(collection, uid)
	if err != nil {
		return err
	}
	return c.do(ctx, c.api(method, p, nil, body), out)
}

// Ping checks that the platform answers and accepts the token.
func (c *Client) Ping(ctx context.Context) error {
	return c.do(ctx, c.api(http.MethodGet, "/ping/v2/ping", nil, nil), nil)
}

// RegistryURL returns the registry's address.
func (c *Client) RegistryURL() string { return c.registry.String() }

// Organization returns the organization's name in registry paths.
func (c *Client) Organization() string { return c.cfg.Organization }

// The services requests present credentials to.
const (
	servicePlatform = "platform API"
	serviceRegistry = "registry"
)

// noteRefusal records err, when it is a credential-wide refusal, as the
// state of service's credential.
func (c *Client) noteRefusal(service string, err error) {
	var ae *AuthError
	if service == "" || !errors.As(err, &ae) || !ae.CredentialWide && !strings.HasPrefix(ae.Service, "STS") {
		return
	}
	c.refused.Store(service, ae)
}

// Refusals returns, by service, the credentials the platform or the
// registry refuse now: their latest request was refused for the credential
// itself (or the credential could not be had), and none has succeeded
// since. Readiness reports them.
func (c *Client) Refusals() map[string]*AuthError {
	out := map[string]*AuthError{}
	c.refused.Range(func(k, v any) bool {
		out[k.(string)] = v.(*AuthError)
		return true
	})
	return out
}

// Retrying is a request the client is retrying with backoff.
type Retrying struct {
	Endpoint string    // method and path template, such as "GET /registry/v2/repos"
	Attempt  int       // attempts failed so far
	NextTry  time.Time // when the next attempt goes out
	Err      string    // why the last attempt failed (never a credential)
}

// Retrying returns the request being retried now, or nil when the latest
// request to end succeeded: while the platform is unreachable or failing,
// "syncd status" says so instead of showing a crawl that does nothing.
func (c *Client) Retrying() *Retrying { return c.retrying.Load() }

// RequestsPerSecond is the client's rate limit (0: none).
func (c *Client) RequestsPerSecond() float64 { return c.cfg.RequestsPerSecond }
