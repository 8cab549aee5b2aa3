package main

import (
	"io"
	"net/http"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// metricValue finds a sample in Prometheus text format; series is the name
// with its labels as exposed (labels sorted by name).
func metricValue(body, series string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			return f, err == nil
		}
	}
	return 0, false
}

func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestRun_MetricsAndReadiness scrapes /metrics after a crawl and a move, and
// watches /readyz turn unready while NATS is down and ready once it is back.
func TestRun_MetricsAndReadiness(t *testing.T) {
	sim, simURL := startSim(t, 31, platformsim.Scale{Repos: 2, TagsPerRepo: 3, HistoryPerTag: 3, Advisories: 4})
	ns := testutil.NATS(t)
	dbPath := filepath.Join(t.TempDir(), "syncd.db")
	adminLn := testutil.Listen(t)
	adminAddr := adminLn.Addr().String()
	cfg := testConfig{simURL: simURL, natsURL: ns.URL(), dbPath: dbPath, adminListen: adminAddr}.write(t)
	d := startDaemon(t, cfg, adminLn)
	base := "http://" + adminAddr
	waitBaseline(t, dbPath)
	tag := sim.Truth().Tags[0]
	sim.Advance(time.Second)
	if err := sim.MoveTag(tag.UID, "sha256:"+strings.Repeat("9", 64)); err != nil {
		t.Fatal(err)
	}
	var body string
	// The relay counts an event published when it is acknowledged, and
	// marks it in the outbox a moment later: the outbox is read once it
	// is empty again (read at the first count, it held 2 events, once in
	// about fifty runs).
	testutil.WaitFor(t, 20*time.Second, "the move to be published and the outbox empty", func() bool {
		_, body = httpGet(t, base+"/metrics")
		v, _ := metricValue(body, `syncd_events_published_total{type="tag.moved"}`)
		left, ok := metricValue(body, `syncd_outbox_unpublished_events`)
		return v >= 1 && ok && left == 0
	})
	for _, want := range []struct {
		series   string
		min, max float64
	}{
		{`syncd_platform_requests_total{code="200",endpoint="GET /registry/v2/repos"}`, 1, 1e6},
		{`syncd_platform_requests_total{code="200",endpoint="GET /v2/{image}/history"}`, 6, 1e6},
		{`syncd_crawl_runs_total{crawl_job="crawl",outcome="ok"}`, 1, 1e6},
		{`syncd_crawl_runs_total{crawl_job="advisories",outcome="ok"}`, 1, 1e6},
		{`syncd_rows_written_total{table="tags"}`, 6, 1e6},
		{`syncd_rows_written_total{table="advisories"}`, 4, 1e6},
		{`syncd_outbox_unpublished_events`, 0, 0},
		{`syncd_events_recorded_total{type="tag.moved"}`, 1, 1e6},
		{`syncd_nats_connected`, 1, 1},
		{`syncd_publish_latency_seconds_count`, 1, 1e6},
		{`syncd_crawl_duration_seconds_count{crawl_job="crawl"}`, 1, 1e6},
	} {
		v, ok := metricValue(body, want.series)
		if !ok || v < want.min || v > want.max {
			t.Errorf("%s = %v (found %v), want in [%v, %v]", want.series, v, ok, want.min, want.max)
		}
	}
	last, ok := metricValue(body, `syncd_crawl_last_success_timestamp_seconds{crawl_job="crawl"}`)
	if age := time.Since(time.Unix(int64(last), 0)); !ok || age < 0 || age > time.Minute {
		t.Errorf("last crawl success %v ago (found %v), want within a minute", age, ok)
	}
	if !strings.Contains(body, `syncd_build_info{version=`) {
		t.Error("no syncd_build_info")
	}
	if code, _ := httpGet(t, base+"/healthz"); code != 200 {
		t.Errorf("/healthz = %d", code)
	}
	testutil.WaitFor(
		t,
		10*time.Second,
		"/readyz to be ready",
		func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 },
	)

	// NATS goes away: not ready, and it says why.
	ns.Stop()
	var ready string
	testutil.WaitFor(t, 10*time.Second, "/readyz to fail with NATS down", func() bool {
		code, b := httpGet(t, base+"/readyz")
		ready = b
		return code == http.StatusServiceUnavailable
	})
	if !strings.Contains(ready, "nats") {
		t.Errorf("/readyz body %s does not name nats", ready)
	}
	// NATS is back on the same port and store: ready again.
	ns.Start()
	testutil.WaitFor(
		t,
		20*time.Second,
		"/readyz to recover",
		func() bool { code, _ := httpGet(t, base+"/readyz"); return code == 200 },
	)
	d.stop(t)
}
