package platformsim

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"time"
)

// MintToken issues a platform bearer token. An empty identityUID gives a
// token with the organization's root-group scope; otherwise the token acts
// as that identity, scoped to the identity's parent group.
func (s *Sim) MintToken(identityUID string) (string, error) {
	var b [24]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	tok := "simtok_" + hex.EncodeToString(b[:])
	s.mu.Lock()
	defer s.mu.Unlock()
	m := mintedToken{group: s.opts.RootGroup, subject: "sim-admin"}
	if identityUID != "" {
		id, ok := s.identities[identityUID]
		if !ok {
			return "", errNoIdentity(identityUID)
		}
		m = mintedToken{group: parentOf(id.uid), identity: id.uid, subject: id.subject}
	}
	s.minted[tok] = m
	return tok, nil
}

type errNoIdentity string

func (e errNoIdentity) Error() string { return "no identity " + string(e) }

// serveControl serves the /_sim/ control API. It needs no token: it exists
// for tests and demos on loopback.
func (s *Sim) serveControl(w http.ResponseWriter, r *http.Request) {
	switch r.Method + " " + r.URL.Path {
	case "GET /_sim/clock":
		writeJSON(w, http.StatusOK, map[string]any{"now": s.now().UTC().Format(timeLayout)})
	case "POST /_sim/advance":
		var req struct {
			Duration string `json:"duration"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			req.Duration = r.URL.Query().Get("duration")
		}
		d, err := time.ParseDuration(req.Duration)
		if err != nil {
			writeError(w, s.errInvalid("duration", "must be a Go duration such as 72h or 90s"))
			return
		}
		s.Advance(d)
		writeJSON(w, http.StatusOK, map[string]any{"now": s.now().UTC().Format(timeLayout)})
	case "POST /_sim/step":
		var req struct {
			N int `json:"n"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.N <= 0 {
			req.N = 1
		}
		writeJSON(w, http.StatusOK, map[string]any{"mutations": s.Step(req.N)})
	case "POST /_sim/mutations":
		var m Mutation
		if err := json.NewDecoder(r.Body).Decode(&m); err != nil {
			writeError(w, s.errInvalid("body", "must be a Mutation object: "+err.Error()))
			return
		}
		out, err := s.Apply(m)
		if err != nil {
			writeError(w, s.newError(codeFailedPrecondition, "Precondition failed: "+err.Error()))
			return
		}
		writeJSON(w, http.StatusOK, out)
	case "GET /_sim/truth":
		writeJSON(w, http.StatusOK, s.Truth())
	case "GET /_sim/stats":
		writeJSON(w, http.StatusOK, s.Stats())
	case "DELETE /_sim/stats":
		s.ResetStats()
		writeEmpty(w)
	case "POST /_sim/tokens":
		var req struct {
			Identity string `json:"identity"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		tok, err := s.MintToken(req.Identity)
		if err != nil {
			writeError(w, s.errNotFound("identity", req.Identity))
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"token": tok})
	case "POST /_sim/populate":
		var sc Scale
		if err := json.NewDecoder(r.Body).Decode(&sc); err != nil {
			writeError(w, s.errInvalid("body", "must be a Scale object: "+err.Error()))
			return
		}
		s.Populate(sc)
		writeEmpty(w)
	default:
		writeError(w, s.errNotFound("control route", r.Method+" "+r.URL.Path))
	}
}
