package bench

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/platformsim"
)

// tracer records when each request of a client was sent, got its
// connection and was read to the end, to find where a latency-bound sync
// leaves connections idle (BenchmarkLatency).
type tracer struct {
	mu    sync.Mutex
	start time.Time
	reqs  []tracedRequest
	// handled is the simulator's time in its handler, by request kind.
	handled map[string]time.Duration
}

type tracedRequest struct {
	kind            string
	sent, conn, end time.Duration // since tracer.start
}

func newTracer() *tracer { return &tracer{start: time.Now(), handled: map[string]time.Duration{}} }

// server returns h with the time in it recorded.
func (t *tracer) server(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		h.ServeHTTP(w, r)
		d := time.Since(start)
		t.mu.Lock()
		t.handled[requestKind(r.URL.Path)] += d
		t.mu.Unlock()
	})
}

// wrap returns rt with every request traced.
func (t *tracer) wrap(rt http.RoundTripper) http.RoundTripper {
	return roundTripFunc(func(req *http.Request) (*http.Response, error) {
		tr := &tracedRequest{kind: requestKind(req.URL.Path), sent: time.Since(t.start)}
		ctx := httptrace.WithClientTrace(req.Context(), &httptrace.ClientTrace{
			GotConn: func(httptrace.GotConnInfo) { tr.conn = time.Since(t.start) },
		})
		resp, err := rt.RoundTrip(req.WithContext(ctx))
		if err != nil {
			tr.end = time.Since(t.start)
			t.add(tr)
			return resp, err
		}
		resp.Body = &tracedBody{ReadCloser: resp.Body, done: func() {
			tr.end = time.Since(t.start)
			t.add(tr)
		}}
		return resp, nil
	})
}

func (t *tracer) add(r *tracedRequest) {
	t.mu.Lock()
	t.reqs = append(t.reqs, *r)
	t.mu.Unlock()
}

type roundTripFunc func(*http.Request) (*http.Response, error)

func (f roundTripFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// tracedBody calls done once, when the body is read to its end or closed,
// which is when the transport gives the connection back.
type tracedBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *tracedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.done)
	}
	return n, err
}

func (b *tracedBody) Close() error {
	b.once.Do(b.done)
	return b.ReadCloser.Close()
}

func requestKind(path string) string {
	switch {
	case strings.Contains(path, "/history/"):
		return "history"
	case strings.Contains(path, "/tags"):
		return "tags"
	case strings.Contains(path, "/repos"):
		return "repos"
	case strings.Contains(path, "/advisories"):
		return "advisories"
	case strings.HasSuffix(path, "/token"):
		return "token"
	}
	return "other"
}

// report prints where a latency-bound sync of wall spent its connections:
// how long each kind of request held one beyond the latency, how long
// requests waited for one, and, per slice of the wall time, how many of
// the conns connections were busy on average and with what.
func (t *tracer) report(w io.Writer, wall, latency time.Duration, conns int) {
	t.mu.Lock()
	reqs := slices.Clone(t.reqs)
	t.mu.Unlock()
	type agg struct {
		n           int
		busy, wait  time.Duration
		first, last time.Duration
	}
	byKind := map[string]*agg{}
	var busy time.Duration
	for _, r := range reqs {
		a := byKind[r.kind]
		if a == nil {
			a = &agg{first: r.sent}
			byKind[r.kind] = a
		}
		a.n++
		a.busy += r.end - r.conn
		a.wait += r.conn - r.sent
		a.first, a.last = min(a.first, r.sent), max(a.last, r.end)
		busy += r.end - r.conn
	}
	fmt.Fprintf(
		w,
		"requests %d in %.2f s; connection-seconds busy %.1f of %.1f (%.1f%%); floor of these requests %.2f s, ratio %.3f\n",
		len(
			reqs,
		),
		wall.Seconds(),
		busy.Seconds(),
		wall.Seconds()*float64(conns),
		100*busy.Seconds()/(wall.Seconds()*float64(conns)),
		float64(
			len(reqs),
		)*latency.Seconds()/float64(
			conns,
		),
		wall.Seconds()/(float64(len(reqs))*latency.Seconds()/float64(conns)),
	)
	kinds := make([]string, 0, len(byKind))
	for k := range byKind {
		kinds = append(kinds, k)
	}
	slices.Sort(kinds)
	for _, k := range kinds {
		a := byKind[k]
		fmt.Fprintf(
			w,
			"  %-10s %7d  held %.2f ms each (latency %.0f ms, in the simulator's handler %.2f), waited for a connection %.2f ms each; from %.2f s to %.2f s\n",
			k,
			a.n,
			ms(a.busy)/float64(a.n),
			ms(latency),
			ms(t.handled[k])/float64(a.n),
			ms(a.wait)/float64(a.n),
			a.first.Seconds(),
			a.last.Seconds(),
		)
	}
	// Busy connections per slice of the wall time, by kind.
	slices := 40
	step := wall / time.Duration(slices)
	if step <= 0 {
		return
	}
	busyBy := make([]map[string]time.Duration, slices+1)
	for i := range busyBy {
		busyBy[i] = map[string]time.Duration{}
	}
	for _, r := range reqs {
		for i := int(r.conn / step); i <= int(r.end/step) && i <= slices; i++ {
			lo, hi := max(r.conn, time.Duration(i)*step), min(r.end, time.Duration(i+1)*step)
			if hi > lo {
				busyBy[i][r.kind] += hi - lo
			}
		}
	}
	var idle time.Duration
	for i := range slices {
		var total time.Duration
		parts := []string{}
		for _, k := range kinds {
			if d := busyBy[i][k]; d > 0 {
				total += d
				parts = append(parts, fmt.Sprintf("%s %.1f", k, float64(d)/float64(step)))
			}
		}
		idle += time.Duration(conns)*step - total
		fmt.Fprintf(
			w,
			"  %6.2f s  busy %5.2f of %d  %s\n",
			(time.Duration(i) * step).Seconds(),
			float64(total)/float64(step),
			conns,
			strings.Join(parts, ", "),
		)
	}
	fmt.Fprintf(w, "idle connection-seconds %.1f\n", idle.Seconds())
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// BenchmarkLatency is the latency-bound sync of BenchmarkSyncd alone, on
// the benchmark's organization or (BENCH_ORG=realistic) the realistic one,
// with a trace of the requests that says where connections were idle:
//
//	BENCH_SCALE=0.1 go test -run '^$' -bench '^BenchmarkLatency$' -benchtime 1x ./bench/
func BenchmarkLatency(b *testing.B) {
	p, dir := setUp(b)
	ctx := context.Background()
	sc := orgScale(p.Scale)
	if os.Getenv("BENCH_ORG") == "realistic" {
		sc = realisticScale(p.Scale)
	}
	tr := newTracer()
	o := startOrg(sc, tr.server)
	defer o.Close()
	minimum := minimumRequests(o.sim.Truth()).Total()
	l, err := openMirror(ctx, filepath.Join(dir, "l"), o.URL(), p.Concurrency, "snapshot", tr.wrap)
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	o.sim.SetFaults(platformsim.Fault{Pattern: "*", RespondAfter: p.Latency})
	stop, err := startProfile(os.Getenv("BENCH_LATENCYPROFILE"))
	if err != nil {
		b.Fatal(err)
	}
	tr.start = time.Now()
	cpu0 := selfCPU()
	res, err := syncOnce(ctx, o, l)
	stop()
	if err != nil {
		b.Fatal(err)
	}
	cpu := selfCPU() - cpu0
	floor := float64(minimum) * p.Latency.Seconds() / float64(p.Concurrency)
	fmt.Fprintf(
		os.Stderr,
		"latency-bound sync: %.2f s, %d requests (minimum %d), floor %.2f s, ratio %.3f; CPU %.1f s (simulator and syncd), %.0f us a request\n",
		res.WallSeconds,
		res.Requests,
		minimum,
		floor,
		res.WallSeconds/floor,
		cpu.Seconds(),
		float64(cpu.Microseconds())/float64(res.Requests),
	)
	tr.report(os.Stderr, res.Wall, p.Latency, p.Concurrency)
	b.ReportMetric(res.WallSeconds/floor, "latency/floor")

	ceil, err := measureLatencyCeiling(ctx, o, p, minimum, res.WallSeconds)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(
		os.Stderr,
		"plain loop: %d history requests in %.2f s (CPU %.0f us a request), %.2f ms a request and place (latency %.0f ms): the floor at that pace %.2f s, the sync's ratio to it %.3f\n",
		ceil.Requests,
		ceil.Seconds,
		ceil.CPUPerRequestUs,
		ceil.PerRequestMs,
		ms(p.Latency),
		ceil.CeilingSeconds,
		ceil.Ratio,
	)
	machine, err := measureMachineLatency(ctx, p.Concurrency, p.Latency, machineRequests)
	if err != nil {
		b.Fatal(err)
	}
	fmt.Fprintf(
		os.Stderr,
		"bare net/http pair on this machine: %d requests, %d at once, %.0f ms each: %.3f of their floor\n",
		machineRequests,
		p.Concurrency,
		ms(p.Latency),
		machine,
	)
}

// ceilingRequests and machineRequests are how many requests the plain loop
// and the bare net/http pair make: about 4 s each at 20 ms and 16 at once,
// where a run's ratios varied by about 1% from one run to the next.
const ceilingRequests, machineRequests = 3000, 3000

// latencyCeiling is the latency-bound sync's measured ceiling: the same
// kind of requests (history reads) from a plain loop, as many at once as
// the crawl's concurrency, through a client like the crawl's, against the
// same simulator with the same response time, with nothing done with the
// answers. Its pace, times the minimum requests, is the wall no crawl
// could beat on this machine.
type latencyCeiling struct {
	Requests        int     `json:"requests"`
	Seconds         float64 `json:"seconds"`
	CPUPerRequestUs float64 `json:"cpu_per_request_us"`
	PerRequestMs    float64 `json:"per_request_and_place_ms"`
	CeilingSeconds  float64 `json:"ceiling_s"`
	Ratio           float64 `json:"ratio"` // the sync's wall to CeilingSeconds
}

// measureLatencyCeiling runs the plain loop with o's simulator answering
// every request p.Latency after it arrives, and compares wall, the sync's,
// to minimum requests at the loop's pace.
func measureLatencyCeiling(ctx context.Context, o *org, p params, minimum int, wall float64) (latencyCeiling, error) {
	o.sim.SetFaults(platformsim.Fault{Pattern: "*", RespondAfter: p.Latency})
	defer o.sim.SetFaults()
	cpu0 := selfCPU()
	loop, n, err := requestLoop(ctx, o, p.Concurrency, ceilingRequests)
	if err != nil {
		return latencyCeiling{}, err
	}
	cpu := selfCPU() - cpu0
	per := loop * time.Duration(p.Concurrency) / time.Duration(n)
	c := latencyCeiling{
		Requests:        n,
		Seconds:         loop.Seconds(),
		CPUPerRequestUs: float64(cpu.Microseconds()) / float64(n),
		PerRequestMs:    ms(per),
		CeilingSeconds:  float64(minimum) * per.Seconds() / float64(p.Concurrency),
	}
	c.Ratio = wall / c.CeilingSeconds
	return c, nil
}

// measureMachineLatency is what this machine allows any client: n requests
// to a bare net/http server on loopback that answers each after latency,
// conc at once from a bare net/http client, as a ratio to their floor (n ×
// latency ÷ conc). The difference is Go's timers firing late and the
// requests' own round trips, with nothing of syncd or the simulator in it.
func measureMachineLatency(ctx context.Context, conc int, latency time.Duration, n int) (float64, error) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		t := time.NewTimer(latency)
		defer t.Stop()
		select {
		case <-t.C:
			_, _ = w.Write([]byte(`{"items":[]}`))
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	tr := http.DefaultTransport.(*http.Transport).Clone()
	tr.MaxConnsPerHost, tr.MaxIdleConnsPerHost = conc, conc
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	next := make(chan struct{})
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	for range conc {
		g.Go(func() error {
			for range next {
				req, err := http.NewRequestWithContext(gctx, http.MethodGet, srv.URL, nil)
				if err != nil {
					return err
				}
				resp, err := client.Do(req)
				if err != nil {
					return err
				}
				_, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if err != nil {
					return err
				}
			}
			return nil
		})
	}
	for range n {
		next <- struct{}{}
	}
	close(next)
	if err := g.Wait(); err != nil {
		return 0, err
	}
	floor := time.Duration(n) * latency / time.Duration(conc)
	return time.Since(start).Seconds() / floor.Seconds(), nil
}

// requestLoop reads one history window of up to n tags of o, conc at once,
// and returns how long it took and how many it read.
func requestLoop(ctx context.Context, o *org, conc, n int) (time.Duration, int, error) {
	truth := o.sim.Truth()
	paths := map[string]string{}
	for _, r := range truth.Repos {
		paths[r.UID] = r.Path
	}
	tags := truth.Tags[:min(n, len(truth.Tags))]
	client, err := newClient(o.URL(), conc)
	if err != nil {
		return 0, 0, err
	}
	next := make(chan platformsim.TruthTag)
	g, gctx := errgroup.WithContext(ctx)
	start := time.Now()
	for range conc {
		g.Go(func() error {
			for t := range next {
				if _, err := client.TagHistory(gctx, client.PrivateImage(paths[t.RepoUID]), t.Name, time.Time{},
					time.Time{}); err != nil {
					return err
				}
			}
			return nil
		})
	}
	for _, t := range tags {
		next <- t
	}
	close(next)
	err = g.Wait()
	return time.Since(start), len(tags), err
}
