package platformsim

import (
	"net/http"
	"strings"
	"sync"
)

// Stats counts requests by endpoint pattern, such as "GET /registry/v2/repos"
// or "GET /registry/v2/repos/{uid}".
type Stats struct {
	Total      int            `json:"total"`
	ByEndpoint map[string]int `json:"byEndpoint"`
	// Exchanges counts successful token exchanges at /sts/exchange.
	Exchanges int `json:"exchanges"`
}

type stats struct {
	mu        sync.Mutex
	total     int
	by        map[string]int
	exchanges int
}

func (st *stats) exchanged() {
	st.mu.Lock()
	st.exchanges++
	st.mu.Unlock()
}

func (st *stats) count(pattern string) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.by == nil {
		st.by = map[string]int{}
	}
	st.total++
	st.by[pattern]++
}

// Stats returns request counts since the simulator started or since
// ResetStats. Control API requests (/_sim/) are not counted.
func (s *Sim) Stats() Stats {
	s.stats.mu.Lock()
	defer s.stats.mu.Unlock()
	out := Stats{Total: s.stats.total, ByEndpoint: make(map[string]int, len(s.stats.by)), Exchanges: s.stats.exchanges}
	for k, v := range s.stats.by {
		out.ByEndpoint[k] = v
	}
	return out
}

// ResetStats zeroes the request counters.
func (s *Sim) ResetStats() {
	s.stats.mu.Lock()
	s.stats.total, s.stats.by, s.stats.exchanges = 0, nil, 0
	s.stats.mu.Unlock()
}

// route is a matched endpoint: its pattern (for stats and faults), the path
// parameters, and the function serving it.
type route struct {
	pattern string
	uid     string // the resource or parent uid in the path
	digest  string
	serve   handlerFunc
	auth    bool // needs a platform token
}

type handlerFunc = func(http.ResponseWriter, *http.Request, route)

// resourceRoute is a collection of resources with the usual verbs: list and
// create on the collection (create names the parent after it), get, patch
// and delete on collection/{uid}.
type resourceRoute struct {
	collection                    string
	list, get, create, patch, del handlerFunc
}

// Handler serves the platform API, the registry (token and tag history), the
// OIDC discovery documents and the /_sim/ control API on one handler.
func (s *Sim) Handler() http.Handler {
	return http.HandlerFunc(s.serveHTTP)
}

func (s *Sim) serveHTTP(w http.ResponseWriter, r *http.Request) {
	s.learnBaseURL(r)
	if strings.HasPrefix(r.URL.Path, "/_sim/") {
		s.serveControl(w, r)
		return
	}
	rt, ok := s.match(r.Method, r.URL.Path)
	if !ok {
		s.stats.count(r.Method + " (unmatched)")
		writeError(w, s.errNotFound("endpoint", r.Method+" "+r.URL.Path))
		return
	}
	s.stats.count(rt.pattern)
	s.serveWithFaults(w, r, rt.pattern, func(w http.ResponseWriter, r *http.Request) {
		if rt.auth {
			if e := s.authenticate(r); e != nil {
				writeError(w, e)
				return
			}
		}
		rt.serve(w, r, rt)
	})
}

// learnBaseURL records the simulator's own address from the first request
// when Options.BaseURL was not given.
func (s *Sim) learnBaseURL(r *http.Request) {
	if s.baseURL() != "" {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.BaseURL != "" {
		return
	}
	scheme := "http"
	if r.TLS != nil {
		scheme = "https"
	}
	s.opts.BaseURL = scheme + "://" + r.Host
}

// SetBaseURL tells the simulator its own address (for example an
// httptest.Server's URL); it is the OIDC issuer and the event source.
func (s *Sim) SetBaseURL(u string) {
	s.mu.Lock()
	s.opts.BaseURL = strings.TrimRight(u, "/")
	s.mu.Unlock()
}

func (s *Sim) baseURL() string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.opts.BaseURL
}

// bearer extracts the bearer token of a request, "" if there is none.
func bearer(r *http.Request) string {
	h := r.Header.Get("Authorization")
	if len(h) > 7 && strings.EqualFold(h[:7], "bearer ") {
		return strings.TrimSpace(h[7:])
	}
	return ""
}

// match routes a request. Uids contain slashes, so routing is by prefix and
// by known suffixes rather than by path segments.
func (s *Sim) match(method, path string) (route, bool) {
	tail := func(prefix string) (string, bool) {
		rest, ok := strings.CutPrefix(path, prefix)
		return rest, ok
	}
	switch {
	case path == "/token":
		return route{pattern: "GET /token", serve: s.serveRegistryToken}, method == http.MethodGet
	case strings.HasPrefix(path, "/v2/"):
		if method != http.MethodGet && method != http.MethodHead {
			return route{}, false
		}
		if path == "/v2/" {
			return route{pattern: "GET /v2/", serve: s.serveRegistryBase}, true
		}
		return route{pattern: "GET /v2/{image}/_" + s.opts.Vendor + "/history/{tag}", serve: s.serveHistory}, true
	case path == "/sts/exchange" && (method == http.MethodPost || method == http.MethodGet):
		return route{pattern: method + " /sts/exchange", serve: s.serveExchange}, true
	case path == "/.well-known/openid-configuration" && method == http.MethodGet:
		return route{pattern: "GET /.well-known/openid-configuration", serve: s.serveDiscovery}, true
	case path == "/.well-known/jwks.json" && method == http.MethodGet:
		return route{pattern: "GET /.well-known/jwks.json", serve: s.serveJWKS}, true
	case path == "/ping/v2/ping" && method == http.MethodGet:
		return route{pattern: "GET /ping/v2/ping", serve: s.servePing, auth: true}, true
	}

	// Repo sub-resources are recognized by their suffix.
	if rest, ok := tail("/registry/v2/repos/"); ok && method == http.MethodGet {
		if uid, ok := strings.CutSuffix(rest, "/readme"); ok {
			return route{pattern: "GET /registry/v2/repos/{uid}/readme", uid: uid, serve: s.serveReadme, auth: true}, true
		}
		if i := strings.Index(rest, "/digests/"); i >= 0 {
			uid, d := rest[:i], rest[i+len("/digests/"):]
			if dg, ok := strings.CutSuffix(d, "/architectures"); ok {
				return route{
					pattern: "GET /registry/v2/repos/{uid}/digests/{digest}/architectures",
					uid:     uid,
					digest:  dg,
					serve:   s.serveArchitectures,
					auth:    true,
				}, true
			}
			if dg, ok := strings.CutSuffix(d, "/size"); ok {
				return route{
					pattern: "GET /registry/v2/repos/{uid}/digests/{digest}/size",
					uid:     uid,
					digest:  dg,
					serve:   s.serveSize,
					auth:    true,
				}, true
			}
		}
	}

	for _, pr := range append(s.resourceRoutes(), s.iamRoutes()...) {
		if path == pr.collection {
			if method == http.MethodGet && pr.list != nil {
				return route{pattern: "GET " + pr.collection, serve: pr.list, auth: true}, true
			}
			return route{}, false
		}
		rest, ok := tail(pr.collection + "/")
		if !ok || rest == "" {
			continue
		}
		var h handlerFunc
		var pat string
		switch method {
		case http.MethodGet:
			h, pat = pr.get, "{uid}"
		case http.MethodPost:
			h, pat = pr.create, "{parent}"
		case http.MethodPatch:
			h, pat = pr.patch, "{uid}"
		case http.MethodDelete:
			h, pat = pr.del, "{uid}"
		}
		if h == nil {
			return route{}, false
		}
		return route{pattern: method + " " + pr.collection + "/" + pat, uid: rest, serve: h, auth: true}, true
	}
	return route{}, false
}
