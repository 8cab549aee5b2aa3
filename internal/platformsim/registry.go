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

func (s *Sim) serveRegistryToken(w http.ResponseWriter, r *http.Request, _ route) {
	scope := r.URL.Query().Get("scope")
	image, ok := scopeImage(scope)
	if !ok {
		s.registryError(w, http.StatusBadRequest, "UNSUPPORTED", "scope must be repository:<org>/<image>:pull", "")
		return
	}
	org, name, ok := strings.Cut(image, "/")
	if !ok || name == "" {
		s.registryError(w, http.StatusBadRequest, "NAME_INVALID", "scope must name <org>/<image>", "")
		return
	}
	cred := registryCredential(r)
	claims := registryClaims{Audience: registryAudience, Image: image, Issued: s.nowMs()}
	if s.opts.RegistryTokenTTL > 0 {
		claims.Expires = claims.Issued + s.opts.RegistryTokenTTL.Milliseconds()
	}
	switch {
	case cred != "":
		m, ok := s.credential(cred)
		if !ok {
			s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "credential not recognized", scope)
			return
		}
		if m.expired(claims.Issued) {
			s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "credential expired at "+fmtMs(m.expiresMs), scope)
			return
		}
		if m.aud&audRegistry == 0 && s.opts.EnforceAudiences {
			s.registryError(w, http.StatusForbidden, "DENIED", s.wrongAudience(m), scope)
			return
		}
		if e := s.registryAccess(m, org); e != "" {
			s.registryError(w, http.StatusForbidden, "DENIED", e, scope)
			return
		}
		// A per-image token does not outlive the credential it came from.
		if m.expiresMs != 0 && (claims.Expires == 0 || m.expiresMs < claims.Expires) {
			claims.Expires = m.expiresMs
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

// registryImage is the image a registry request is for ("<org>/<path>"):
// the history path's, or the /token scope's; "" for other requests.
func (s *Sim) registryImage(r *http.Request) string {
	if r.URL.Path == "/token" {
		img, _ := scopeImage(r.URL.Query().Get("scope"))
		return img
	}
	if rest, ok := strings.CutPrefix(r.URL.Path, "/v2/"); ok {
		if img, _, ok := strings.Cut(rest, "/_"+s.opts.Vendor+"/history/"); ok {
			return img
		}
	}
	return ""
}

// scopeImage reads the image of a "repository:<org>/<path>:pull" scope.
func scopeImage(scope string) (string, bool) {
	repoPart, ok := strings.CutPrefix(scope, "repository:")
	if !ok {
		return "", false
	}
	i := strings.LastIndexByte(repoPart, ':')
	if i < 0 || !strings.Contains(strings.Split(repoPart[i+1:], ",")[0], "pull") {
		return "", false
	}
	return repoPart[:i], true
}

func registryCode(status int) string {
	switch status {
	case http.StatusUnauthorized:
		return "UNAUTHORIZED"
	case http.StatusNotFound:
		return "NAME_UNKNOWN"
	case http.StatusTooManyRequests:
		return "TOOMANYREQUESTS"
	case http.StatusForbidden:
		return "DENIED"
	case http.StatusBadRequest:
		return "UNSUPPORTED"
	}
	return "UNAVAILABLE"
}

// wrongAudience explains the refusal of a credential that is not for the
// registry, naming both audiences.
func (s *Sim) wrongAudience(m mintedToken) string {
	return fmt.Sprintf(
		"token audience %s is not the registry's audience %q: a platform API token was given where a registry token is needed",
		s.audienceNames(m.aud),
		s.RegistryAudience(),
	)
}

// registryAccess decides whether an unexpired credential may read an
// organization's images; "" means yes, anything else is the reason it may
// not.
func (s *Sim) registryAccess(m mintedToken, org string) string {
	switch org {
	case s.opts.OrgName:
		// Only identities of the root group reach the organization's
		// registry (authentication rule 3).
		if m.group != s.opts.RootGroup {
			return "identity is not scoped to the organization's root group"
		}
	case s.opts.PublicOrg:
	default:
		return "no access to organization " + org
	}
	return ""
}

func (s *Sim) serveRegistryBase(w http.ResponseWriter, r *http.Request, _ route) {
	tok := bearer(r)
	_, ok := s.verifyRegistryToken(tok)
	if m, isCred := s.credential(tok); isCred && m.aud&audRegistry != 0 && !m.expired(s.nowMs()) {
		ok = true
	}
	if !ok {
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
	if !s.authorizeHistory(w, r, org, imagePath, tagName, scope) {
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
	t, known := s.historyLocked(org, image, tagName)
	var resp map[string]any
	if t != nil {
		hist := t.history
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
		resp = s.renderHistory(t, hist[lo:hi])
	}
	s.mu.RUnlock()
	switch {
	case !known:
		s.registryError(w, http.StatusNotFound, "NAME_UNKNOWN", "repository "+imagePath+" is not known to the registry", "")
	case t == nil:
		s.registryError(w, http.StatusNotFound, "MANIFEST_UNKNOWN", "unknown tag "+tagName+" of "+imagePath, "")
	default:
		writeJSON(w, http.StatusOK, resp)
	}
}

// authorizeHistory admits a history request carrying either a per-image
// token from /token or a registry-audience credential; it answers the
// refusal itself.
func (s *Sim) authorizeHistory(w http.ResponseWriter, r *http.Request, org, imagePath, tagName, scope string) bool {
	tok := bearer(r)
	if tok == "" {
		s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "authentication required", scope)
		return false
	}
	if m, ok := s.credential(tok); ok {
		if m.expired(s.nowMs()) {
			s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "credential expired at "+fmtMs(m.expiresMs), scope)
			return false
		}
		// A platform token is a valid token for another audience: 403, as
		// the spec requires.
		if m.aud&audRegistry == 0 {
			s.registryError(w, http.StatusForbidden, "DENIED", s.wrongAudience(m), scope)
			return false
		}
		if e := s.registryAccess(m, org); e != "" {
			s.registryError(w, http.StatusForbidden, "DENIED", e, scope)
			return false
		}
		return true
	}
	c, ok := s.verifyRegistryToken(tok)
	if !ok {
		if s.isOIDCToken(tok) {
			s.registryError(w, http.StatusForbidden, "DENIED", "token audience is not the registry", scope)
			return false
		}
		s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "invalid token", scope)
		return false
	}
	if c.Expires != 0 && s.nowMs() >= c.Expires {
		s.registryError(w, http.StatusUnauthorized, "UNAUTHORIZED", "token expired", scope)
		return false
	}
	if c.Audience != registryAudience {
		s.registryError(w, http.StatusForbidden, "DENIED", "token audience is not the registry", scope)
		return false
	}
	if c.Image != imagePath {
		s.registryError(w, http.StatusForbidden, "DENIED", "token is not valid for "+imagePath, scope)
		return false
	}
	if c.Anon && tagName != "latest" && tagName != "latest-dev" {
		s.registryError(w, http.StatusForbidden, "DENIED", "anonymous access is limited to latest and latest-dev", scope)
		return false
	}
	return true
}

// historyLocked finds a tag by registry path: the org's own repos by their
// name-chain path, or the public catalog. known reports whether the image
// exists at all (NAME_UNKNOWN otherwise, MANIFEST_UNKNOWN for a missing tag).
func (s *Sim) historyLocked(org, image, tagName string) (t *tag, known bool) {
	if org == s.opts.OrgName {
		if rp := s.repoByPathLocked(image); rp != nil {
			known = true
			for _, t := range rp.tags {
				if t.name == tagName {
					return t, true
				}
			}
		}
	}
	if org == s.opts.PublicOrg {
		if pi, ok := s.public[image]; ok {
			return pi.tags[tagName], true
		}
	}
	return nil, known
}
