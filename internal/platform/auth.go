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

	mu      sync.Mutex
	token   string
	expires time.Time
}

// Token implements TokenSource.
func (c *CommandToken) Token(ctx context.Context) (string, error) {
	now := time.Now
	if c.Now != nil {
		now = c.Now
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.token != "" && now().Before(c.expires) {
		return c.token, nil
	}
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
	ttl := c.DefaultTTL
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

// Invalidate implements TokenSource.
func (c *CommandToken) Invalidate() {
	c.mu.Lock()
	c.token = ""
	c.mu.Unlock()
}

// jwtExpiry reads the exp claim of a JWT without verifying it: the issuer
// verifies; syncd only needs to know when to ask again.
func jwtExpiry(tok string) (time.Time, bool) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return time.Time{}, false
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return time.Time{}, false
	}
	var claims struct {
		Exp int64 `json:"exp"`
	}
	if json.Unmarshal(b, &claims) != nil || claims.Exp == 0 {
		return time.Time{}, false
	}
	return time.Unix(claims.Exp, 0), true
}
