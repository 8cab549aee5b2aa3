package bench

import (
	"context"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

// realisticResult is what the benchmark measures on an organization shaped
// like a real one: many tags a repo, drawn from a heavy tail, most of them
// date and epoch tags with one or two history records.
type realisticResult struct {
	Repos, Tags, HistoryRecords int
	Minimum                     minimum    `json:"minimum_requests"`
	MinimumTotal                int        `json:"minimum_requests_total"`
	FullSync                    syncResult `json:"full_sync"`
	RequestRatio                float64    `json:"request_ratio"`
	Memory                      memResult  `json:"memory"`
	// The latency-bound sync runs on the same organization at
	// LatencyScale of its size (LatencyTags tags, LatencyMinimum its
	// minimum): at full size its floor alone was 233 s of make bench's
	// 15 minutes.
	LatencyScale   float64        `json:"latency_scale"`
	LatencyTags    int            `json:"latency_tags"`
	LatencyMinimum minimum        `json:"latency_minimum_requests"`
	LatencySync    syncResult     `json:"latency_sync"`
	LatencyFloor   float64        `json:"latency_floor_s"`
	LatencyRatio   float64        `json:"latency_ratio"`
	LatencyCeiling latencyCeiling `json:"latency_ceiling"`
	// RequestsPerSecond is [crawl] requests_per_second's default, and
	// RateBoundHours the full sync's time under it: the minimum requests
	// divided by the rate, which the client's limiter holds exactly.
	RequestsPerSecond  float64    `json:"requests_per_second"`
	RateBoundHours     float64    `json:"rate_bound_hours"`
	Idle               syncResult `json:"idle_resync"`
	IdleLimit          int        `json:"idle_limit"`
	Moved              int        `json:"moved_tags"`
	Incremental        syncResult `json:"incremental_resync"`
	IncrementalMinimum int        `json:"incremental_minimum"`
	IncrementalRatio   float64    `json:"incremental_ratio"`
	// RateCurrent is a first sync of the LatencyScale organization at
	// RequestsPerSecond (no latency), stopped once its current state is
	// ready: its time to that against the listing floor at the rate
	// (listing pages ÷ rate; #31: at most 1.2).
	RateCurrentSeconds float64 `json:"rate_current_s"`
	RateCurrentFloor   float64 `json:"rate_current_floor_s"`
	RateCurrentRatio   float64 `json:"rate_current_ratio"`
}

// realisticScale is platformsim.RealisticScenario times f.
func realisticScale(f float64) platformsim.Scale {
	sc := platformsim.RealisticScenario()
	scale := func(n int) int { return max(1, int(math.Round(float64(n)*f))) }
	sc.Repos, sc.HeavyTags = scale(sc.Repos), scale(sc.HeavyTags)
	return sc
}

func measureRealistic(
	ctx context.Context,
	p params,
	dir string,
	progress func(string, ...any),
) (realisticResult, error) {
	var r realisticResult
	sc := realisticScale(p.Scale)
	progress("realistic organization: generating %d repos with about %d tags each", sc.Repos, sc.TagsPerRepo)
	o := startOrg(sc)
	defer o.Close()
	truth := o.sim.Truth()
	r.Repos, r.Tags = len(truth.Repos), len(truth.Tags)
	for _, h := range truth.History {
		r.HistoryRecords += len(h)
	}
	r.Minimum = minimumRequests(truth)
	r.MinimumTotal = r.Minimum.Total()
	tags := truth.Tags
	truth = platformsim.Truth{}

	progress("realistic organization: full sync of %d tags in a child process", r.Tags)
	mem, full, err := childSync(ctx, p, o, 1, filepath.Join(dir, "a"))
	if err != nil {
		return r, err
	}
	r.Memory, r.FullSync = mem, full
	r.RequestRatio = float64(full.Requests) / float64(r.MinimumTotal)
	r.RequestsPerSecond = config.Default().Crawl.RequestsPerSecond
	r.RateBoundHours = float64(r.MinimumTotal) / r.RequestsPerSecond / 3600

	a, err := openMirror(ctx, filepath.Join(dir, "a"), o.URL(), p.Concurrency, "none")
	if err != nil {
		return r, err
	}
	defer a.Close()
	progress("realistic organization: idle resync")
	if r.Idle, err = syncOnce(ctx, o, a); err != nil {
		return r, err
	}
	r.IdleLimit = r.Minimum.RepoPages + 2
	r.Moved = max(1, len(tags)/100)
	progress("realistic organization: incremental resync after moving %d tags", r.Moved)
	o.sim.Advance(time.Second)
	for i := range r.Moved {
		if err := o.sim.MoveTag(tags[(i*97)%len(tags)].UID, fmt.Sprintf("sha256:%064x", 0xb00+i)); err != nil {
			return r, err
		}
	}
	if r.Incremental, err = syncOnce(ctx, o, a); err != nil {
		return r, err
	}
	r.IncrementalMinimum = r.Minimum.RepoPages + (r.Moved+199)/200 + r.Moved
	r.IncrementalRatio = float64(r.Incremental.Requests) / float64(r.IncrementalMinimum)

	r.LatencyScale = realisticLatencyScale
	lsc := realisticScale(p.Scale * r.LatencyScale)
	progress(
		"realistic organization at %g of its size (%d repos, the same shape): latency-bound sync, %s per request, concurrency %d",
		r.LatencyScale,
		lsc.Repos,
		p.Latency,
		p.Concurrency,
	)
	lo := startOrg(lsc)
	defer lo.Close()
	lt := lo.sim.Truth()
	r.LatencyTags, r.LatencyMinimum = len(lt.Tags), minimumRequests(lt)
	lt = platformsim.Truth{}
	l, err := openMirror(ctx, filepath.Join(dir, "l"), lo.URL(), p.Concurrency, "none")
	if err != nil {
		return r, err
	}
	defer l.Close()
	lo.sim.SetFaults(platformsim.Fault{Pattern: "*", RespondAfter: p.Latency})
	r.LatencySync, err = syncOnce(ctx, lo, l)
	lo.sim.SetFaults()
	if err != nil {
		return r, err
	}
	floorRequests := r.LatencyMinimum.Total()
	r.LatencyFloor = float64(floorRequests) * p.Latency.Seconds() / float64(p.Concurrency)
	r.LatencyRatio = r.LatencySync.WallSeconds / r.LatencyFloor
	if r.LatencyCeiling, err = measureLatencyCeiling(ctx, lo, p, floorRequests, r.LatencySync.WallSeconds); err != nil {
		return r, err
	}

	progress("realistic organization at %g of its size: first sync at %g requests/s until its current state is ready",
		r.LatencyScale, r.RequestsPerSecond)
	r.RateCurrentSeconds, r.RateCurrentFloor, err = rateCurrent(ctx, lo, r.LatencyMinimum, p.Concurrency,
		r.RequestsPerSecond, filepath.Join(dir, "rate"))
	if err != nil {
		return r, err
	}
	r.RateCurrentRatio = r.RateCurrentSeconds / r.RateCurrentFloor
	return r, nil
}

// rateCurrent runs a first sync of o, whose minimum requests are m, at
// rps requests a second until its current state is ready, and returns
// how long that took and its floor: the listing pages over the rate.
func rateCurrent(
	ctx context.Context,
	o *org,
	m minimum,
	concurrency int,
	rps float64,
	dir string,
) (seconds, floor float64, err error) {
	floor = float64(m.RepoPages+m.TagPages+m.AdvisoryPages) / rps
	rc, err := openLimitedMirror(ctx, dir, o.URL(), concurrency, rps, "none")
	if err != nil {
		return 0, floor, err
	}
	defer rc.Close()
	seconds, err = syncUntilCurrent(ctx, rc, time.Duration(3*floor*float64(time.Second)))
	return seconds, floor, err
}

// BenchmarkRateCurrent is the realistic organization's "current ready at
// the default rate" row alone, b.N times, at LatencyScale of its size
// (BENCH_SCALE scales that):
//
//	go test -run '^$' -bench '^BenchmarkRateCurrent$' -benchtime 1x ./bench/
func BenchmarkRateCurrent(b *testing.B) {
	p, dir := setUp(b)
	ctx := context.Background()
	o := startOrg(realisticScale(p.Scale * realisticLatencyScale))
	defer o.Close()
	m := minimumRequests(o.sim.Truth())
	rps := config.Default().Crawl.RequestsPerSecond
	for i := range b.N {
		seconds, floor, err := rateCurrent(ctx, o, m, p.Concurrency, rps, filepath.Join(dir, fmt.Sprintf("rate-%d", i)))
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(os.Stderr, "current ready at %g requests/s: %.2f s, floor %.2f s (%d listing pages): ratio %.3f\n",
			rps, seconds, floor, m.RepoPages+m.TagPages+m.AdvisoryPages, seconds/floor)
		b.ReportMetric(seconds/floor, "current/floor")
	}
}

// realisticLatencyScale is the share of the realistic organization the
// latency-bound sync runs on.
const realisticLatencyScale = 0.25
