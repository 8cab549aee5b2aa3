package platform

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// TokenSource supplies the platform bearer token. Invalidate is called after
// a 401 so that the next Token call fetches a fresh one.
type TokenSource interface {
	Token(ctx context.Context) (string, error)
	Invalidate()
}

// StaticToken is a token given in the configuration.
type StaticToken string

// Token implements TokenSource.
func (t StaticToken) Token(context.Context) (string, error) { return string(t), nil }

// Invalidate implements TokenSource; a static token cannot be refreshed.
func (StaticToken) Invalidate() {}

// FileToken reads the token from a file, again whenever the file changes,
// so a sidecar can rotate it.
type FileToken struct {
	Path string

	mu    sync.Mutex
	mod   time.Time
	size  int64
	token string
}

// Token implements TokenSource.
func (f *FileToken) Token(context.Context) (string, error) {
	st, err := os.Stat(f.Path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.token != "" && st.ModTime().Equal(f.mod) && st.Size() == f.size {
		return f.token, nil
	}
	b, err := os.ReadFile(f.Path)
	if err != nil {
		return "", fmt.Errorf("token file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("token file %s is empty", f.Path)
	}
	f.token, f.mod, f.size = tok, st.ModTime(), st.Size()
	return tok, nil
}

// Invalidate implements TokenSource.
func (f *FileToken) Invalidate() {
	f.mu.Lock()
	f.token = ""
	f.mu.Unlock()
}

// CommandToken runs a credential helper (through sh -c) that prints a token,
// and caches it until the JWT's exp claim (less a minute), or for DefaultTTL
// (default 5m) when the token is not a JWT, or until a 401 invalidates it.
// The helper's output never appears in errors; its stderr does, in part.
type CommandToken struct {
	Command    string
	DefaultTTL time.Duration
	Now        func() time.Time

	cache tokenCache
}

// Token implements TokenSource.
func (c *CommandToken) Token(ctx context.Context) (string, error) {
	return c.cache.get(c.Now, c.DefaultTTL, func() (string, error) {
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "sh", "-c", c.Command)
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			return "", fmt.Errorf("token command failed: %w: %s", err, excerpt(stderr.Bytes(), 200))
		}
		tok := strings.TrimSpace(string(out))
		if tok == "" {
			return "", fmt.Errorf("token command printed no token")
		}
		return tok, nil
	})
}

// Invalidate implements TokenSource.
func (c *CommandToken) Invalidate() { c.cache.invalidate() }

// DockerCredentialHelper gets the token from a Docker credential helper,
// as `docker login` does: it runs `docker-credential-<Helper> get` (found
// on PATH) with Host on its standard input and uses the Secret of the JSON
// it prints ({"ServerURL":…,"Username":…,"Secret":…}). For the vendor's
// registry the helper is "cgr" and the host "cgr.dev". The secret is cached
// like CommandToken's output: until the JWT's exp less a minute, or for
// DefaultTTL (default 5m), or until a refusal invalidates it.
type DockerCredentialHelper struct {
	Helper     string
	Host       string
	DefaultTTL time.Duration
	Now        func() time.Time

	cache tokenCache
}

// Token implements TokenSource.
func (d *DockerCredentialHelper) Token(ctx context.Context) (string, error) {
	return d.cache.get(d.Now, d.DefaultTTL, func() (string, error) { return d.run(ctx) })
}

// Invalidate implements TokenSource.
func (d *DockerCredentialHelper) Invalidate() { d.cache.invalidate() }

func (d *DockerCredentialHelper) run(ctx context.Context) (string, error) {
	name := "docker-credential-" + d.Helper
	// The helper's name becomes a command found on PATH; a separator or a
	// dot-dot would make it a path instead.
	if d.Helper == "" || strings.ContainsAny(d.Helper, "/\\ \t") || strings.Contains(d.Helper, "..") {
		return "", fmt.Errorf("credential helper name %q is not a helper name (it runs docker-credential-<name>)", d.Helper)
	}
	if d.Host == "" {
		return "", fmt.Errorf("credential helper %s: no registry host to ask for", name)
	}
	var stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, "get")
	cmd.Stdin = strings.NewReader(d.Host + "\n")
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		msg := excerpt(stderr.Bytes(), 200)
		// Helpers write their own failures ("credentials not found in
		// native keychain") to stdout; that is shown, but never anything
		// that looks like the JSON answer, which would hold the secret.
		// A single word could be a token printed before the failure, so
		// only a message (words with spaces between them) is shown.
		if o := bytes.TrimSpace(out); len(o) > 0 && o[0] != '{' && bytes.ContainsAny(o, " \t") {
			msg = strings.TrimSpace(excerpt(o, 200) + " " + msg)
		}
		return "", fmt.Errorf("credential helper %s get for %s failed: %w: %s", name, d.Host, err, msg)
	}
	var answer struct {
		Secret string `json:"Secret"`
	}
	if err := json.Unmarshal(out, &answer); err != nil {
		return "", fmt.Errorf(
			"credential helper %s get for %s: its answer is not the JSON of the credential-helper protocol",
			name,
			d.Host,
		)
	}
	tok := strings.TrimSpace(answer.Secret)
	if tok == "" {
		return "", fmt.Errorf("credential helper %s get for %s: the answer has no Secret", name, d.Host)
	}
	return tok, nil
}

// tokenCache holds one token from a helper until shortly before it expires.
type tokenCache struct {
	mu      sync.Mutex
	token   string
	expires time.Time
}

// get returns the cached token while it is fresh, else the one fetch
// returns, kept until the JWT's exp less a minute, or for ttl (default 5m)
// when it is not a JWT.
func (c *tokenCache) get(nowFn func() time.Time, ttl time.Duration, fetch func() (string, error)) (string, error) {
	now := time.Now
	if nowFn != nil {
		now = nowFn
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token != "" && now().Before(c.expires) {
		return c.token, nil
	}
	tok, err := fetch()
	if err != nil {
		return "", err
	}
	if ttl <= 0 {
		ttl = 5 * time.Minute
	}
	n := now()
	c.expires = n.Add(ttl)
	if exp, ok := jwtExpiry(tok); ok {
		c.expires = exp.Add(-time.Minute)
		if !c.expires.After(n) {
			// Helpers cache too, and may hand back a token in its last
			// minute; use it while it lasts rather than running the
			// helper on every request (an expired one earns a 401 and an
			// Invalidate soon enough).
			c.expires = exp
			if minimum := n.Add(5 * time.Second); c.expires.Before(minimum) {
				c.expires = minimum
			}
		}
	}
	c.token = tok
	return tok, nil
}

func (c *tokenCache) invalidate() {
	c.mu.Lock()
	c.token = ""
	c.mu.Unlock()
}

// claims are the JWT claims syncd reads, unverified: the issuer verifies;
// syncd only needs to know when to ask again, and which audience a refused
// token was for.
type claims struct {
	Exp int64    `json:"exp"`
	Aud audience `json:"aud"`
}

// audience is the aud claim, which is a string or a list of strings.
type audience []string

func (a *audience) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*a = audience{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return err
	}
	*a = many
	return nil
}

func jwtClaims(tok string) (claims, bool) {
	var c claims
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return c, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return c, false
	}
	if json.Unmarshal(b, &c) != nil {
		return claims{}, false
	}
	return c, true
}

// jwtExpiry reads the exp claim of a JWT.
func jwtExpiry(tok string) (time.Time, bool) {
	c, ok := jwtClaims(tok)
	if !ok || c.Exp == 0 {
		return time.Time{}, false
	}
	return time.Unix(c.Exp, 0), true
}
