package platform

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"golang.org/x/sync/singleflight"
)

// Image names an image in the registry: Org is the caller's organization
// for private images, the public organization for public ones. Name is the
// repo's registry path below the organization, which for a repo below
// subgroups is the chain of names, such as "charts/cert-manager" (see
// RegistryPath).
type Image struct {
	Org, Name string
	// Anonymous asks for an anonymous registry token, which the registry
	// gives only for public images' latest and latest-dev tags.
	Anonymous bool
}

// Path is the image's path in the registry: "<org>/<name>".
func (i Image) Path() string { return i.Org + "/" + i.Name }

func (i Image) scope() string { return "repository:" + i.Path() + ":pull" }

// check refuses names that would address another path than the image's.
func (i Image) check() error {
	if i.Org == "" || strings.Contains(i.Org, "/") || i.Org == "." || i.Org == ".." {
		return fmt.Errorf("organization %q is not one path segment", i.Org)
	}
	if i.Name == "" {
		return fmt.Errorf("no image name")
	}
	for _, seg := range strings.Split(i.Name, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("image name %q has an empty or dot segment", i.Name)
		}
	}
	return nil
}

// PrivateImage names an image of the configured organization; name is the
// repo's registry path (a name, or names joined by "/").
func (c *Client) PrivateImage(name string) Image { return Image{Org: c.cfg.Organization, Name: name} }

// PublicImage names a free-tier public image, read with anonymous tokens.
func (c *Client) PublicImage(name string) Image {
	return Image{Org: c.cfg.PublicOrg, Name: name, Anonymous: true}
}

// RegistryPath returns the registry path of the repo uid below the root
// group rootGroup: the names of every uid segment below the root (each a
// group or a repo) joined by "/", as in "charts/cert-manager" for
// "<root>/<group>/<repo>". nameOf looks a uid's name up.
func RegistryPath(rootGroup, uid string, nameOf func(uid string) (string, bool)) (string, error) {
	rest, ok := strings.CutPrefix(uid, rootGroup+"/")
	if rootGroup == "" || !ok || rest == "" {
		return "", fmt.Errorf("registry path of %s: it is not below the root group %q", uid, rootGroup)
	}
	segs := strings.Split(rest, "/")
	names := make([]string, 0, len(segs))
	prefix := rootGroup
	for _, seg := range segs {
		if seg == "" {
			return "", fmt.Errorf("registry path of %s: empty uid segment", uid)
		}
		prefix += "/" + seg
		name, ok := nameOf(prefix)
		if !ok {
			return "", fmt.Errorf("registry path of %s: no name known for %s", uid, prefix)
		}
		if name == "" || strings.Contains(name, "/") {
			return "", fmt.Errorf("registry path of %s: %s has the name %q, which is not one path segment", uid, prefix, name)
		}
		names = append(names, name)
	}
	return strings.Join(names, "/"), nil
}

// The credentials a per-image registry token is asked for with.
const (
	credAnonymous = "anonymous access"
	credPlatform  = "platform token"
	credRegistry  = "registry token"
)

type registryToken struct {
	token   string
	expires time.Time
}

// registryTokenTTL is how long a registry token is reused when its answer
// does not say; registry tokens are short-lived.
const registryTokenTTL = 4 * time.Minute

// credentialFor is the credential a per-image token for img is asked for
// with: none for public images, the registry credential when there is one,
// else the platform token.
func (c *Client) credentialFor(img Image) string {
	switch {
	case img.Anonymous:
		return credAnonymous
	case c.cfg.PullToken != nil:
		return credRegistry
	}
	return credPlatform
}

// RegistryToken returns a pull token for img from the registry's token
// endpoint (the realm of its challenge, once one was seen), from the cache
// while it is fresh. Public images are asked for anonymously; private ones
// with Config.PullToken as Basic `_token:<token>`, or without one with the
// platform token as bearer. Concurrent callers for one image share one
// request.
func (c *Client) RegistryToken(ctx context.Context, img Image) (string, error) {
	if err := img.check(); err != nil {
		return "", fmt.Errorf("registry token for %s: %w", img.Path(), err)
	}
	kind := c.credentialFor(img)
	key := img.scope() + "#" + kind
	if tok, ok := c.cachedRegistryToken(key); ok {
		return tok, nil
	}
	return shared(ctx, &c.regFlight, key, func(ctx context.Context) (string, error) {
		if tok, ok := c.cachedRegistryToken(key); ok {
			return tok, nil
		}
		return c.fetchRegistryToken(ctx, img, kind, key)
	})
}

func (c *Client) cachedRegistryToken(key string) (string, bool) {
	c.regMu.Lock()
	defer c.regMu.Unlock()
	t, ok := c.regTokens[key]
	if ok && c.cfg.Now().Before(t.expires) {
		return t.token, true
	}
	return "", false
}

func (c *Client) fetchRegistryToken(ctx context.Context, img Image, kind, key string) (string, error) {
	u := *c.registry
	u.Path = strings.TrimRight(u.Path, "/") + "/token"
	q := url.Values{"scope": {img.scope()}}
	if ch := c.challenge.Load(); ch != nil {
		u = *ch.realm
		if ch.service != "" {
			q.Set("service", ch.service)
		}
	}
	u.RawQuery = q.Encode()
	req := request{method: http.MethodGet, url: &u, idempotent: true, service: credentialService(img),
		authErr: func(status int, tok string, err error) error {
			return c.registryAuthError(img, kind, status, tok, err)
		}}
	switch kind {
	case credPlatform:
		req.auth = c.platformAuth
		req.refresh = func(*Error) { c.cfg.Token.Invalidate() }
		req.forget = c.forgetRefusedPlatformToken
	case credRegistry:
		req.auth = func(ctx context.Context) (string, error) {
			tok, err := c.cfg.PullToken.Token(ctx)
			if err != nil {
				return "", fmt.Errorf("registry credential: %w", err)
			}
			return "Basic " + base64.StdEncoding.EncodeToString([]byte("_token:"+tok)), nil
		}
		req.refresh = func(*Error) { c.cfg.PullToken.Invalidate() }
		req.forget = func(status int) {
			if status == http.StatusUnauthorized {
				c.cfg.PullToken.Invalidate()
			}
		}
	}
	var out struct {
		Token       string          `json:"token"`
		AccessToken string          `json:"access_token"`
		ExpiresIn   json.RawMessage `json:"expires_in"`
	}
	if err := c.do(ctx, req, &out); err != nil {
		return "", fmt.Errorf("registry token for %s: %w", img.scope(), err)
	}
	tok := out.Token
	if tok == "" {
		tok = out.AccessToken
	}
	if tok == "" {
		return "", fmt.Errorf("registry token for %s: the answer held no token", img.scope())
	}
	now := c.cfg.Now()
	expires := now.Add(registryTokenTTL)
	if secs, ok := expiresIn(out.ExpiresIn); ok {
		expires = now.Add(time.Duration(secs)*time.Second - 10*time.Second)
	} else if exp, ok := jwtExpiry(tok); ok {
		expires = exp.Add(-10 * time.Second)
	}
	c.regMu.Lock()
	c.regTokens[key] = registryToken{token: tok, expires: expires}
	c.regMu.Unlock()
	return tok, nil
}

// expiresIn reads expires_in, a number of seconds, also when it is written
// as a string.
func expiresIn(raw json.RawMessage) (int64, bool) {
	var n json.Number
	if len(raw) == 0 || json.Unmarshal(raw, &n) != nil {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			return 0, false
		}
		n = json.Number(s)
	}
	secs, err := n.Int64()
	return secs, err == nil && secs > 0
}

func (c *Client) forgetRegistryToken(img Image, kind string) {
	c.regMu.Lock()
	delete(c.regTokens, img.scope()+"#"+kind)
	c.regMu.Unlock()
}

// WrongAudienceError reports a 403 from the registry for an image's
// history: the credential was not a pull token for this image, or was
// issued for another audience. Err explains which credential and what to
// do (an *AuthError), and holds the registry's answer.
type WrongAudienceError struct {
	Image Image
	Err   error
}

func (e *WrongAudienceError) Error() string {
	return fmt.Sprintf("tag history of %s: %v", e.Image.Path(), e.Err)
}

func (e *WrongAudienceError) Unwrap() error { return e.Err }

// pullRequest is a registry request for img carrying the credential that
// fits it: a per-image token from /token for public images and, without a
// registry credential, for private ones; else the registry credential as a
// bearer until the registry answers with a token challenge, and per-image
// tokens from the challenge's realm from then on. Either reading of the
// registry works, and the one refresh after a 401 is what switches.
func (c *Client) pullRequest(img Image) request {
	kind := c.credentialFor(img)
	req := request{
		service: credentialService(img),
		authErr: func(status int, tok string, err error) error {
			return c.registryAuthError(img, kind, status, tok, err)
		},
		// A 401 drops the credential (it expired, or was rotated); a 403
		// drops only the image's token: it is as likely this image's
		// permission as the credential, and dropping a shared credential
		// for every forbidden image would cost an exchange or a helper run
		// each, and cut the reads of every other image short.
		forget: func(status int) {
			c.forgetRegistryToken(img, kind)
			if kind == credRegistry && status == http.StatusUnauthorized {
				c.cfg.PullToken.Invalidate()
			}
		},
	}
	perImage := func(ctx context.Context) (string, error) {
		tok, err := c.RegistryToken(ctx, img)
		if err != nil {
			return "", err
		}
		return "Bearer " + tok, nil
	}
	if kind != credRegistry {
		req.auth = perImage
		req.refresh = func(*Error) { c.forgetRegistryToken(img, kind) }
		return req
	}
	req.auth = func(ctx context.Context) (string, error) {
		if c.challenge.Load() != nil {
			return perImage(ctx)
		}
		tok, err := c.cfg.PullToken.Token(ctx)
		if err != nil {
			return "", fmt.Errorf("registry credential: %w", err)
		}
		return "Bearer " + tok, nil
	}
	req.refresh = func(e *Error) {
		if ch, ok := c.parseChallenge(e.challenge); ok {
			c.challenge.Store(ch)
		} else if c.challenge.Load() == nil {
			c.cfg.PullToken.Invalidate()
		}
		c.forgetRegistryToken(img, kind)
	}
	return req
}

// bearerChallenge is a registry's WWW-Authenticate: Bearer challenge.
type bearerChallenge struct {
	realm   *url.URL
	service string
}

// parseChallenge reads a Bearer challenge whose realm is on the registry's
// own host. A realm elsewhere is not followed: the registry credential is
// sent to the registry's host only.
func (c *Client) parseChallenge(header string) (*bearerChallenge, bool) {
	scheme, rest, _ := strings.Cut(strings.TrimSpace(header), " ")
	if !strings.EqualFold(scheme, "Bearer") {
		return nil, false
	}
	params := authParams(rest)
	realm, err := c.registry.Parse(params["realm"])
	if params["realm"] == "" || err != nil {
		return nil, false
	}
	if realm.Host != c.registry.Host || (realm.Scheme != "https" && realm.Scheme != c.registry.Scheme) {
		c.log.Warn("the registry's token realm is on another host; not sending the registry credential there",
			"realm", realm.Redacted(), "registry", c.registry.Host)
		return nil, false
	}
	realm.RawQuery, realm.Fragment = "", ""
	return &bearerChallenge{realm: realm, service: params["service"]}, true
}

// authParams parses the auth-params of a challenge: key=value or
// key="quoted value" pairs separated by commas; quoted values may hold
// commas and backslash escapes.
func authParams(s string) map[string]string {
	out := make(map[string]string)
	for {
		s = strings.TrimLeft(s, " \t,")
		key, rest, ok := strings.Cut(s, "=")
		if !ok {
			return out
		}
		key = strings.ToLower(strings.TrimSpace(key))
		rest = strings.TrimLeft(rest, " \t")
		var val strings.Builder
		if strings.HasPrefix(rest, `"`) {
			i := 1
			for ; i < len(rest) && rest[i] != '"'; i++ {
				if rest[i] == '\\' && i+1 < len(rest) {
					i++
				}
				val.WriteByte(rest[i])
			}
			s = rest[min(i+1, len(rest)):]
		} else {
			v, after, _ := strings.Cut(rest, ",")
			val.WriteString(strings.TrimSpace(v))
			s = after
		}
		out[key] = val.String()
	}
}

// shared runs fetch once for all concurrent callers of key. It runs apart
// from any one caller's cancellation, since the others wait on it, within
// sharedTimeout; each caller stops waiting when its own context ends.
func shared(
	ctx context.Context,
	g *singleflight.Group,
	key string,
	fetch func(context.Context) (string, error),
) (string, error) {
	ch := g.DoChan(key, func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), sharedTimeout)
		defer cancel()
		return fetch(ctx)
	})
	select {
	case r := <-ch:
		if r.Err != nil {
			return "", r.Err
		}
		return r.Val.(string), nil
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

// sharedTimeout bounds a fetch that several callers share, so that they are
// not held by a server that never answers.
const sharedTimeout = 3 * time.Minute

// credentialService is the service whose credential a request for img
// presents; "" for anonymous reads of public images, which present none.
func credentialService(img Image) string {
	if img.Anonymous {
		return ""
	}
	return serviceRegistry
}
