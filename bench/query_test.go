package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/store"
)

// The query service's rows: each endpoint at a fixed request rate, and the
// service's throughput against a plain loop of the same reads.
const (
	// queryRate is the fixed rate each endpoint is asked at, and
	// queryRateSeconds how long: a bounded queryRate × queryRateSeconds
	// requests an endpoint, after a warm-up of a second.
	queryRate        = 200
	queryRateSeconds = 5
	// queryClients are the closed-loop clients of the throughput run, on
	// one NATS connection; queryThroughputFor how long each side runs.
	queryClients       = 16
	queryThroughputFor = 3 * time.Second
	// queryPool is how many distinct requests each endpoint draws from.
	queryPool = 4096
	// queryPrefix is the service's subject prefix in the benchmark.
	queryPrefix = "syncd-query-bench"
)

// queryResult is what the query service measured on the mirror.
type queryResult struct {
	HistoryRows int64 `json:"history_rows"`
	// Endpoints are the fixed-rate runs, one an endpoint.
	Endpoints  []queryLatency `json:"endpoints"`
	RatePerSec int            `json:"rate_per_s"`
	// Throughput: Clients closed-loop clients through NATS on a mix of the
	// five endpoints that read the mirror (position reads none), against
	// Workers goroutines (the service's concurrency) running the same
	// reads on the same mirror without NATS, JSON or the service; the
	// plain loop runs before and after the service, and the faster run
	// is the ceiling.
	Clients      int     `json:"clients"`
	Workers      int     `json:"plain_workers"`
	ServedPerSec float64 `json:"service_req_per_s"`
	PlainPerSec  float64 `json:"plain_req_per_s"`
	Ratio        float64 `json:"ratio"`
	// Failed counts the throughput run's failed requests, both sides.
	Failed int64 `json:"throughput_failed"`
	// EchoPerSec is a bare NATS request and reply on the same server and
	// connections, the same clients, a responder that answers a fixed
	// body at once: what NATS alone allows on this machine, no mirror and
	// no service (a reference, not a target).
	EchoPerSec float64 `json:"nats_echo_req_per_s"`
}

// queryLatency is one endpoint at the fixed rate.
type queryLatency struct {
	Endpoint string  `json:"endpoint"`
	Requests int     `json:"requests"`
	Failed   int     `json:"failed"`
	P50ms    float64 `json:"p50_ms"`
	P99ms    float64 `json:"p99_ms"`
	MaxMs    float64 `json:"max_ms"`
}

// queryLatencyTarget is the p99 bound, for tag.at and digest.where.
const queryLatencyTarget = 5.0

func (q queryResult) latency(endpoint string) queryLatency {
	for _, l := range q.Endpoints {
		if l.Endpoint == endpoint {
			return l
		}
	}
	return queryLatency{Endpoint: endpoint}
}

// queryTargets are the targets for the query service. A run with
// failed requests misses them.
func queryTargets(q queryResult) []target {
	at, where := q.latency(query.TagAt), q.latency(query.DigestWhere)
	return []target{
		{"query throughput / plain SQLite loop", q.Ratio, ">= 0.7", q.Ratio >= 0.7 && q.Failed == 0},
		{"query tag.at p99 (ms)", at.P99ms, "<= 5", at.P99ms <= queryLatencyTarget && at.Failed == 0 && at.Requests > 0},
		{
			"query digest.where p99 (ms)",
			where.P99ms,
			"<= 5",
			where.P99ms <= queryLatencyTarget && where.Failed == 0 && where.Requests > 0,
		},
	}
}

// queryRows prints the query service's rows of the table.
func queryRows(row func(...string), status map[string]string, q queryResult) {
	f := fmt.Sprintf
	row(
		f("query service (%d history rows), at %d req/s", q.HistoryRows, q.RatePerSec),
		"p50 / p99",
		"requests (failed), max",
		"",
		"",
	)
	for _, l := range q.Endpoints {
		st := ""
		switch l.Endpoint {
		case query.TagAt:
			st = status["query tag.at p99 (ms)"]
		case query.DigestWhere:
			st = status["query digest.where p99 (ms)"]
		}
		row(
			"  "+l.Endpoint,
			f("%.2f / %.2f ms", l.P50ms, l.P99ms),
			f("%d (%d), %.1f ms", l.Requests, l.Failed, l.MaxMs),
			"",
			st,
		)
	}
	row(
		f("query service: req/s, %d clients, 5 endpoints", q.Clients),
		f("%.0f", q.ServedPerSec),
		f(
			"plain SQLite loop %.0f (%d goroutines)",
			q.PlainPerSec,
			q.Workers,
		),
		f("%.2f", q.Ratio),
		status["query throughput / plain SQLite loop"],
	)
	row("  bare NATS request/reply, same clients: req/s", f("%.0f", q.EchoPerSec), "", "", "")
}

// queryCase is one request: what the service is sent, and the same reads
// done directly on the mirror.
type queryCase struct {
	endpoint string
	req      any
	plain    func(ctx context.Context, rd *store.MirrorRead) error
}

// queryCases draws up to queryPool requests an endpoint from the
// organization's truth, which the mirror has synced: tag.at an instant a
// second after a random record, tag.history a tag's first page,
// digest.where a digest some record holds, repo.tags a repo's first page,
// advisories by artifact or by alias.
func queryCases(truth platformsim.Truth) map[string][]queryCase {
	rng := rand.New(rand.NewPCG(32, 4))
	paths := map[string]string{}
	for _, r := range truth.Repos {
		paths[r.UID] = r.Path
	}
	var tags []platformsim.TruthTag
	for _, tg := range truth.Tags {
		if len(truth.History[tg.UID]) > 0 {
			tags = append(tags, tg)
		}
	}
	sort.Slice(tags, func(i, j int) bool { return tags[i].UID < tags[j].UID })
	out := map[string][]queryCase{}
	for range queryPool {
		tg := tags[rng.IntN(len(tags))]
		h := truth.History[tg.UID]
		rec := h[rng.IntN(len(h))]
		path, name := paths[tg.RepoUID], tg.Name
		at := rec.UpdateTime.Add(time.Second).UTC()
		out[query.TagAt] = append(out[query.TagAt], queryCase{query.TagAt,
			query.TagAtRequest{Repo: path, Tag: name, Time: at.Format(time.RFC3339Nano)},
			func(ctx context.Context, rd *store.MirrorRead) error {
				_, tag, err := plainTag(ctx, rd, path, name)
				if err != nil {
					return err
				}
				r, ok, err := rd.RecordAt(ctx, tag.UID, at.Truncate(time.Millisecond))
				if err != nil || !ok {
					return fmt.Errorf("tag.at %s:%s at %s: no record (%v)", path, name, at, err)
				}
				_, _, err = rd.NextRecord(ctx, tag.UID, r.Seq)
				return err
			}})
		out[query.TagHistory] = append(out[query.TagHistory], queryCase{query.TagHistory,
			query.TagHistoryRequest{Repo: path, Tag: name},
			func(ctx context.Context, rd *store.MirrorRead) error {
				_, tag, err := plainTag(ctx, rd, path, name)
				if err != nil {
					return err
				}
				_, err = rd.History(ctx, tag.UID, time.Time{}, time.Time{}, -1, 101)
				return err
			}})
		digest := h[rng.IntN(len(h))].Digest
		out[query.DigestWhere] = append(out[query.DigestWhere], queryCase{query.DigestWhere,
			query.DigestWhereRequest{Digest: digest},
			func(ctx context.Context, rd *store.MirrorRead) error {
				found, err := rd.DigestsWithPrefix(ctx, digest, 2)
				if err != nil || len(found) == 0 {
					return fmt.Errorf("digest.where %s: not found (%v)", digest, err)
				}
				_, err = rd.DigestIntervals(ctx, found[0], 101)
				return err
			}})
		repoPath := paths[truth.Repos[rng.IntN(len(truth.Repos))].UID]
		out[query.RepoTags] = append(out[query.RepoTags], queryCase{query.RepoTags,
			query.RepoTagsRequest{Repo: repoPath},
			func(ctx context.Context, rd *store.MirrorRead) error {
				repo, ok, err := rd.Repo(ctx, repoPath)
				if err != nil || !ok {
					return fmt.Errorf("repo.tags %s: no repo (%v)", repoPath, err)
				}
				_, err = rd.RepoTags(ctx, repo.UID, "", 101)
				return err
			}})
		if len(truth.Advisories) > 0 {
			a := truth.Advisories[rng.IntN(len(truth.Advisories))]
			req, key, value := query.AdvisoriesRequest{Artifact: a.ArtifactName}, store.ByArtifact, a.ArtifactName
			if len(a.Aliases) > 0 && rng.IntN(2) == 0 {
				req, key, value = query.AdvisoriesRequest{Alias: a.Aliases[0]}, store.ByAlias, a.Aliases[0]
			}
			out[query.Advisories] = append(out[query.Advisories], queryCase{query.Advisories, req,
				func(ctx context.Context, rd *store.MirrorRead) error {
					_, err := rd.AdvisoriesBy(ctx, key, value, false, 101)
					return err
				}})
		}
	}
	out[query.PositionEP] = []queryCase{{endpoint: query.PositionEP, req: query.PositionRequest{}}}
	return out
}

func plainTag(ctx context.Context, rd *store.MirrorRead, path, name string) (store.RepoRow, store.TagRow, error) {
	repo, ok, err := rd.Repo(ctx, path)
	if err != nil || !ok {
		return repo, store.TagRow{}, fmt.Errorf("no repo %s (%v)", path, err)
	}
	tag, ok, err := rd.Tag(ctx, repo.UID, name)
	if err != nil || !ok {
		return repo, tag, fmt.Errorf("no tag %s:%s (%v)", path, name, err)
	}
	return repo, tag, nil
}

// startQueryNATS starts a NATS server on a loopback port, without
// JetStream: the service needs core NATS only.
func startQueryNATS() (*server.Server, error) {
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		return nil, err
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("query NATS server not ready in 10s")
	}
	return ns, nil
}

// measureQuery starts the query service on st, on a NATS server of its
// own, and measures it with requests drawn from truth (the organization
// st has synced).
func measureQuery(ctx context.Context, st *store.Store, truth platformsim.Truth) (queryResult, error) {
	r := queryResult{RatePerSec: queryRate, Clients: queryClients}
	if err := st.Reader().QueryRowContext(ctx, `SELECT count(*) FROM tag_history`).Scan(&r.HistoryRows); err != nil {
		return r, err
	}
	cases := queryCases(truth)
	truth = platformsim.Truth{}

	ns, err := startQueryNATS()
	if err != nil {
		return r, err
	}
	defer ns.Shutdown()
	svcConn, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return r, err
	}
	defer svcConn.Close()
	cliConn, err := nats.Connect(ns.ClientURL())
	if err != nil {
		return r, err
	}
	defer cliConn.Close()

	qs := st.Queries()
	defer qs.Close()
	cfg := query.Config{Prefix: queryPrefix}
	svc := query.New(svcConn, qs, query.NewPosition(), cfg)
	if err := svc.Start(); err != nil {
		return r, err
	}
	defer svc.Stop()
	c := &query.Client{NC: cliConn, Prefix: queryPrefix}
	r.Workers = 4 // query.Config's default Concurrency, which cfg keeps

	for _, ep := range query.Endpoints {
		pool := cases[ep]
		if len(pool) == 0 {
			continue
		}
		// A second's warm-up (the page cache, the prepared statements),
		// then the measured run.
		if _, err := queryAtRate(ctx, c, ep, pool, queryRate); err != nil {
			return r, err
		}
		l, err := queryAtRate(ctx, c, ep, pool, queryRate*queryRateSeconds)
		if err != nil {
			return r, err
		}
		r.Endpoints = append(r.Endpoints, l)
	}

	// The throughput mix: the endpoints that read the mirror, in turn.
	var mix []queryCase
	for i := range queryPool {
		for _, ep := range []string{query.TagAt, query.TagHistory, query.DigestWhere, query.RepoTags, query.Advisories} {
			if pool := cases[ep]; len(pool) > 0 {
				mix = append(mix, pool[i%len(pool)])
			}
		}
	}
	var failed atomic.Int64
	var firstErr atomic.Value
	fail := func(err error) {
		failed.Add(1)
		firstErr.CompareAndSwap(nil, err)
	}
	plain := func() float64 {
		return closedLoop(r.Workers, queryThroughputFor, func(i int) bool {
			qc := mix[i%len(mix)]
			if err := qs.ReadMirror(ctx, func(rd *store.MirrorRead) error { return qc.plain(ctx, rd) }); err != nil {
				fail(err)
				return false
			}
			return true
		})
	}
	plain1 := plain()
	// BENCH_QUERYPROFILE: a CPU profile of the service's side alone.
	stop, err := startProfile(os.Getenv("BENCH_QUERYPROFILE"))
	if err != nil {
		return r, err
	}
	r.ServedPerSec = closedLoop(queryClients, queryThroughputFor, func(i int) bool {
		qc := mix[i%len(mix)]
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if err := c.Do(rctx, qc.endpoint, qc.req, nil); err != nil {
			fail(fmt.Errorf("%s: %w", qc.endpoint, err))
			return false
		}
		return true
	})
	stop()
	r.PlainPerSec = max(plain1, plain())
	r.Ratio = r.ServedPerSec / r.PlainPerSec
	if r.EchoPerSec, err = natsEcho(ctx, svcConn, cliConn); err != nil {
		return r, err
	}
	if r.Failed = failed.Load(); r.Failed > 0 {
		fmt.Fprintf(os.Stderr, "query throughput: %d requests failed, the first: %v\n", r.Failed, firstErr.Load())
	}
	return r, nil
}

// natsEcho is the throughput of queryClients closed-loop clients on cli
// asking a responder on srv that answers a fixed body at once.
func natsEcho(ctx context.Context, srv, cli *nats.Conn) (float64, error) {
	var failed atomic.Int64
	body := []byte(`{"stream_seq":0}`)
	sub, err := srv.QueueSubscribe(queryPrefix+"-echo", "echo", func(m *nats.Msg) { m.Respond(body) })
	if err != nil {
		return 0, err
	}
	defer sub.Unsubscribe()
	if err := srv.Flush(); err != nil {
		return 0, err
	}
	req := []byte(`{"repo":"r","tag":"t"}`)
	defer func() {
		if n := failed.Load(); n > 0 {
			fmt.Fprintf(os.Stderr, "bare NATS request/reply: %d requests failed\n", n)
		}
	}()
	return closedLoop(queryClients, queryThroughputFor, func(int) bool {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		if _, err := cli.RequestWithContext(rctx, queryPrefix+"-echo", req); err != nil {
			failed.Add(1)
			return false
		}
		return true
	}), nil
}

// queryAtRate sends n requests to ep at queryRate a second, each on a
// goroutine of its own with a 5 s deadline (an open loop: a slow answer
// does not delay the next request), and returns their latencies.
func queryAtRate(ctx context.Context, c *query.Client, ep string, pool []queryCase, n int) (queryLatency, error) {
	l := queryLatency{Endpoint: ep, Requests: n}
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / queryRate)
	defer tick.Stop()
	for i := range n {
		<-tick.C
		qc := pool[i%len(pool)]
		wg.Add(1)
		go func() {
			defer wg.Done()
			rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			t0 := time.Now()
			errs[i] = c.Do(rctx, ep, qc.req, nil)
			lat[i] = time.Since(t0)
		}()
	}
	wg.Wait()
	var ok []time.Duration
	var first error
	for i, err := range errs {
		if err != nil {
			l.Failed++
			if first == nil {
				first = err
			}
			continue
		}
		ok = append(ok, lat[i])
	}
	if len(ok) == 0 {
		return l, fmt.Errorf("query %s: every request failed, the first: %w", ep, first)
	}
	if first != nil {
		fmt.Fprintf(os.Stderr, "query %s: %d of %d requests failed, the first: %v\n", ep, l.Failed, n, first)
	}
	l.P50ms, l.P99ms, l.MaxMs = quantileMs(ok, 0.50), quantileMs(ok, 0.99), quantileMs(ok, 1)
	return l, nil
}

// closedLoop runs fn on n goroutines for d, each calling it again as soon
// as it returns, and returns the successful calls per second.
func closedLoop(n int, d time.Duration, fn func(i int) bool) float64 {
	var done atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	end := start.Add(d)
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; time.Now().Before(end); i += n {
				if fn(i) {
					done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(done.Load()) / time.Since(start).Seconds()
}

// BenchmarkQuery runs the query service's rows alone: it syncs the
// organization (BENCH_SCALE as make bench) into a mirror in this process,
// then measures the service on it and prints its rows. It writes no
// results file.
//
//	BENCH_SCALE=0.1 go test -run '^$' -bench '^BenchmarkQuery$' -benchtime 1x -count 1 ./bench/
func BenchmarkQuery(b *testing.B) {
	p, dir := setUp(b)
	ctx := context.Background()
	began := time.Now()
	progress := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "bench %6.1fs: %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}
	sc := orgScale(p.Scale)
	progress("generating the organization: %d repos x %d tags, %d advisories", sc.Repos, sc.TagsPerRepo, sc.Advisories)
	o := startOrg(sc)
	defer o.Close()
	m, err := openMirror(ctx, filepath.Join(dir, "q"), o.URL(), p.Concurrency, "none")
	if err != nil {
		b.Fatal(err)
	}
	defer m.Close()
	progress("full sync in this process, concurrency %d", p.Concurrency)
	full, err := syncOnce(ctx, o, m)
	if err != nil {
		b.Fatal(err)
	}
	progress(
		"query service: %d history rows synced in %.1f s; each endpoint at %d req/s, then throughput",
		full.HistoryRows,
		full.WallSeconds,
		queryRate,
	)
	q, err := measureQuery(ctx, m.store, o.sim.Truth())
	if err != nil {
		b.Fatal(err)
	}
	ts := queryTargets(q)
	status := map[string]string{}
	for _, t := range ts {
		s := "MISSED"
		if t.Met {
			s = "met"
		}
		status[t.Name] = t.Want + " " + s
	}
	mc := thisMachine()
	fmt.Printf(
		"\nsyncd query service: scale %g; machine: %d CPUs, %s, %s, load at start %s\n\n",
		p.Scale,
		mc.CPUs,
		mc.CPU,
		mc.Go,
		mc.LoadStart,
	)
	printRows(os.Stdout, func(row func(...string)) {
		row("measure", "value", "ceiling / reference", "ratio", "target")
		queryRows(row, status, q)
	})
	for _, l := range q.Endpoints {
		b.ReportMetric(l.P99ms, l.Endpoint+"_p99_ms")
	}
	b.ReportMetric(q.Ratio, "service/plain")
}
