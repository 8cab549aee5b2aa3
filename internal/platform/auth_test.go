package platform_test

import (
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
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
		// Invalidated for the one refresh, and again once refused for
		// good, so that the next call fetches afresh; fetched twice.
		if src.invalidates != 2 || src.calls != 2 {
			t.Errorf("Invalidate called %d times, Token %d; want 2 and 2", src.invalidates, src.calls)
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
	clk.Advance(8 * time.Minute) // still a minute and more before exp
	get(1)
	clk.Advance(90 * time.Second) // within the last minute: ask again
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

// installHelper puts docker-credential-<name> on PATH: a shell script that
// logs each run and the host it was asked for, then runs body.
func installHelper(t *testing.T, name, body string) (runs func() []string) {
	dir := t.TempDir()
	log := filepath.Join(dir, "runs")
	script := fmt.Sprintf("#!/bin/sh\n[ \"$1\" = get ] || exit 9\nread host\necho \"$host\" >> %q\n%s\n", log, body)
	if err := os.WriteFile(filepath.Join(dir, "docker-credential-"+name), []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	t.Setenv("PATH", dir+string(os.PathListSeparator)+os.Getenv("PATH"))
	return func() []string {
		b, _ := os.ReadFile(log)
		return strings.Fields(string(b))
	}
}

func TestDockerCredentialHelper_SecretCachedUntilExpiry(t *testing.T) {
	clk := newClock()
	jwt := jwtFor("cgr.dev", clk.Now().Add(10*time.Minute))
	runs := installHelper(
		t,
		"fake",
		fmt.Sprintf(`printf '{"ServerURL":"%%s","Username":"_token","Secret":"%s"}' "$host"`, jwt),
	)
	src := &platform.DockerCredentialHelper{Helper: "fake", Host: "cgr.dev", Now: clk.Now}
	get := func(wantRuns int) {
		t.Helper()
		got, err := src.Token(context.Background())
		if err != nil || got != jwt {
			t.Fatalf("Token = %q, %v; want the Secret", got, err)
		}
		if n := len(runs()); n != wantRuns {
			t.Fatalf("helper ran %d times, want %d", n, wantRuns)
		}
	}
	get(1)
	get(1)
	clk.Advance(8 * time.Minute)
	get(1)
	clk.Advance(90 * time.Second) // within the token's last minute
	get(2)
	src.Invalidate() // a refusal
	get(3)
	if got := runs(); got[0] != "cgr.dev" {
		t.Errorf("helper asked for %q, want the registry host on stdin", got)
	}
}

func TestDockerCredentialHelper_Failures(t *testing.T) {
	for _, tc := range []struct {
		name, body, want string
	}{
		// Helpers report their own failures on stdout.
		{"NotFound", `echo "credentials not found in native keychain"; exit 1`, "credentials not found in native keychain"},
		{"Stderr", `echo '{"Secret":"leaked-secret-1"}'; echo "keychain locked" >&2; exit 1`, "keychain locked"},
		{"NoSecret", `echo '{"ServerURL":"cgr.dev","Username":"_token"}'`, "no Secret"},
		{"NotJSON", `echo leaked-secret-2`, "not the JSON"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			installHelper(t, "broken", tc.body)
			_, err := (&platform.DockerCredentialHelper{Helper: "broken", Host: "cgr.dev"}).Token(context.Background())
			if err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), "leaked-secret") {
				t.Errorf("err = %v; want %q and no secret", err, tc.want)
			}
		})
	}
	for _, name := range []string{"", "../fake", "a/b"} {
		if _, err := (&platform.DockerCredentialHelper{Helper: name, Host: "cgr.dev"}).Token(
			context.Background(),
		); err == nil {
			t.Errorf("helper name %q accepted", name)
		}
	}
}

func TestClient_PlatformRefusalSaysWhatToDo(t *testing.T) {
	for _, tc := range []struct {
		name   string
		status int
		token  platform.TokenSource
		want   []string
	}{
		{"Unauthorized", 401, &countingToken{tokens: []string{testToken}},
			[]string{"platform API refused the platform token for audience https://console-api.test (401 Unauthorized)", "set token_command = 'chainctl auth token --audience https://console-api.test'", "Unauthenticated"}},
		{"RegistryTokenAtTheAPI", 401, platform.StaticToken(jwtFor("cgr.dev", time.Now().Add(time.Hour))),
			[]string{"the token was issued for audience cgr.dev, not https://console-api.test"}},
		{"NoToken", 401, nil, []string{"no platform token is configured"}},
		{
			"Forbidden",
			403,
			&countingToken{tokens: []string{testToken}},
			[]string{"(403 Forbidden)", "lacks permission", "bind it a role"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv, n := serve(t, tc.status, "application/json", `{"code":16,"message":"Unauthenticated"}`)
			c := plainClient(
				t,
				srv,
				func(cfg *platform.Config) { cfg.Token, cfg.APIAudience = tc.token, "https://console-api.test" },
			)
			err := c.Ping(ctxT(t))
			var ae *platform.AuthError
			if !errors.As(err, &ae) || ae.Credential != "platform token" || ae.Status != tc.status {
				t.Fatalf("err = %v, want an *AuthError for the platform token", err)
			}
			if apiErr, ok := platform.AsError(err); !ok || apiErr.Status != tc.status || !platform.IsPermission(err) {
				t.Errorf("the *Error is not in the chain of %v", err)
			}
			for _, want := range tc.want {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("message %q lacks %q", err, want)
				}
			}
			if strings.Contains(err.Error(), testToken) {
				t.Errorf("message shows the token")
			}
			// 401: one refresh, then the answer is final; 403: final at once.
			if want := map[int]int64{401: 2, 403: 1}[tc.status]; n.Load() != want {
				t.Errorf("%d requests, want %d", n.Load(), want)
			}
			// A token refused for good is dropped; one that is only not
			// allowed to do this is kept.
			if ct, ok := tc.token.(*countingToken); ok {
				if want := map[int]int{401: 2, 403: 0}[tc.status]; ct.invalidates != want {
					t.Errorf("token invalidated %d times, want %d", ct.invalidates, want)
				}
			}
		})
	}
}

func TestClient_ExchangedPlatformToken(t *testing.T) {
	clk := newClock()
	var exchanges atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/sts/exchange":
			n := exchanges.Add(1)
			fmt.Fprintf(w, `{"token":"api-token-%d","expiry":%q}`, n, clk.Now().Add(time.Hour).Format(time.RFC3339Nano))
		case "/ping/v2/ping":
			// The first token is revoked early: the 401 exchanges again.
			if r.Header.Get("Authorization") != "Bearer api-token-2" {
				w.WriteHeader(http.StatusUnauthorized)
				return
			}
			fmt.Fprint(w, `{}`)
		}
	}))
	t.Cleanup(srv.Close)
	x := &platform.ExchangeToken{STSURL: srv.URL, Identity: "org1/ident7", Audience: srv.URL,
		ExternalToken: platform.StaticToken("external-ffff"), Now: clk.Now}
	c := plainClient(t, srv, func(cfg *platform.Config) { cfg.Token = x })
	if err := c.Ping(ctxT(t)); err != nil {
		t.Fatalf("Ping: %v", err)
	}
	if got := exchanges.Load(); got != 2 {
		t.Errorf("%d exchanges, want 2 (one more after the 401)", got)
	}
}

func TestDefaultAudiences(t *testing.T) {
	if got := platform.DefaultAPIAudience("https://console-api.example.dev/"); got != "https://console-api.example.dev" {
		t.Errorf("DefaultAPIAudience = %q", got)
	}
	for in, want := range map[string]string{"https://cgr.dev": "cgr.dev", "http://127.0.0.1:5000/base": "127.0.0.1:5000", "::": ""} {
		if got := platform.DefaultRegistryAudience(in); got != want {
			t.Errorf("DefaultRegistryAudience(%q) = %q, want %q", in, got, want)
		}
	}
}
