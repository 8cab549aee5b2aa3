package platform_test

import (
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
)

const registryCredential = "registry-credential-4d2a"

// fakeRegistry is a registry's history API and token endpoint on loopback.
// History accepts a per-image token it minted for that image's scope and,
// when direct is set, the registry credential itself; anything else earns
// a 401 with a Bearer challenge naming its /token. /token mints per-image
// tokens for Basic `_token:<registryCredential>`.
type fakeRegistry struct {
	t      *testing.T
	srv    *httptest.Server
	direct bool
	// realm overrides the challenge's realm.
	realm string
	// tokenStatus, when not zero, is /token's answer to every request.
	tokenStatus int

	mu             sync.Mutex
	minted         int
	issued         map[string]string // per-image token -> scope
	tokenRequests  map[string]int    // by scope
	historyPaths   []string
	unauthorized   int // history 401s
	authorizations []string
}

func newFakeRegistry(t *testing.T, mod func(*fakeRegistry)) *fakeRegistry {
	f := &fakeRegistry{t: t, issued: map[string]string{}, tokenRequests: map[string]int{}}
	if mod != nil {
		mod(f)
	}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeRegistry) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.authorizations = append(f.authorizations, r.Header.Get("Authorization"))
	if r.URL.Path == "/token" {
		f.token(w, r)
		return
	}
	image, tag, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/"), "/_chainguard/history/")
	if !ok {
		http.NotFound(w, r)
		return
	}
	f.historyPaths = append(f.historyPaths, r.URL.Path)
	scope := "repository:" + image + ":pull"
	bearer, _ := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !(f.direct && bearer == registryCredential) && f.issued[bearer] != scope {
		realm := f.realm
		if realm == "" {
			realm = f.srv.URL + "/token"
		}
		w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm=%q,service="registry.test",scope=%q`, realm, scope))
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"authentication required"}]}`)
		f.unauthorized++
		return
	}
	fmt.Fprintf(
		w,
		`{"history":[{"updateTimestamp":"2025-03-01T12:00:00.123Z","digest":"sha256:%s"}]}`,
		strings.Repeat(tag[:1], 64),
	)
}

func (f *fakeRegistry) token(w http.ResponseWriter, r *http.Request) {
	scope := r.URL.Query().Get("scope")
	f.tokenRequests[scope]++
	if f.tokenStatus != 0 {
		w.WriteHeader(f.tokenStatus)
		fmt.Fprint(w, `{"errors":[{"code":"DENIED","message":"token audience is not the registry"}]}`)
		return
	}
	if got := r.URL.Query().Get("service"); got != "registry.test" {
		f.t.Errorf("/token service = %q, want the challenge's", got)
	}
	user, pass, ok := r.BasicAuth()
	if !ok || user != "_token" || pass != registryCredential {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"errors":[{"code":"UNAUTHORIZED","message":"bad credential"}]}`)
		return
	}
	f.minted++
	tok := fmt.Sprintf("per-image-%d", f.minted)
	f.issued[tok] = scope
	fmt.Fprintf(w, `{"token":%q,"expires_in":300}`, tok)
}

// expireAll makes every per-image token minted so far stale.
func (f *fakeRegistry) expireAll() {
	f.mu.Lock()
	clear(f.issued)
	f.mu.Unlock()
}

func (f *fakeRegistry) stats() (tokens map[string]int, unauthorized int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	tokens = make(map[string]int, len(f.tokenRequests))
	for k, v := range f.tokenRequests {
		tokens[k] = v
	}
	return tokens, f.unauthorized
}

// registryClient is a client of f for organization acme; the platform API
// is never asked in these tests.
func registryClient(t *testing.T, f *fakeRegistry, mod func(*platform.Config)) *platform.Client {
	cfg := platform.Config{BaseURL: "http://127.0.0.1:1", RegistryURL: f.srv.URL,
		Token: platform.StaticToken(testToken), PullToken: platform.StaticToken(registryCredential),
		Organization: "acme", PublicOrg: "chainguard", Vendor: "chainguard",
		RetryInitialInterval: time.Millisecond, RetryMaxInterval: 5 * time.Millisecond, MaxRetryTime: time.Second}
	if mod != nil {
		mod(&cfg)
	}
	return mustClient(t, cfg)
}

// jwtFor is an unsigned JWT for audience aud, expiring at exp.
func jwtFor(aud string, exp time.Time) string {
	enc := base64.RawURLEncoding.EncodeToString
	return enc(
		[]byte(`{"alg":"none"}`),
	) + "." + enc(
		[]byte(fmt.Sprintf(`{"sub":"syncd","aud":[%q],"exp":%d}`, aud, exp.Unix())),
	) + ".c2ln"
}

func TestRegistry_ChallengeGivesPerImageTokens(t *testing.T) {
	f := newFakeRegistry(t, nil)
	clk := newClock()
	c := registryClient(t, f, func(cfg *platform.Config) { cfg.Now = clk.Now })
	images := []string{"nginx", "charts/cert-manager"}
	scopes := []string{"repository:acme/nginx:pull", "repository:acme/charts/cert-manager:pull"}
	read := func() {
		t.Helper()
		for _, img := range images {
			for _, tag := range []string{"latest", "1.2"} {
				recs, err := c.HistorySince(ctxT(t), c.PrivateImage(img), tag, time.Time{})
				if err != nil {
					t.Fatalf("history of %s:%s: %v", img, tag, err)
				}
				if len(recs) != 1 || recs[0].Digest != "sha256:"+strings.Repeat(tag[:1], 64) {
					t.Fatalf("history of %s:%s = %+v", img, tag, recs)
				}
			}
		}
	}
	checkTokens := func(want, wantUnauthorized int) {
		t.Helper()
		tokens, unauthorized := f.stats()
		for _, s := range scopes {
			if tokens[s] != want {
				t.Errorf("%d /token requests for %s, want %d (all: %v)", tokens[s], s, want, tokens)
			}
		}
		if len(tokens) != len(scopes) {
			t.Errorf("/token asked for scopes %v, want only %v", tokens, scopes)
		}
		if unauthorized != wantUnauthorized {
			t.Errorf("%d history 401s, want %d", unauthorized, wantUnauthorized)
		}
	}
	read()
	read()
	// One 401 teaches the client the registry's challenge; from then on
	// each image is read with one per-image token, asked for once.
	checkTokens(1, 1)
	if got, want := f.historyPaths[len(
		f.historyPaths,
	)-1], "/v2/acme/charts/cert-manager/_chainguard/history/1.2"; got != want {
		t.Errorf("nested image's history at %s, want %s", got, want)
	}

	// The registry's tokens go stale before the client's cache says so:
	// one 401 per image and one new token each.
	f.expireAll()
	read()
	checkTokens(2, 3)
	// The client's clock passes the tokens' expires_in: new ones are
	// fetched without a 401.
	clk.Advance(5 * time.Minute)
	read()
	checkTokens(3, 3)
	for _, a := range f.authorizations {
		if strings.HasPrefix(a, "Basic ") && a != "Basic "+basic("_token", registryCredential) {
			t.Errorf("/token got %q, want Basic _token:<credential>", a)
		}
	}
}

func basic(user, pass string) string {
	r, _ := http.NewRequest(http.MethodGet, "/", nil)
	r.SetBasicAuth(user, pass)
	return strings.TrimPrefix(r.Header.Get("Authorization"), "Basic ")
}

func TestRegistry_CredentialAcceptedAsBearer(t *testing.T) {
	f := newFakeRegistry(t, func(f *fakeRegistry) { f.direct = true })
	c := registryClient(t, f, nil)
	for range 2 {
		if _, err := c.HistorySince(ctxT(t), c.PrivateImage("charts/cert-manager"), "latest", time.Time{}); err != nil {
			t.Fatal(err)
		}
	}
	tokens, unauthorized := f.stats()
	if len(tokens) != 0 || unauthorized != 0 {
		t.Errorf("/token asked %v, %d 401s; a registry that takes the credential needs neither", tokens, unauthorized)
	}
	if got := f.authorizations[0]; got != "Bearer "+registryCredential {
		t.Errorf("history sent Authorization %q, want the credential as bearer", got)
	}
}

func TestRegistry_RefusedCredentialSaysWhatToDo(t *testing.T) {
	t.Run("BadCredentialAfterChallenge", func(t *testing.T) {
		f := newFakeRegistry(t, nil)
		src := &countingToken{tokens: []string{"stale-credential-1", "stale-credential-2"}}
		c := registryClient(t, f, func(cfg *platform.Config) { cfg.PullToken, cfg.RegistryAudience = src, "cgr.dev" })
		_, err := c.HistorySince(ctxT(t), c.PrivateImage("nginx"), "latest", time.Time{})
		var ae *platform.AuthError
		if !errors.As(err, &ae) {
			t.Fatalf("err = %v, want an *AuthError", err)
		}
		if ae.Service != "registry" || ae.Credential != "registry token" || ae.Audience != "cgr.dev" || ae.Status != 401 {
			t.Errorf("AuthError = %+v", ae)
		}
		// Read for the history bearer, for /token, and once more after
		// /token's 401; invalidated for that retry and when refused for good.
		if src.invalidates != 2 || src.calls != 3 {
			t.Errorf("credential invalidated %d times and read %d; want 2 and 3", src.invalidates, src.calls)
		}
		msg := err.Error()
		if !strings.Contains(msg, "registry_token_command = 'chainctl auth token --audience cgr.dev'") ||
			strings.Contains(msg, "stale-credential") {
			t.Errorf("message %q: want the fix, and no token", msg)
		}
	})
	t.Run("TokenOfAnotherAudience", func(t *testing.T) {
		f := newFakeRegistry(t, func(f *fakeRegistry) { f.tokenStatus = http.StatusForbidden })
		jwt := jwtFor("https://console-api.test", time.Now().Add(time.Hour))
		src := &countingToken{tokens: []string{jwt}}
		c := registryClient(t, f, func(cfg *platform.Config) { cfg.PullToken = src })
		_, err := c.HistorySince(ctxT(t), c.PrivateImage("nginx"), "latest", time.Time{})
		var wrong *platform.WrongAudienceError
		if !errors.As(err, &wrong) || !platform.IsAuthError(err) || !platform.IsPermission(err) {
			t.Fatalf("err = %v, want a *WrongAudienceError, an AuthError and a permission error", err)
		}
		// A 403 is final at once; the credential is kept (a 403 may be one
		// image's permission, and the credential is shared by every image).
		if src.invalidates != 0 {
			t.Errorf("credential invalidated %d times, want none", src.invalidates)
		}
		host := strings.TrimPrefix(f.srv.URL, "http://")
		msg := err.Error()
		for _, want := range []string{"registry refused the registry token for audience " + host + " (403 Forbidden)",
			"the token was issued for audience https://console-api.test, not " + host, "--audience " + host, "DENIED"} {
			if !strings.Contains(msg, want) {
				t.Errorf("message %q lacks %q", msg, want)
			}
		}
		if strings.Contains(msg, jwt) {
			t.Errorf("message shows the token")
		}
	})
	t.Run("PlatformTokenFallback", func(t *testing.T) {
		f := newFakeRegistry(t, func(f *fakeRegistry) { f.tokenStatus = http.StatusForbidden })
		c := registryClient(t, f, func(cfg *platform.Config) { cfg.PullToken, cfg.RegistryAudience = nil, "cgr.dev" })
		_, err := c.HistorySince(ctxT(t), c.PrivateImage("nginx"), "latest", time.Time{})
		var wrong *platform.WrongAudienceError
		if !errors.As(err, &wrong) || wrong.Image.Name != "nginx" {
			t.Fatalf("err = %v, want a *WrongAudienceError", err)
		}
		want := "registry refused the platform token for audience cgr.dev (403 Forbidden): a platform token was given where a registry token is needed; set registry_token_command = 'chainctl auth token --audience cgr.dev'"
		if msg := err.Error(); !strings.Contains(msg, want) || strings.Contains(msg, testToken) {
			t.Errorf("message %q: want %q and no token", msg, want)
		}
		if a := f.authorizations[0]; a != "Bearer "+testToken {
			t.Errorf("/token got %q, want the platform token as bearer", a)
		}
		// A refusal is final: not asked again, and explained once.
		if tokens, _ := f.stats(); tokens["repository:acme/nginx:pull"] != 1 {
			t.Errorf("/token asked %v, want once", tokens)
		}
		if n := strings.Count(err.Error(), "registry refused"); n != 1 {
			t.Errorf("the refusal is explained %d times in %q", n, err)
		}
	})
}

func TestRegistry_RealmOnAnotherHostIsNotFollowed(t *testing.T) {
	elsewhere, hits := serve(t, 200, "application/json", `{"token":"x"}`)
	f := newFakeRegistry(t, func(f *fakeRegistry) { f.realm = elsewhere.URL + "/token" })
	c := registryClient(t, f, nil)
	_, err := c.HistorySince(ctxT(t), c.PrivateImage("nginx"), "latest", time.Time{})
	if !platform.IsAuthError(err) {
		t.Fatalf("err = %v, want an AuthError", err)
	}
	if hits.Load() != 0 {
		t.Errorf("the credential went to the realm on another host (%d requests)", hits.Load())
	}
}

func TestTagHistory_ImagePaths(t *testing.T) {
	var mu sync.Mutex
	var paths, scopes []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if r.URL.Path == "/token" {
			scopes = append(scopes, r.URL.Query().Get("scope"))
			fmt.Fprint(w, `{"token":"t"}`)
			return
		}
		paths = append(paths, r.URL.Path)
		fmt.Fprint(w, `{"history":[]}`)
	}))
	t.Cleanup(srv.Close)
	c := plainClient(t, srv, func(cfg *platform.Config) {
		cfg.Organization, cfg.PublicOrg, cfg.Vendor = "acme", "chainguard", "chainguard"
	})
	for _, img := range []platform.Image{
		c.PrivateImage("nginx"),
		c.PrivateImage("charts/cert-manager"),
		c.PublicImage("charts/redis"),
	} {
		if _, err := c.TagHistory(ctxT(t), img, "v1.2", time.Time{}, time.Time{}); err != nil {
			t.Fatalf("history of %s: %v", img.Path(), err)
		}
	}
	wantPaths := []string{
		"/v2/acme/nginx/_chainguard/history/v1.2",
		"/v2/acme/charts/cert-manager/_chainguard/history/v1.2",
		"/v2/chainguard/charts/redis/_chainguard/history/v1.2",
	}
	wantScopes := []string{
		"repository:acme/nginx:pull",
		"repository:acme/charts/cert-manager:pull",
		"repository:chainguard/charts/redis:pull",
	}
	if fmt.Sprint(paths) != fmt.Sprint(wantPaths) || fmt.Sprint(scopes) != fmt.Sprint(wantScopes) {
		t.Errorf("paths %q, scopes %q; want %q, %q", paths, scopes, wantPaths, wantScopes)
	}
	// Names that would address another path are refused before sending.
	for _, name := range []string{"charts//redis", "../x", "charts/.", ""} {
		if _, err := c.TagHistory(ctxT(t), c.PrivateImage(name), "v1", time.Time{}, time.Time{}); err == nil {
			t.Errorf("image name %q accepted", name)
		}
	}
	if _, err := c.TagHistory(ctxT(t), c.PrivateImage("nginx"), "a/b", time.Time{}, time.Time{}); err == nil {
		t.Error("tag a/b accepted")
	}
	if len(paths) != 3 {
		t.Errorf("%d history requests, want the 3 valid ones", len(paths))
	}
}

func TestRegistryPath(t *testing.T) {
	names := map[string]string{
		"root/g1": "charts", "root/g1/r1": "cert-manager", "root/r2": "nginx",
		"root/g1/g2": "team", "root/g1/g2/r3": "app", "root/bad": "a/b",
	}
	nameOf := func(uid string) (string, bool) { n, ok := names[uid]; return n, ok }
	for _, tc := range []struct {
		root, uid, want string
		err             bool
	}{
		{"root", "root/r2", "nginx", false},
		{"root", "root/g1/r1", "charts/cert-manager", false},
		{"root", "root/g1/g2/r3", "charts/team/app", false},
		{"root", "root/g1/missing", "", true},
		{"root", "root", "", true},
		{"root", "other/r2", "", true},
		{"root", "root//r2", "", true},
		{"root", "root/bad", "", true},
		{"", "root/r2", "", true},
	} {
		got, err := platform.RegistryPath(tc.root, tc.uid, nameOf)
		if got != tc.want || (err != nil) != tc.err {
			t.Errorf("RegistryPath(%q, %q) = %q, %v; want %q, error %t", tc.root, tc.uid, got, err, tc.want, tc.err)
		}
	}
}
