package platformsim_test

import (
	"net/http"
	"net/url"
	"runtime"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
)

// checkScale verifies the shape the scale scenario promises: counts, heavy
// tags, and shared-timestamp runs across a 1000-record boundary.
func checkScale(tb testing.TB, sim *platformsim.Sim, sc platformsim.Scale) {
	tb.Helper()
	truth := sim.Truth()
	if got, want := len(truth.Repos), sc.Repos; got != want {
		tb.Fatalf("repos=%d, want %d", got, want)
	}
	if got, want := len(truth.Tags), sc.Repos*sc.TagsPerRepo; got != want {
		tb.Fatalf("tags=%d, want %d", got, want)
	}
	if got, want := len(truth.Advisories), sc.Advisories; got != want {
		tb.Fatalf("advisories=%d, want %d", got, want)
	}
	records, heavy, straddling := 0, 0, 0
	for _, h := range truth.History {
		records += len(h)
		if len(h) > 5000 {
			heavy++
		}
		for b := 1000; b < len(h); b += 1000 {
			if h[b-1].UpdateTime.Equal(h[b].UpdateTime) {
				straddling++
			}
		}
		for i := 1; i < len(h); i++ {
			if h[i].UpdateTime.Before(h[i-1].UpdateTime) {
				tb.Fatalf("history not oldest first at %d", i)
			}
		}
	}
	want := (sc.Repos*sc.TagsPerRepo-sc.HeavyTags)*sc.HistoryPerTag + sc.HeavyTags*sc.HeavyHistory
	if records != want {
		tb.Fatalf("history records=%d, want %d", records, want)
	}
	if sc.HeavyHistory > 5000 && heavy != sc.HeavyTags {
		tb.Fatalf("tags with >5000 records=%d, want %d", heavy, sc.HeavyTags)
	}
	if sc.HeavyHistory > 1000 && straddling == 0 {
		tb.Fatalf("no shared-timestamp run across a 1000-record boundary")
	}
}

// TestScale_TwentiethScale generates 1/20 of the scale scenario and checks
// its shape, and that a heavy tag's history pages in windows of 1000.
func TestScale_TwentiethScale(t *testing.T) {
	full := platformsim.ScaleScenario()
	sc := platformsim.Scale{Repos: full.Repos / 20, TagsPerRepo: full.TagsPerRepo, HistoryPerTag: full.HistoryPerTag,
		Advisories: full.Advisories / 20, HeavyTags: 2, HeavyHistory: full.HeavyHistory}
	start := time.Now()
	e := newEnv(t, sc, func(o *platformsim.Options) { o.StartInclusive = true })
	t.Logf("generated 1/20 scale in %v", time.Since(start))
	checkScale(t, e.sim, sc)

	truth := e.sim.Truth()
	var heavyUID string
	for uid, h := range truth.History {
		if len(h) > 5000 {
			heavyUID = uid
			break
		}
	}
	var tag platformsim.TruthTag
	for _, tg := range truth.Tags {
		if tg.UID == heavyUID {
			tag = tg
		}
	}
	repo := e.get("/registry/v2/repos/" + tag.RepoUID)
	image := "acme/" + str(repo.body, "name")
	tok := e.registryToken(image, testToken)
	r := e.do(http.MethodGet, "/v2/"+image+"/_chainguard/history/"+url.PathEscape(tag.Name), tok, nil)
	e.mustStatus(r, http.StatusOK)
	if got := len(r.body["history"].([]any)); got != 1000 {
		t.Fatalf("first window=%d records, want 1000", got)
	}
}

// BenchmarkPopulateScale measures generating the scale scenario: 1,000
// repos, 50,000 tags, about 1,000,000 history records, 20,000 advisories.
func BenchmarkPopulateScale(b *testing.B) {
	sc := platformsim.ScaleScenario()
	for i := 0; i < b.N; i++ {
		runtime.GC()
		var before runtime.MemStats
		runtime.ReadMemStats(&before)
		start := time.Now()
		sim := platformsim.New(platformsim.Options{Seed: int64(i + 1)})
		sim.Populate(sc)
		elapsed := time.Since(start)
		runtime.GC()
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		b.ReportMetric(elapsed.Seconds(), "gen-s")
		b.ReportMetric(float64(after.HeapInuse)/(1<<20), "heap-MiB")
		b.ReportMetric(float64(after.HeapInuse-min(before.HeapInuse, after.HeapInuse))/(1<<20), "sim-heap-MiB")
		if i == 0 {
			b.StopTimer()
			checkScale(b, sim, sc)
			b.StartTimer()
		}
		runtime.KeepAlive(sim)
	}
}

// BenchmarkListTagsScale measures one 200-tag page over the whole scale
// organization (the simulator sorts every matching tag per request) and one
// page of a single repo's tags, the crawler's common request.
func BenchmarkListTagsScale(b *testing.B) {
	e := newEnv(b, platformsim.ScaleScenario(), nil)
	repo := e.sim.Truth().Repos[0].UID
	b.Run("AllTags", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			e.mustStatus(e.get("/registry/v2/tags?page_size=200"), http.StatusOK)
		}
	})
	b.Run("OneRepo", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			e.mustStatus(e.get("/registry/v2/tags?page_size=200&uidp.children_of="+repo), http.StatusOK)
		}
	})
}
