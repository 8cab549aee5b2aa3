package platformsim

import (
	"bytes"
	"context"
	"math"
	"math/rand/v2"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Fault injects failures into requests whose endpoint pattern matches.
// Rates are probabilities per request; at most one of the error outcomes
// (in field order) happens per request, latency adds to any of them.
type Fault struct {
	// Name identifies the fault for RemoveFaults; optional.
	Name string
	// Pattern is an endpoint pattern as reported by Stats, for example
	// "GET /registry/v2/tags" or "GET /registry/v2/repos/{uid}"; a trailing
	// "*" matches any pattern with that prefix, and "*" alone matches all.
	// Empty matches every endpoint when Path or Image narrows the fault,
	// and nothing otherwise.
	Pattern string
	// Path narrows the fault to requests for this URL path (a trailing "*"
	// matches any path with that prefix), such as one repo's tag history
	// "/v2/acme/charts/cert-manager/_chainguard/history/*".
	Path string
	// Image narrows the fault to registry requests for one image,
	// "<org>/<path>": its tag history and its /token scope.
	Image string
	// Status, when set, answers every matching request with this status and
	// an error body in the endpoint's format (OCI for the registry, AIP-193
	// for the platform API), without a random draw.
	Status int
	// Latency is added to every matching request; LatencyJitter adds a
	// uniform extra in [0, LatencyJitter); LatencyExpMean adds an
	// exponentially distributed extra with that mean.
	Latency, LatencyJitter, LatencyExpMean time.Duration
	// RespondAfter answers every matching request that long after it
	// arrived, the simulator's own time answering it included: a service
	// whose answers each take exactly RespondAfter (unless its work takes
	// longer), where Latency comes on top of that work. Benchmarks use it,
	// so that their floor (requests × RespondAfter ÷ connections) is one a
	// client could reach. Latency, when also set, comes before the answer
	// is made and counts toward RespondAfter.
	RespondAfter time.Duration
	// ErrorRate answers with a status drawn from ErrorStatuses (default
	// 500, 502 and 503).
	ErrorRate     float64
	ErrorStatuses []int
	// RateLimitRate answers 429 with a Retry-After of RetryAfter (default
	// 1s), in seconds or, with RetryAfterHTTPDate, as an HTTP-date.
	RateLimitRate      float64
	RetryAfter         time.Duration
	RetryAfterHTTPDate bool
	// ResetRate closes the connection without an answer (TCP reset).
	ResetRate float64
	// TruncateRate sends the status and half of the body, then closes the
	// connection short of the declared Content-Length.
	TruncateRate float64
	// StallRate sends the status and half of the body, then stalls for
	// Stall (default: until the client gives up) before closing short.
	StallRate float64
	Stall     time.Duration
	// Remaining, when positive, limits the fault to that many more matching
	// requests, after which it is removed.
	Remaining int
}

// faultSet holds the active faults and their seeded generator.
type faultSet struct {
	mu     sync.Mutex
	faults []*Fault
	rng    *rand.Rand
}

type faultOutcome int

const (
	outcomeNone faultOutcome = iota
	outcomeError
	outcomeRateLimit
	outcomeReset
	outcomeTruncate
	outcomeStall
)

type faultDecision struct {
	latency      time.Duration
	respondAfter time.Duration
	outcome      faultOutcome
	status       int
	retryAfter   time.Duration
	httpDate     bool
	stall        time.Duration
}

// SetFaults replaces the active faults. Fault decisions come from a
// generator seeded by Options.Seed, reset by every SetFaults, so a test
// sees the same sequence of failures on every run.
func (s *Sim) SetFaults(faults ...Fault) {
	fs := &s.faults
	fs.mu.Lock()
	defer fs.mu.Unlock()
	fs.faults = fs.faults[:0]
	for _, f := range faults {
		f := f
		fs.faults = append(fs.faults, &f)
	}
	fs.rng = rand.New(rand.NewPCG(uint64(s.opts.Seed), 0xfa17))
}

// Faults returns the active faults.
func (s *Sim) Faults() []Fault {
	fs := &s.faults
	fs.mu.Lock()
	defer fs.mu.Unlock()
	out := make([]Fault, len(fs.faults))
	for i, f := range fs.faults {
		out[i] = *f
	}
	return out
}

// request is what faults match a request on.
type request struct {
	pattern, path, image string
}

func (f *Fault) matches(q request) bool {
	if f.Pattern == "" && f.Path == "" && f.Image == "" {
		return false
	}
	if f.Pattern != "" && !patternMatches(f.Pattern, q.pattern) {
		return false
	}
	if f.Path != "" && !patternMatches(f.Path, q.path) {
		return false
	}
	return f.Image == "" || f.Image == q.image
}

// AddFaults adds faults to the active ones, keeping the generator's state.
func (s *Sim) AddFaults(faults ...Fault) {
	fs := &s.faults
	fs.mu.Lock()
	defer fs.mu.Unlock()
	for _, f := range faults {
		f := f
		fs.faults = append(fs.faults, &f)
	}
}

// RemoveFaults removes the active faults called name and returns how many
// there were.
func (s *Sim) RemoveFaults(name string) int {
	fs := &s.faults
	fs.mu.Lock()
	defer fs.mu.Unlock()
	kept := fs.faults[:0]
	for _, f := range fs.faults {
		if f.Name != name {
			kept = append(kept, f)
		}
	}
	n := len(fs.faults) - len(kept)
	fs.faults = kept
	return n
}

func patternMatches(p, pattern string) bool {
	if p == "*" || p == pattern {
		return true
	}
	prefix, ok := strings.CutSuffix(p, "*")
	return ok && strings.HasPrefix(pattern, prefix)
}

// decide draws what happens to one request.
func (fs *faultSet) decide(q request) faultDecision {
	fs.mu.Lock()
	defer fs.mu.Unlock()
	var d faultDecision
	kept := fs.faults[:0]
	for _, f := range fs.faults {
		if !f.matches(q) {
			kept = append(kept, f)
			continue
		}
		d.latency += f.Latency
		d.respondAfter = max(d.respondAfter, f.RespondAfter)
		if f.LatencyJitter > 0 {
			d.latency += time.Duration(fs.rng.Int64N(int64(f.LatencyJitter)))
		}
		if f.LatencyExpMean > 0 {
			d.latency += time.Duration(fs.rng.ExpFloat64() * float64(f.LatencyExpMean))
		}
		if d.outcome == outcomeNone && f.Status != 0 {
			d.outcome, d.status = outcomeError, f.Status
		}
		if d.outcome == outcomeNone {
			u := fs.rng.Float64()
			switch {
			case u < f.ErrorRate:
				d.outcome = outcomeError
				statuses := f.ErrorStatuses
				if len(statuses) == 0 {
					statuses = []int{500, 502, 503}
				}
				d.status = statuses[fs.rng.IntN(len(statuses))]
			case u < f.ErrorRate+f.RateLimitRate:
				d.outcome, d.retryAfter, d.httpDate = outcomeRateLimit, f.RetryAfter, f.RetryAfterHTTPDate
				if d.retryAfter <= 0 {
					d.retryAfter = time.Second
				}
			case u < f.ErrorRate+f.RateLimitRate+f.ResetRate:
				d.outcome = outcomeReset
			case u < f.ErrorRate+f.RateLimitRate+f.ResetRate+f.TruncateRate:
				d.outcome = outcomeTruncate
			case u < f.ErrorRate+f.RateLimitRate+f.ResetRate+f.TruncateRate+f.StallRate:
				d.outcome, d.stall = outcomeStall, f.Stall
			}
		}
		if f.Remaining > 0 {
			f.Remaining--
			if f.Remaining == 0 {
				continue
			}
		}
		kept = append(kept, f)
	}
	fs.faults = kept
	return d
}

// bufferedWriter captures a handler's answer so a fault can cut it short.
type bufferedWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func (b *bufferedWriter) Header() http.Header { return b.header }
func (b *bufferedWriter) WriteHeader(code int) {
	if b.status == 0 {
		b.status = code
	}
}
func (b *bufferedWriter) Write(p []byte) (int, error) {
	if b.status == 0 {
		b.status = http.StatusOK
	}
	return b.body.Write(p)
}

// serveWithFaults runs serve and delivers its answer, perturbed as decided.
func (s *Sim) serveWithFaults(
	w http.ResponseWriter,
	r *http.Request,
	pattern string,
	serve func(http.ResponseWriter, *http.Request),
) {
	arrived := time.Now()
	image := s.registryImage(r)
	d := s.faults.decide(request{pattern: pattern, path: r.URL.Path, image: image})
	if d.latency > 0 && !sleepCtx(r.Context(), d.latency) {
		return
	}
	if d.respondAfter > 0 {
		if d.outcome == outcomeNone {
			s.serveAt(w, r, arrived.Add(d.respondAfter), serve)
			return
		}
		if !sleepCtx(r.Context(), time.Until(arrived.Add(d.respondAfter))) {
			return
		}
	}
	switch d.outcome {
	case outcomeNone:
		serve(w, r)
		return
	case outcomeError:
		s.writeInjectedError(w, d.status, isRegistry(pattern))
		return
	case outcomeRateLimit:
		if d.httpDate {
			w.Header().Set("Retry-After", time.Now().Add(d.retryAfter).UTC().Format(http.TimeFormat))
		} else {
			w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(d.retryAfter.Seconds()))))
		}
		writeError(w, s.newError(codeResourceExhausted, "Resource exhausted: request rate limit exceeded"))
		return
	case outcomeReset:
		resetConn(w)
		return
	}
	bw := &bufferedWriter{header: http.Header{}}
	serve(bw, r)
	for k, v := range bw.header {
		w.Header()[k] = v
	}
	body := bw.body.Bytes()
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	if bw.status == 0 {
		bw.status = http.StatusOK
	}
	w.WriteHeader(bw.status)
	_, _ = w.Write(body[:len(body)/2])
	if f, ok := w.(http.Flusher); ok {
		f.Flush()
	}
	if d.outcome == outcomeStall {
		if d.stall > 0 {
			sleepCtx(r.Context(), d.stall)
		} else {
			<-r.Context().Done()
		}
	}
	// Returning short of the declared Content-Length makes the server close
	// the connection: the client sees an unexpected EOF.
}

// serveAt makes serve's answer at once and sends it at the time given.
func (s *Sim) serveAt(
	w http.ResponseWriter,
	r *http.Request,
	at time.Time,
	serve func(http.ResponseWriter, *http.Request),
) {
	bw := &bufferedWriter{header: http.Header{}}
	serve(bw, r)
	if !sleepCtx(r.Context(), time.Until(at)) {
		return
	}
	for k, v := range bw.header {
		w.Header()[k] = v
	}
	if bw.status == 0 {
		bw.status = http.StatusOK
	}
	w.WriteHeader(bw.status)
	_, _ = w.Write(bw.body.Bytes())
}

// isRegistry reports whether an endpoint pattern is the registry's, which
// answers errors in the OCI format.
func isRegistry(pattern string) bool {
	return pattern == "GET /token" || strings.HasPrefix(pattern, "GET /v2/")
}

// writeInjectedError answers an injected failure the way the endpoint
// would: gateways' HTML for 502 and 504, otherwise the registry's OCI body
// or the platform's AIP-193 body with the code matching the status.
func (s *Sim) writeInjectedError(w http.ResponseWriter, status int, registry bool) {
	switch {
	case status == http.StatusBadGateway || status == http.StatusGatewayTimeout:
		// Gateways in front of the API answer in HTML, not AIP-193.
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
		w.WriteHeader(status)
		_, _ = w.Write(
			[]byte("<html><body><h1>" + strconv.Itoa(status) + " " + http.StatusText(status) + "</h1></body></html>\n"),
		)
	case registry:
		s.registryError(w, status, registryCode(status), "injected failure: "+http.StatusText(status), "")
	case status == http.StatusServiceUnavailable:
		writeError(w, s.newError(codeUnavailable, "Unavailable: the service is temporarily unavailable"))
	default:
		code := codeOfStatus(status)
		e := s.newError(code, reasonText(code)+": injected failure")
		e.status = status
		writeError(w, e)
	}
}

// codeOfStatus is the gRPC code a gateway status stands for.
func codeOfStatus(status int) int {
	switch status {
	case http.StatusBadRequest:
		return codeInvalidArgument
	case http.StatusUnauthorized:
		return codeUnauthenticated
	case http.StatusForbidden:
		return codePermissionDenied
	case http.StatusNotFound:
		return codeNotFound
	case http.StatusConflict:
		return codeAlreadyExists
	case http.StatusTooManyRequests:
		return codeResourceExhausted
	}
	return codeInternal
}

// reasonText spells a code the way messages begin ("Not found: ...").
func reasonText(code int) string {
	r := strings.ReplaceAll(strings.ToLower(reasonOf(code)), "_", " ")
	return strings.ToUpper(r[:1]) + r[1:]
}

// resetConn drops the connection under the response, with an RST where the
// transport allows it.
func resetConn(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tc, ok := conn.(*net.TCPConn); ok {
		_ = tc.SetLinger(0)
	}
	_ = conn.Close()
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
