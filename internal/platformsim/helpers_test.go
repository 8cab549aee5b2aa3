package platformsim_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
)

const testToken = "test-platform-token"

// fakeClock is a manual clock; the simulator adds its own Advance offset.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// env is a simulator served over real loopback HTTP.
type env struct {
	tb  testing.TB
	sim *platformsim.Sim
	srv *httptest.Server
}

func baseOptions() platformsim.Options {
	clk := &fakeClock{t: time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)}
	return platformsim.Options{Seed: 7, Tokens: []string{testToken}, Clock: clk.Now, AllowHTTPSinks: true}
}

// newEnv starts a populated simulator; mod adjusts the options first.
func newEnv(tb testing.TB, sc platformsim.Scale, mod func(*platformsim.Options)) *env {
	tb.Helper()
	opts := baseOptions()
	if mod != nil {
		mod(&opts)
	}
	sim := platformsim.New(opts)
	sim.Populate(sc)
	srv := httptest.NewServer(sim.Handler())
	sim.SetBaseURL(srv.URL)
	tb.Cleanup(func() {
		srv.Close()
		sim.Close()

	})
	return &env{tb: tb, sim: sim, srv: srv}
}

func smallScale() platformsim.Scale {
	return platformsim.Scale{Repos: 12, TagsPerRepo: 6, HistoryPerTag: 4, Advisories: 30}
}

// resp is a decoded HTTP answer.
type resp struct {
	status int
	header http.Header
	raw    []byte
	body   map[string]any
}

// do sends a request with an optional bearer token and JSON body.
func (e *env) do(method, path, token string, body any) resp {
	e.tb.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			e.tb.Fatal(err)
		}
		rd = strings.NewReader(string(b))
	}
	req, err := http.NewRequest(method, e.srv.URL+path, rd)
	if err != nil {
		e.tb.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	hr, err := e.srv.Client().Do(req)
	if err != nil {
		e.tb.Fatalf("%s %s: %v", method, path, err)
	}
	defer hr.Body.Close()
	raw, err := io.ReadAll(hr.Body)
	if err != nil {
		e.tb.Fatalf("%s %s: read body: %v", method, path, err)
	}
	r := resp{status: hr.StatusCode, header: hr.Header, raw: raw}
	if len(raw) > 0 && strings.HasPrefix(hr.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			e.tb.Fatalf("%s %s: decode %q: %v", method, path, raw, err)
		}
	}
	return r
}

func (e *env) get(path string) resp { return e.do(http.MethodGet, path, testToken, nil) }

func (e *env) mustStatus(r resp, want int) {
	e.tb.Helper()
	if r.status != want {
		e.tb.Fatalf("status=%d, want %d; body %s", r.status, want, r.raw)
	}
}

// items returns the objects of a list response's plural member.
func items(r resp, plural string) []map[string]any {
	arr, _ := r.body[plural].([]any)
	out := make([]map[string]any, 0, len(arr))
	for _, v := range arr {
		out = append(out, v.(map[string]any))
	}
	return out
}

func str(m map[string]any, k string) string {
	s, _ := m[k].(string)
	return s
}

// listAll follows nextPageToken from a first query to the end.
func (e *env) listAll(path string, q url.Values, plural string) []map[string]any {
	e.tb.Helper()
	var all []map[string]any
	for pages := 0; ; pages++ {
		if pages > 1000 {
			e.tb.Fatal("listing did not end")
		}
		r := e.get(path + "?" + q.Encode())
		e.mustStatus(r, http.StatusOK)
		all = append(all, items(r, plural)...)
		tok := str(r.body, "nextPageToken")
		if tok == "" {
			return all
		}
		q.Set("page_token", tok)
	}
}

// detail finds the error detail whose @type ends with name.
func detail(r resp, name string) map[string]any {
	ds, _ := r.body["details"].([]any)
	for _, d := range ds {
		m := d.(map[string]any)
		if strings.HasSuffix(str(m, "@type"), "."+name) {
			return m
		}
	}
	return nil
}

// testCase is one named conformance case run against its own simulator.
type testCase struct {
	name  string
	scale *platformsim.Scale
	opts  func(*platformsim.Options)
	run   func(t *testing.T, e *env)
}

func runCases(t *testing.T, cases []testCase) {
	t.Helper()
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			sc := smallScale()
			if c.scale != nil {
				sc = *c.scale
			}
			c.run(t, newEnv(t, sc, c.opts))
		})
	}
}

// rawDo sends a request and returns the transport outcome unchecked, for
// fault cases where the transport is expected to fail.
func (e *env) rawDo(method, path, token string) (int, []byte, error) {
	req, err := http.NewRequest(method, e.srv.URL+path, nil)
	if err != nil {
		return 0, nil, err
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	hr, err := e.srv.Client().Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer hr.Body.Close()
	b, err := io.ReadAll(hr.Body)
	return hr.StatusCode, b, err
}

// someTag returns a tag of the org with its repo's name.
func (e *env) someTag(name string) (platformsim.TruthTag, string) {
	e.tb.Helper()
	truth := e.sim.Truth()
	names := map[string]string{}
	for _, r := range truth.Repos {
		names[r.UID] = r.Name
	}
	for _, tg := range truth.Tags {
		if name == "" || tg.Name == name {
			return tg, names[tg.RepoUID]
		}
	}
	e.tb.Fatalf("no tag named %q", name)
	return platformsim.TruthTag{}, ""
}

// history reads a tag history with a registry token for the image.
func (e *env) history(image, tag, token, query string) resp {
	e.tb.Helper()
	p := "/v2/" + image + "/_chainguard/history/" + tag
	if query != "" {
		p += "?" + query
	}
	return e.do(http.MethodGet, p, token, nil)
}

func historyOf(r resp) []map[string]any { return items(r, "history") }

// registryToken fetches a registry token for org/image, with a platform
// token or anonymously ("").
func (e *env) registryToken(image, platformToken string) string {
	e.tb.Helper()
	r := e.do(http.MethodGet, "/token?scope="+url.QueryEscape("repository:"+image+":pull"), platformToken, nil)
	e.mustStatus(r, http.StatusOK)
	return str(r.body, "token")
}
