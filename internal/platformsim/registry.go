package platformsim

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"sort"
	"strings"
)

// registryClaims is the content of a registry token. Registry tokens are
// HMAC-signed by the simulator, so none need to be stored.
type registryClaims struct {
	Audience string `json:"aud"`
	Image    string `json:"img"` // "<org>/<image>", the one image the token reads
	Anon     bool   `json:"anon,omitempty"`
	Issued   int64  `json:"iat"`
	Expires  int64  `json:"exp,omitempty"` // Unix ms of sim time; 0: never
}

const registryAudience = "registry"

func (s *Sim) signRegistryToken(c registryClaims) string {
	b, _ := json.Marshal(c)
	payload := base64.RawURLEncoding.EncodeToString(b)
	mac := hmac.New(sha256.New, s.key)
	mac.Write([]byte(payload))
	return "reg." + payload + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
}

func (s *Sim) verifyRegistryToken(tok string) (registryClaims, bool) {
	var c registryClaims
	rest, ok := strings.CutPrefix(tok, "reg.")
	if !ok {
		return c, false
	}
	payload, sig, ok := strings.Cut(rest, ".")
	if !ok {
		return c, false
	}
	mac := hmac.New(sha256.New, s.key)
	mac.Write([]byte(payload))
	want := base64.RawURLEncoding.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return c, false
	}
	b, err := base64.RawURLEncoding.DecodeString(payload)
	if err != nil || json.Unmarshal(b, &c) != nil {
		return c, false
	}
	return c, true
}

// registryError writes an error in the OCI distribution format, which is what
// registry endpoints answer (not the platform's AIP-193 body).
func (s *Sim) registryError(w http.ResponseWriter, status int, code, msg, scope string) {
	if status == http.StatusUnauthorized {
		realm := s.baseURL() + "/token"
		h := fmt.Sprintf(`Bearer realm=%q,service=%q`, realm, registryHost(s.baseURL()))
		if scope != "" {
			h += fmt.Sprintf(`,scope=%q`, scope)
		}
		w.Header().Set("WWW-Authenticate", h)
	}
	writeJSON(w, status, map[string]any{"errors": []map[string]any{{"code": code, "message": msg}}})
}

func registryHost(base string) string {
	_, h, ok := strings.Cut(base, "://")
	if !ok {
		return base
	}
	return h
}

// platformCredential finds a platform token sent either as a bearer token or
// as the password of Basic auth, the form docker credential helpers use.
func platformCredential(r *http.Request) string {
	if t := bearer(r); t != "" {
		return t
	}
	if _, pw, ok := r.BasicAuth(); ok {
		return pw
	}
	return ""
}

func (s *Sim) serveRegistryToken(w http.ResponseWriter, r *http.Request, _ route) {
	scope := r.URL.Query().Get("scope")
	repoPart, ok := strings.CutPrefix(scope, "repository:")
	if !ok {
		s.registryError(w, http.StatusBadRequest, "UNSUPPORTED", "scope must be repository:<org>/<image>:pull", "")
		return
	}
	i := strings.LastIndexByte(repoPart, ':')
	if i < 0 || !strings.Contains(strings.Split(repoPart[i+1:], ",")[0], "pull") {
		s.registryError(w, http.StatusBadRequest, "UNSUPPORTED", "scope must request pull", "")
		return
	}
	image := repoPart[:i]
	org, name, ok := strings.Cut(image, "/")
	if !ok || name == "" {
		s.registryError(w, http.StatusBadRequest, "NAME_INVALID", "scope must name <org>/<image>", "")
		return
	}
	cred := platformCredential(r)
	claims := registryClaims{Audience: registryAudience, Image: image, Issued: s.nowMs()}
	if s.opts.RegistryTokenTTL > 0 {
		claims.Expires = claims.Issued + s.opts.RegistryTokenTTL.Milliseconds()
	}
	switch {
	case cred != "":
		m, ok := s.platformToken(cred)
		if !ok {
			s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "credential not recognized", scope)
			return
		}
		// Only identities of the root group reach the organization's
		// registry (authentication rule 3).
		if org == s.opts.OrgName && m.group != s.opts.RootGroup {
			s.registryError(w, http.StatusForbidden, "DENIED", "identity is not scoped to the organization's root group", scope)
			return
		}
		if org != s.opts.OrgName && org != s.opts.PublicOrg {
			s.registryError(w, http.StatusForbidden, "DENIED", "no access to organization "+org, scope)
			return
		}
	case org == s.opts.PublicOrg:
		claims.Anon = true
	default:
		s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required for "+image, scope)
		return
	}
	tok := s.signRegistryToken(claims)
	writeJSON(w, http.StatusOK, map[string]any{
		"token": tok, "access_token": tok,
		"issued_at": fmtMs(claims.Issued),
	})
}

func (s *Sim) serveRegistryBase(w http.ResponseWriter, r *http.Request, _ route) {
	if _, ok := s.verifyRegistryToken(bearer(r)); !ok {
		s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required", "")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{})
}

const maxHistory = 1000

// serveHistory answers GET /v2/<org>/<image>/_<vendor>/history/<tag>.
func (s *Sim) serveHistory(w http.ResponseWriter, r *http.Request, _ route) {
	marker := "/_" + s.opts.Vendor + "/history/"
	imagePath, tagName, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/"), marker)
	if !ok || tagName == "" || !strings.Contains(imagePath, "/") {
		s.registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "unknown registry path", "")
		return
	}
	org, image, _ := strings.Cut(imagePath, "/")
	scope := "repository:" + imagePath + ":pull"
	tok := bearer(r)
	if tok == "" {
		s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required", scope)
		return
	}
	c, ok := s.verifyRegistryToken(tok)
	if !ok {
		// A platform token is a valid token for another audience: 403, as
		// the spec requires; anything else is simply not a credential.
		if _, isPlatform := s.platformToken(tok); isPlatform || s.isOIDCToken(tok) {
			s.registryError(w, http.StatusForbidden, "DENIED", "token audience is not the registry", scope)
			return
		}
		s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "invalid token", scope)
		return
	}
	now := s.nowMs()
	if c.Expires != 0 && now >= c.Expires {
		s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "token expired", scope)
		return
	}
	if c.Audience != registryAudience {
		s.registryError(w, http.StatusForbidden, "DENIED", "token audience is not the registry", scope)
		return
	}
	if c.Image != imagePath {
		s.registryError(w, http.StatusForbidden, "DENIED", "token is not valid for "+imagePath, scope)
		return
	}
	if c.Anon && tagName != "latest" && tagName != "latest-dev" {
		s.registryError(w, http.StatusForbidden, "DENIED", "anonymous access is limited to latest and latest-dev", scope)
		return
	}
	q := r.URL.Query()
	var start, end int64
	var hasStart, hasEnd bool
	if v := q.Get("start"); v != "" {
		ms, err := parseTime(v)
		if err != nil {
			s.registryError(w, http.StatusBadRequest, "INVALID_PARAMETER", "start must be an ISO 8601 timestamp", "")
			return
		}
		start, hasStart = ms, true
	}
	if v := q.Get("end"); v != "" {
		ms, err := parseTime(v)
		if err != nil {
			s.registryError(w, http.StatusBadRequest, "INVALID_PARAMETER", "end must be an ISO 8601 timestamp", "")
			return
		}
		end, hasEnd = ms, true
	}

	s.mu.RLock()
	hist, found := s.historyLocked(org, image, tagName)
	var out []map[string]string
	if found {
		lo, hi := 0, len(hist)
		if hasStart {
			lo = sort.Search(len(hist), func(i int) bool {
				if s.opts.StartInclusive {
					return hist[i].ms >= start
				}
				return hist[i].ms > start
			})
		}
		if hasEnd {
			hi = sort.Search(len(hist), func(i int) bool {
				if s.opts.EndInclusive {
					return hist[i].ms > end
				}
				return hist[i].ms >= end
			})
		}
		if hi < lo {
			hi = lo
		}
		if hi-lo > maxHistory {
			if hasEnd && !hasStart && s.opts.HistoryEndNewest {
				lo = hi - maxHistory
			} else {
				hi = lo + maxHistory
			}
		}
		out = make([]map[string]string, 0, hi-lo)
		for _, h := range hist[lo:hi] {
			out = append(out, map[string]string{"updateTimestamp": fmtMs(h.ms), "digest": fmtDigest(h.digest)})
		}
	}
	s.mu.RUnlock()
	if !found {
		s.registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "unknown tag "+tagName+" of "+imagePath, "")
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"history": out})
}

// historyLocked finds a tag's history by registry path: the org's own repos
// by name, or the public catalog.
func (s *Sim) historyLocked(org, image, tagName string) ([]histRec, bool) {
	if org == s.opts.OrgName {
		for _, rp := range s.repos {
			if rp.name != image || !visible(rp.uid, s.opts.RootGroup) {
				continue
			}
			for _, t := range rp.tags {
				if t.name == tagName {
					return t.history, true
				}
			}
		}
	}
	if org == s.opts.PublicOrg {
		if pi, ok := s.public[image]; ok {
			if t, ok := pi.tags[tagName]; ok {
				return t.history, true
			}
		}
	}
	return nil, false
}
