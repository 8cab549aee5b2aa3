package platform_test

import (
	"bufio"
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

const testToken = "platform-test-token-5f0c1e"

// newClock is a hand-moved clock, shared by the simulator and, where a
// test needs it, the client.
func newClock() *testutil.Clock {
	return testutil.NewClock(time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC))
}

// env is a simulator on loopback HTTP.
type env struct {
	tb  testing.TB
	sim *platformsim.Sim
	srv *httptest.Server
	clk *testutil.Clock

	seen  atomic.Pointer[outcomes]
	front atomic.Pointer[frontFunc]
}

// newEnv starts a simulator populated with sc; mod adjusts its options.
func newEnv(tb testing.TB, sc platformsim.Scale, mod func(*platformsim.Options)) *env {
	tb.Helper()
	clk := newClock()
	opts := platformsim.Options{Seed: 11, Tokens: []string{testToken}, Clock: clk.Now, AllowHTTPSinks: true}
	if mod != nil {
		mod(&opts)
	}
	sim := platformsim.New(opts)
	sim.Populate(sc)
	e := &env{tb: tb, sim: sim, clk: clk}
	h := sim.Handler()
	e.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if o := e.seen.Load(); o != nil {
			w = &countingWriter{ResponseWriter: w, o: o}
		}
		if f := e.front.Load(); f != nil {
			(*f)(w, r, h)
			return
		}
		h.ServeHTTP(w, r)
	}))
	sim.SetBaseURL(e.srv.URL)
	tb.Cleanup(func() {
		e.srv.Close()
		sim.Close()
	})
	return e
}

// frontFunc stands in front of the simulator's handler h in a test.
type frontFunc func(w http.ResponseWriter, r *http.Request, h http.Handler)

// setFront puts f in front of the simulator.
func (e *env) setFront(f frontFunc) { e.front.Store(&f) }

// config is a client configuration for the env with short retry waits;
// the simulator's 429s ask for a second or more, which tests cap.
func (e *env) config() platform.Config {
	return platform.Config{
		BaseURL: e.srv.URL, RegistryURL: e.srv.URL, Token: platform.StaticToken(testToken),
		Organization: "acme", PublicOrg: "chainguard", Vendor: "chainguard",
		Timeout: 10 * time.Second, MaxRetryTime: 60 * time.Second,
		RetryInitialInterval: time.Millisecond, RetryMaxInterval: 20 * time.Millisecond,
		MaxRetryAfter: 5 * time.Millisecond,
	}
}

// client returns a client for the env; mod adjusts its configuration.
func (e *env) client(mod func(*platform.Config)) *platform.Client {
	e.tb.Helper()
	cfg := e.config()
	if mod != nil {
		mod(&cfg)
	}
	return mustClient(e.tb, cfg)
}

func mustClient(tb testing.TB, cfg platform.Config) *platform.Client {
	tb.Helper()
	c, err := platform.New(cfg)
	if err != nil {
		tb.Fatalf("platform.New: %v", err)
	}
	return c
}

// requests is how many requests the simulator saw for an endpoint pattern.
func (e *env) requests(pattern string) int { return e.sim.Stats().ByEndpoint[pattern] }

func ctxT(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// digest makes a distinct digest for n.
func digest(n int) string {
	const hex = "0123456789abcdef"
	b := []byte(strings.Repeat("0", 64))
	for i := 63; n > 0 && i >= 0; i-- {
		b[i] = hex[n%16]
		n /= 16
	}
	return "sha256:" + string(b)
}

// checkHistory fails unless got equals want record for record.
func checkHistory(tb testing.TB, name string, got []platform.HistoryRecord, want []platformsim.TruthRecord) {
	tb.Helper()
	if len(got) != len(want) {
		tb.Errorf("%s: %d records, want %d", name, len(got), len(want))
	}
	for i := range min(len(got), len(want)) {
		if !got[i].UpdateTimestamp.Equal(want[i].UpdateTime) || got[i].Digest != want[i].Digest {
			tb.Fatalf(
				"%s: record %d = %s %s, want %s %s",
				name,
				i,
				got[i].UpdateTimestamp.Format(
					time.RFC3339Nano,
				),
				got[i].Digest,
				want[i].UpdateTime.Format(time.RFC3339Nano),
				want[i].Digest,
			)
		}
	}
}

// repoNames maps repo uids to names, for registry paths.
func repoNames(tr platformsim.Truth) map[string]string {
	m := make(map[string]string, len(tr.Repos))
	for _, r := range tr.Repos {
		m[r.UID] = r.Name
	}
	return m
}

// outcomes counts the answers a server gave: statuses, and connections
// hijacked (the simulator's resets).
type outcomes struct {
	mu     sync.Mutex
	status map[int]int
	resets int
}

func (o *outcomes) get(status int) int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.status[status]
}

func (o *outcomes) resetCount() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.resets
}

// countingWriter records the status of an answer for outcomes.
type countingWriter struct {
	http.ResponseWriter
	o    *outcomes
	done bool
}

func (w *countingWriter) WriteHeader(code int) {
	if !w.done {
		w.done = true
		w.o.mu.Lock()
		w.o.status[code]++
		w.o.mu.Unlock()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *countingWriter) Write(p []byte) (int, error) {
	if !w.done {
		w.WriteHeader(http.StatusOK)
	}
	return w.ResponseWriter.Write(p)
}

func (w *countingWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *countingWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	w.o.mu.Lock()
	w.o.resets++
	w.o.mu.Unlock()
	return http.NewResponseController(w.ResponseWriter).Hijack()
}

// countOutcomes puts a counting layer in front of the env's simulator.
func (e *env) countOutcomes() *outcomes {
	o := &outcomes{status: map[int]int{}}
	e.seen.Store(o)
	return o
}
