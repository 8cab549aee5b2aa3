package query_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// BenchmarkService measures tag.at and digest.where through NATS on a
// mirror of a simulated organization: the latency of each at a fixed
// request rate (p50, p99), and the service's throughput as a ratio to a
// plain loop of the same SQLite queries in the same run.
//
//	go test -run '^$' -bench BenchmarkService -benchtime 1x ./internal/query/
func BenchmarkService(b *testing.B) {
	sc := platformsim.Scale{Repos: 100, TagsPerRepo: 10, HistoryPerTag: 100, PublicImages: -1}
	w := mirrorOf(b, sc)
	sim, st := w.sim, w.store
	start := time.Now()
	w.crawl(b)
	var rows int
	st.Reader().QueryRow(`SELECT COUNT(*) FROM tag_history`).Scan(&rows)
	b.Logf("mirror: %d history rows, crawled in %s", rows, time.Since(start).Round(time.Millisecond))

	ns := testutil.NATS(b)
	pos := query.NewPosition()
	pos.Advance(1)
	qs := st.Queries()
	b.Cleanup(func() { qs.Close() })
	svc := query.New(connect(b, ns.URL()), qs, pos, query.Config{Prefix: prefix})
	if err := svc.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(svc.Stop)
	c := &query.Client{NC: connect(b, ns.URL()), Prefix: prefix}

	all := testutil.TagsWithHistory(sim.Truth())
	rng := rand.New(rand.NewPCG(1, 2))
	tagAt := func() (string, any) {
		tt := all[rng.IntN(len(all))]
		h := tt.History[rng.IntN(len(tt.History))]
		return query.TagAt, query.TagAtRequest{
			Repo: tt.Path,
			Tag:  tt.Tag.Name,
			Time: h.UpdateTime.Add(time.Second).Format(time.RFC3339Nano),
		}
	}
	digestWhere := func() (string, any) {
		tt := all[rng.IntN(len(all))]
		return query.DigestWhere, query.DigestWhereRequest{Digest: tt.History[rng.IntN(len(tt.History))].Digest}
	}
	for _, ep := range []struct {
		name string
		next func() (string, any)
	}{{"tag.at", tagAt}, {"digest.where", digestWhere}} {
		atRate(b, c, ep.next, 500, time.Second) // warm-up: page cache, connections
		p50, p99 := atRate(b, c, ep.next, 500, 3*time.Second)
		b.ReportMetric(p50, ep.name+"_p50_ms")
		b.ReportMetric(p99, ep.name+"_p99_ms")
		b.Logf("%s at 500 req/s: p50 %.2f ms, p99 %.2f ms", ep.name, p50, p99)
	}

	// Throughput: 16 clients through NATS against 4 goroutines reading the
	// mirror directly, the service's own concurrency, on the same requests.
	reqs := make([]query.TagAtRequest, 4096)
	for i := range reqs {
		_, r := tagAt()
		reqs[i] = r.(query.TagAtRequest)
	}
	served := throughput(16, 2*time.Second, func(i int) error {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return c.Do(ctx, query.TagAt, reqs[i%len(reqs)], &query.TagAtReply{})
	})
	plain := throughput(4, 2*time.Second, func(i int) error { return plainTagAt(qs, reqs[i%len(reqs)]) })
	b.ReportMetric(served, "service_req/s")
	b.ReportMetric(plain, "plain_req/s")
	b.ReportMetric(served/plain, "ratio")
	b.Logf("tag.at throughput: service %.0f req/s, plain loop %.0f req/s, ratio %.2f", served, plain, served/plain)
}

// plainTagAt is tag.at's reading, without NATS or the service (which
// checks the mirror's readiness only until it is ready).
func plainTagAt(st query.Mirror, r query.TagAtRequest) error {
	at, err := time.Parse(time.RFC3339Nano, r.Time)
	if err != nil {
		return err
	}
	ctx := context.Background()
	return st.ReadMirror(ctx, func(rd *store.MirrorRead) error {
		repo, _, err := rd.Repo(ctx, r.Repo)
		if err != nil {
			return err
		}
		tag, _, err := rd.Tag(ctx, repo.UID, r.Tag)
		if err != nil {
			return err
		}
		rec, ok, err := rd.RecordAt(ctx, tag.UID, at)
		if err != nil || !ok {
			return fmt.Errorf("no record: %v", err)
		}
		_, _, err = rd.NextRecord(ctx, tag.UID, rec.Seq)
		return err
	})
}

// atRate sends requests at rate per second for d, each on its own
// goroutine, and returns the p50 and p99 latency in milliseconds.
func atRate(b *testing.B, c *query.Client, next func() (string, any), rate int, d time.Duration) (p50, p99 float64) {
	b.Helper()
	var mu sync.Mutex
	var lat []time.Duration
	var failed atomic.Int64
	var wg sync.WaitGroup
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for end := time.Now().Add(d); time.Now().Before(end); {
		<-tick.C
		ep, req := next()
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			t0 := time.Now()
			if err := c.Do(ctx, ep, req, nil); err != nil {
				failed.Add(1)
				return
			}
			mu.Lock()
			lat = append(lat, time.Since(t0))
			mu.Unlock()
		}()
	}
	wg.Wait()
	if n := failed.Load(); n > 0 {
		b.Errorf("%d requests failed", n)
	}
	slices.Sort(lat)
	ms := func(q float64) float64 { return float64(lat[int(q*float64(len(lat)-1))]) / 1e6 }
	return ms(0.5), ms(0.99)
}

// throughput runs fn on n goroutines for d and returns calls per second.
func throughput(n int, d time.Duration, fn func(i int) error) float64 {
	var done atomic.Int64
	var wg sync.WaitGroup
	end := time.Now().Add(d)
	for g := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := g; time.Now().Before(end); i += n {
				if fn(i) == nil {
					done.Add(1)
				}
			}
		}()
	}
	wg.Wait()
	return float64(done.Load()) / d.Seconds()
}
