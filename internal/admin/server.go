package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/robfig/cron/v3"
)

// ReadinessCheck is one readiness condition; nil means fine.
type ReadinessCheck struct {
	Name string
	Run  func(ctx context.Context) error
	// Phase, when set, names the readiness phase the check stands for in
	// /readyz's "phases": current (the listings are in the mirror) or
	// history (every tag's history is too).
	Phase string
	// Deferred: the check counts toward /readyz's status only when the
	// request asks for its phase (?phase=history); otherwise a failure is
	// reported under "pending" and the status stays 200.
	Deferred bool
}

// Freshness tracks when each scheduled job last succeeded, so readiness can
// say the mirror is stale.
type Freshness struct {
	mu     sync.Mutex
	start  time.Time
	jobs   map[string]cron.Schedule
	last   map[string]time.Time
	factor float64
	now    func() time.Time
}

// NewFreshness watches jobs: one is stale when it has not succeeded within
// factor times its schedule's interval (counted from start until its first
// success).
func NewFreshness(jobs map[string]cron.Schedule, factor float64, now func() time.Time) *Freshness {
	if now == nil {
		now = time.Now
	}
	return &Freshness{start: now(), jobs: jobs, last: map[string]time.Time{}, factor: factor, now: now}
}

// Succeeded records a successful run of job.
func (f *Freshness) Succeeded(job string, at time.Time) {
	f.mu.Lock()
	f.last[job] = at
	f.mu.Unlock()
}

// interval is the time between two runs of sched around t.
func interval(sched cron.Schedule, t time.Time) time.Duration {
	next := sched.Next(t)
	return sched.Next(next).Sub(next)
}

// Stale returns the jobs that are overdue, with how long since their last
// success.
func (f *Freshness) Stale() map[string]time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	out := map[string]time.Duration{}
	for job, sched := range f.jobs {
		last, ok := f.last[job]
		if !ok {
			last = f.start
		}
		limit := time.Duration(f.factor * float64(interval(sched, now)))
		if age := now.Sub(last); age > limit {
			out[job] = age
		}
	}
	return out
}

// Handler serves /metrics, /healthz and /readyz.
func Handler(m *Metrics, checks []ReadinessCheck) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(
		"GET /metrics",
		promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{Registry: m.reg, Timeout: 10 * time.Second}),
	)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
		defer cancel()
		asked := r.URL.Query().Get("phase")
		failed, pending, phases := map[string]string{}, map[string]string{}, map[string]bool{}
		for _, c := range checks {
			err := c.Run(ctx)
			if c.Phase != "" {
				ok, seen := phases[c.Phase]
				phases[c.Phase] = (ok || !seen) && err == nil
			}
			switch {
			case err == nil:
			case c.Deferred && asked != c.Phase:
				pending[c.Name] = err.Error()
			default:
				failed[c.Name] = err.Error()
			}
		}
		w.Header().Set("Content-Type", "application/json")
		status := http.StatusOK
		if len(failed) > 0 {
			status = http.StatusServiceUnavailable
		}
		w.WriteHeader(status)
		body := map[string]any{"ready": len(failed) == 0, "failed": failed}
		if len(phases) > 0 {
			body["phases"] = phases
		}
		if len(pending) > 0 {
			body["pending"] = pending
		}
		json.NewEncoder(w).Encode(body)
	})
	return mux
}
