package platform_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

// countingToken hands out tokens[0] until the first Invalidate, then
// tokens[1], and so on, counting the calls.
type countingToken struct {
	mu                 sync.Mutex
	tokens             []string
	next               int
	calls, invalidates int
}

func (s *countingToken) Token(context.Context) (string, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	return s.tokens[min(s.next, len(s.tokens)-1)], nil
}

func (s *countingToken) Invalidate() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.invalidates++
	s.next++
}

func TestClient_UnauthorizedRefreshesOnce(t *testing.T) {
	const stale, fresh = "stale-token-7a1f", "fresh-token-9c2e"
	e := newEnv(t, platformsim.Scale{PublicImages: -1}, func(o *platformsim.Options) { o.Tokens = []string{fresh} })

	t.Run("SecondTokenAccepted", func(t *testing.T) {
		src := &countingToken{tokens: []string{stale, fresh}}
		c := e.client(func(cfg *platform.Config) { cfg.Token = src })
		e.sim.ResetStats()
		if err := c.Ping(ctxT(t)); err != nil {
			t.Fatalf("Ping: %v", err)
		}
		if src.invalidates != 1 || src.calls != 2 {
			t.Errorf("Invalidate called %d times, Token %d; want 1 and 2", src.invalidates, src.calls)
		}
		if got, want := e.requests("GET /ping/v2/ping"), 2; got != want {
			t.Errorf("%d pings sent, want %d", got, want)
		}
	})
	t.Run("SecondUnauthorizedIsAnError", func(t *testing.T) {
		src := &countingToken{tokens: []string{stale, "also-stale-3b4d"}}
		c := e.client(func(cfg *platform.Config) { cfg.Token = src })
		e.sim.ResetStats()
		err := c.Ping(ctxT(t))
		apiErr, ok := platform.AsError(err)
		if !ok || apiErr.Status != 401 || !platform.IsPermission(err) {
			t.Fatalf("Ping: %v, want a 401 *Error", err)
		}
		if src.invalidates != 1 || src.calls != 2 {
			t.Errorf("Invalidate called %d times, Token %d; want 1 and 2", src.invalidates, src.calls)
		}
		if got, want := e.requests("GET /ping/v2/ping"), 2; got != want {
			t.Errorf("%d pings sent, want %d", got, want)
		}
		for _, tok := range src.tokens {
			if strings.Contains(err.Error(), tok) {
				t.Errorf("error %q shows the token", err)
			}
		}
	})
}

func TestFileToken_RereadsChangedFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "token")
	write := func(tok string, mod time.Time) {
		t.Helper()
		if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	t0 := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
	src := &platform.FileToken{Path: path}
	get := func(want string) {
		t.Helper()
		got, err := src.Token(context.Background())
		if err != nil || got != want {
			t.Fatalf("Token = %q, %v; want %q", got, err, want)
		}
	}
	write("token-a", t0)
	get("token-a")
	// A rotation of the same length is seen through the new mtime.
	write("token-b", t0.Add(time.Second))
	get("token-b")
	// A rewrite that keeps size and mtime is not noticed until a 401
	// invalidates the cached token.
	write("token-c", t0.Add(time.Second))
	get("token-b")
	src.Invalidate()
	get("token-c")

	write("", t0.Add(2*time.Second))
	if _, err := src.Token(context.Background()); err == nil {
		t.Error("an empty token file gave no error")
	}
}

// fakeJWT is an unsigned JWT carrying only exp; CommandToken reads exp
// without verifying, as the issuer's signature is not its business.
func fakeJWT(exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc([]byte(`{"alg":"none"}`)) + "." + enc([]byte(fmt.Sprintf(`{"sub":"syncd","exp":%d}`, exp.Unix()))) + ".c2ln"
}

func TestCommandToken_CachesUntilExpiry(t *testing.T) {
	dir := t.TempDir()
	clk := newClock()
	jwt := fakeJWT(clk.Now().Add(10 * time.Minute))
	if err := os.WriteFile(filepath.Join(dir, "jwt"), []byte(jwt), 0o600); err != nil {
		t.Fatal(err)
	}
	runs := func() int {
		b, _ := os.ReadFile(filepath.Join(dir, "runs"))
		return strings.Count(string(b), "run")
	}
	src := &platform.CommandToken{
		Command: fmt.Sprintf("echo run >> %q; cat %q", filepath.Join(dir, "runs"), filepath.Join(dir, "jwt")),
		Now:     clk.Now,
	}
	get := func(wantRuns int) {
		t.Helper()
		got, err := src.Token(context.Background())
		if err != nil || got != jwt {
			t.Fatalf("Token = %q, %v; want the JWT", got, err)
		}
		if n := runs(); n != wantRuns {
			t.Fatalf("command ran %d times, want %d", n, wantRuns)
		}
	}
	get(1)
	get(1)
	clk.Add(8 * time.Minute) // still a minute and more before exp
	get(1)
	clk.Add(90 * time.Second) // within the last minute: ask again
	get(2)
	get(2)
	src.Invalidate() // a 401 arrived
	get(3)

	failing := &platform.CommandToken{Command: "echo secret-output; echo helper broke >&2; exit 3"}
	_, err := failing.Token(context.Background())
	if err == nil || !strings.Contains(err.Error(), "helper broke") || strings.Contains(err.Error(), "secret-output") {
		t.Errorf("failing helper: err = %v; want its stderr and not its stdout", err)
	}
}

func TestRegistry_AnonymousPublicImage(t *testing.T) {
	e := newEnv(t, platformsim.Scale{HistoryPerTag: 5, PublicImages: 1}, nil)
	// No platform token at all: public images need none.
	c := e.client(func(cfg *platform.Config) { cfg.Token = nil })
	tr := e.sim.Truth()
	var latest platformsim.TruthPublicTag
	for _, pt := range tr.PublicTags {
		if pt.Tag == "latest" {
			latest = pt
		}
	}
	got, err := c.HistorySince(ctxT(t), c.PublicImage(latest.Image), "latest", time.Time{})
	if err != nil {
		t.Fatalf("history of public %s:latest: %v", latest.Image, err)
	}
	checkHistory(t, latest.Image+":latest", got, latest.History)
	// Anonymous access stops at latest and latest-dev.
	_, err = c.HistorySince(ctxT(t), c.PublicImage(latest.Image), "1", time.Time{})
	if !platform.IsPermission(err) {
		t.Errorf("anonymous history of a version tag: err = %v, want a 403", err)
	}
}

func TestRegistry_PlatformTokenIsWrongAudience(t *testing.T) {
	e := newEnv(t, platformsim.Scale{Repos: 1, TagsPerRepo: 1, HistoryPerTag: 3, PublicImages: -1}, nil)
	tr := e.sim.Truth()
	c := e.client(func(cfg *platform.Config) { cfg.PullToken = platform.StaticToken(testToken) })
	_, err := c.HistorySince(ctxT(t), c.PrivateImage(tr.Repos[0].Name), tr.Tags[0].Name, time.Time{})
	var wrong *platform.WrongAudienceError
	if !errors.As(err, &wrong) {
		t.Fatalf("err = %v, want a *WrongAudienceError", err)
	}
	if apiErr, ok := platform.AsError(err); !ok || apiErr.Status != 403 {
		t.Errorf("err = %v, want it to carry the 403", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "audience") || strings.Contains(msg, testToken) {
		t.Errorf("error %q should name the audience problem and not show the token", msg)
	}
}

func TestRegistry_TokenCachedPerImageUntilRejected(t *testing.T) {
	e := newEnv(t, platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 3, PublicImages: -1},
		func(o *platformsim.Options) { o.RegistryTokenTTL = time.Minute })
	tr := e.sim.Truth()
	names := repoNames(tr)
	c := e.client(nil)
	read := func() {
		t.Helper()
		for _, tg := range tr.Tags {
			recs, err := c.HistorySince(ctxT(t), c.PrivateImage(names[tg.RepoUID]), tg.Name, time.Time{})
			if err != nil {
				t.Fatal(err)
			}
			checkHistory(t, tg.UID, recs, tr.History[tg.UID])
		}
	}
	read()
	read()
	if got, want := e.requests("GET /token"), 2; got != want {
		t.Errorf("%d token requests for 2 images read twice, want %d", got, want)
	}
	// The registry's tokens expire before the client's cache says so: the
	// 401 makes it fetch new ones, once per image.
	e.sim.Advance(2 * time.Minute)
	read()
	if got, want := e.requests("GET /token"), 4; got != want {
		t.Errorf("%d token requests after expiry, want %d", got, want)
	}
}
