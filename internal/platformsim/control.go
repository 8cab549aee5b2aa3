package platformsim

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

// serveControl serves the /_sim/ control API. It needs no token: it exists
// for tests and demos on loopback.
func (s *Sim) serveControl(w http.ResponseWriter, r *http.Request) {
	if s.serveExternal(w, r) {
		return
	}
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
			Audience string `json:"audience"`
		}
		_ = json.NewDecoder(r.Body).Decode(&req)
		if req.Audience != "" && req.Audience != AudienceAPI && req.Audience != AudienceRegistry {
			writeError(w, s.errInvalid("audience", `must be "api" or "registry"`))
			return
		}
		tok, err := s.MintTokenFor(req.Identity, req.Audience)
		if err != nil {
			writeError(w, s.errNotFound("identity", req.Identity))
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"token": tok})
	case "POST /_sim/external-token":
		var req struct {
			Subject  string `json:"subject"`
			Audience string `json:"audience"`
			TTL      string `json:"ttl"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, s.errInvalid("body", `must be {"subject": ..., "audience": ..., "ttl": "10m"}: `+err.Error()))
			return
		}
		var ttl time.Duration
		if req.TTL != "" {
			d, err := time.ParseDuration(req.TTL)
			if err != nil {
				writeError(w, s.errInvalid("ttl", "must be a Go duration such as 10m"))
				return
			}
			ttl = d
		}
		tok, err := s.ExternalToken(req.Subject, req.Audience, ttl)
		if err != nil {
			writeError(w, s.errInvalid("subject", err.Error()))
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
	case "GET /_sim/faults":
		out := []faultJSON{}
		for _, f := range s.Faults() {
			out = append(out, toFaultJSON(f))
		}
		writeJSON(w, http.StatusOK, map[string]any{"faults": out})
	case "PUT /_sim/faults", "POST /_sim/faults":
		faults, e := s.readFaults(r)
		if e != nil {
			writeError(w, e)
			return
		}
		if r.Method == http.MethodPut {
			s.SetFaults(faults...)
		} else {
			s.AddFaults(faults...)
		}
		writeEmpty(w)
	case "DELETE /_sim/faults":
		if name := r.URL.Query().Get("name"); name != "" {
			writeJSON(w, http.StatusOK, map[string]any{"removed": s.RemoveFaults(name)})
			return
		}
		s.SetFaults()
		writeEmpty(w)
	case "PUT /_sim/delivery-faults":
		var req struct {
			DeliveryFaults
			ReorderDelay string `json:"reorderDelay"`
		}
		if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
			writeError(w, s.errInvalid("body", "must be a DeliveryFaults object: "+err.Error()))
			return
		}
		f := req.DeliveryFaults
		if req.ReorderDelay != "" {
			d, err := time.ParseDuration(req.ReorderDelay)
			if err != nil {
				writeError(w, s.errInvalid("reorderDelay", "must be a Go duration"))
				return
			}
			f.ReorderDelay = d
		}
		s.SetDeliveryFaults(f)
		writeEmpty(w)
	case "GET /_sim/deliveries":
		writeJSON(w, http.StatusOK, map[string]any{"deliveries": s.Deliveries()})
	case "PUT /_sim/rates":
		var rates Rates
		if err := json.NewDecoder(r.Body).Decode(&rates); err != nil {
			writeError(w, s.errInvalid("body", "must be a Rates object: "+err.Error()))
			return
		}
		s.SetRates(rates)
		writeEmpty(w)
	default:
		writeError(w, s.errNotFound("control route", r.Method+" "+r.URL.Path))
	}
}

// readFaults decodes {"faults": [...]} of the control API.
func (s *Sim) readFaults(r *http.Request) ([]Fault, *apiError) {
	var req struct {
		Faults []faultJSON `json:"faults"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		return nil, s.errInvalid("body", "must be {\"faults\": [...]}: "+err.Error())
	}
	faults := make([]Fault, 0, len(req.Faults))
	for i, fj := range req.Faults {
		f, err := fj.fault()
		if err != nil {
			return nil, s.errInvalid("faults["+strconv.Itoa(i)+"]", err.Error())
		}
		faults = append(faults, f)
	}
	return faults, nil
}

// faultJSON is Fault on the control API, with durations as Go duration
// strings ("250ms").
type faultJSON struct {
	Name               string  `json:"name,omitempty"`
	Pattern            string  `json:"pattern,omitempty"`
	Path               string  `json:"path,omitempty"`
	Image              string  `json:"image,omitempty"`
	Status             int     `json:"status,omitempty"`
	Latency            string  `json:"latency,omitempty"`
	LatencyJitter      string  `json:"latencyJitter,omitempty"`
	LatencyExpMean     string  `json:"latencyExpMean,omitempty"`
	RespondAfter       string  `json:"respondAfter,omitempty"`
	ErrorRate          float64 `json:"errorRate,omitempty"`
	ErrorStatuses      []int   `json:"errorStatuses,omitempty"`
	RateLimitRate      float64 `json:"rateLimitRate,omitempty"`
	RetryAfter         string  `json:"retryAfter,omitempty"`
	RetryAfterHTTPDate bool    `json:"retryAfterHttpDate,omitempty"`
	ResetRate          float64 `json:"resetRate,omitempty"`
	TruncateRate       float64 `json:"truncateRate,omitempty"`
	StallRate          float64 `json:"stallRate,omitempty"`
	Stall              string  `json:"stall,omitempty"`
	Remaining          int     `json:"remaining,omitempty"`
}

func (fj faultJSON) fault() (Fault, error) {
	f := Fault{Name: fj.Name, Pattern: fj.Pattern, Path: fj.Path, Image: fj.Image, Status: fj.Status,
		ErrorRate: fj.ErrorRate, ErrorStatuses: fj.ErrorStatuses,
		RateLimitRate: fj.RateLimitRate, RetryAfterHTTPDate: fj.RetryAfterHTTPDate,
		ResetRate: fj.ResetRate, TruncateRate: fj.TruncateRate, StallRate: fj.StallRate,
		Remaining: fj.Remaining}
	if f.Pattern == "" && f.Path == "" && f.Image == "" {
		return f, fmt.Errorf("pattern, path or image is required (pattern \"*\" matches every endpoint)")
	}
	if f.Status != 0 && (f.Status < 400 || f.Status > 599) {
		return f, fmt.Errorf("status %d is not an HTTP error status", f.Status)
	}
	for _, d := range []struct {
		name string
		v    string
		p    *time.Duration
	}{
		{"latency", fj.Latency, &f.Latency}, {"latencyJitter", fj.LatencyJitter, &f.LatencyJitter},
		{"latencyExpMean", fj.LatencyExpMean, &f.LatencyExpMean}, {"respondAfter", fj.RespondAfter, &f.RespondAfter},
		{"retryAfter", fj.RetryAfter, &f.RetryAfter},
		{"stall", fj.Stall, &f.Stall},
	} {
		if d.v == "" {
			continue
		}
		v, err := time.ParseDuration(d.v)
		if err != nil {
			return f, fmt.Errorf("%s: %w", d.name, err)
		}
		*d.p = v
	}
	return f, nil
}

func toFaultJSON(f Fault) faultJSON {
	dur := func(d time.Duration) string {
		if d == 0 {
			return ""
		}
		return d.String()
	}
	return faultJSON{
		Name:          f.Name,
		Pattern:       f.Pattern,
		Path:          f.Path,
		Image:         f.Image,
		Status:        f.Status,
		Latency:       dur(f.Latency),
		LatencyJitter: dur(f.LatencyJitter),
		LatencyExpMean: dur(
			f.LatencyExpMean,
		),
		RespondAfter:       dur(f.RespondAfter),
		ErrorRate:          f.ErrorRate,
		ErrorStatuses:      f.ErrorStatuses,
		RateLimitRate:      f.RateLimitRate,
		RetryAfter:         dur(f.RetryAfter),
		RetryAfterHTTPDate: f.RetryAfterHTTPDate,
		ResetRate:          f.ResetRate,
		TruncateRate:       f.TruncateRate,
		StallRate:          f.StallRate,
		Stall:              dur(f.Stall),
		Remaining:          f.Remaining,
	}
}
