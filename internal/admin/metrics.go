package admin

import (
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics holds every series syncd exports.
type Metrics struct {
	reg *prometheus.Registry

	requests       *prometheus.CounterVec
	retries        *prometheus.CounterVec
	crawlDuration  *prometheus.HistogramVec
	crawlRuns      *prometheus.CounterVec
	lastSuccess    *prometheus.GaugeVec
	rows           *prometheus.CounterVec
	recorded       *prometheus.CounterVec
	published      *prometheus.CounterVec
	publishLatency prometheus.Histogram
	streamRepaired prometheus.Counter
	streamSweeps   *prometheus.CounterVec
	rejected       *prometheus.CounterVec
}

// NewMetrics registers syncd's series, and the Go and process collectors, on
// a registry of its own.
func NewMetrics(version string) *Metrics {
	reg := prometheus.NewRegistry()
	m := &Metrics{
		reg: reg,
		requests: prometheus.NewCounterVec(
			prometheus.CounterOpts{Name: "syncd_platform_requests_total",
				Help: "HTTP requests to the platform and registry, by endpoint and status code (0: no answer)."},
			[]string{"endpoint", "code"},
		),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncd_platform_retries_total",
			Help: "Requests that were retries, by endpoint."}, []string{"endpoint"}),
		crawlDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "syncd_crawl_duration_seconds",
			Help: "How long each crawl job ran.", Buckets: prometheus.ExponentialBuckets(0.05, 2.5, 12)}, []string{"crawl_job"}),
		crawlRuns: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncd_crawl_runs_total",
			Help: "Crawl job runs by outcome (ok, partial, failed, canceled)."}, []string{"crawl_job", "outcome"}),
		lastSuccess: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "syncd_crawl_last_success_timestamp_seconds",
			Help: "Unix time of each job's last successful run: how fresh the mirror is."}, []string{"crawl_job"}),
		rows: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncd_rows_written_total",
			Help: "Upstream rows applied to the mirror, by table."}, []string{"table"}),
		recorded: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncd_events_recorded_total",
			Help: "Change events recorded in the outbox, by type."}, []string{"type"}),
		published: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncd_events_published_total",
			Help: "Events acknowledged by JetStream, by type."}, []string{"type"}),
		publishLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "syncd_publish_latency_seconds",
			Help:    "From an event's commit to its JetStream acknowledgement.",
			Buckets: prometheus.ExponentialBuckets(0.001, 3, 12),
		}),
		streamRepaired: prometheus.NewCounter(prometheus.CounterOpts{Name: "syncd_stream_repaired_total",
			Help: "Events the mirror marks published that the stream audit found missing from the stream and published again."}),
		streamSweeps: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "syncd_stream_sweeps_total",
			Help: "Audits that checked the whole event log again, by why: the stream created again, its tail gone, " +
				"messages gone between its first and last, or [verify] sweep_every."}, []string{"reason"}),
		rejected: prometheus.NewCounterVec(
			prometheus.CounterOpts{Name: "syncd_rejected_messages_total",
				Help: "Messages and snapshots read back from NATS that were set aside, by reason (docs/reliability.md, Trust)."},
			[]string{"reason"},
		),
	}
	build := prometheus.NewGauge(
		prometheus.GaugeOpts{
			Name:        "syncd_build_info",
			Help:        "syncd's version.",
			ConstLabels: prometheus.Labels{"version": version},
		},
	)
	build.Set(1)
	// The series dashboards and alerts read exist from the start, at zero,
	// rather than from the first retry or failed run on: "No data" looks
	// like a broken scrape.
	for _, ep := range []string{
		"GET /registry/v2/repos",
		"GET /registry/v2/tags",
		"GET /v2/{image}/history",
		"GET /vulnerabilities/v2/advisories",
	} {
		m.retries.WithLabelValues(ep)
	}
	for _, reason := range []string{"unsigned", "bad_signature"} {
		m.rejected.WithLabelValues(reason)
	}
	for _, reason := range []string{"recreated", "tail_lost", "messages_gone", "scheduled"} {
		m.streamSweeps.WithLabelValues(reason)
	}
	for _, job := range []string{"crawl", "sweep", "advisories"} {
		for _, outcome := range []string{"ok", "partial", "failed", "canceled"} {
			m.crawlRuns.WithLabelValues(job, outcome)
		}
	}
	reg.MustRegister(
		m.requests,
		m.retries,
		m.crawlDuration,
		m.crawlRuns,
		m.lastSuccess,
		m.rows,
		m.recorded,
		m.published,
		m.publishLatency,
		m.streamRepaired,
		m.streamSweeps,
		m.rejected,
		build,
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	return m
}

// Registry returns the registry, for tests and for registering more series.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// ObserveRequest counts one HTTP request to the platform or registry.
func (m *Metrics) ObserveRequest(endpoint string, code int, retry bool) {
	m.requests.WithLabelValues(endpoint, strconv.Itoa(code)).Inc()
	if retry {
		m.retries.WithLabelValues(endpoint).Inc()
	}
}

// ObserveRun records one finished crawl job.
func (m *Metrics) ObserveRun(job, outcome string, took time.Duration, finished time.Time, rows map[string]int64) {
	m.crawlDuration.WithLabelValues(job).Observe(took.Seconds())
	m.crawlRuns.WithLabelValues(job, outcome).Inc()
	// A partial run finished: everything but the failed scopes (counted by
	// syncd_crawl_failures) is as fresh as after an ok run.
	if outcome == "ok" || outcome == "partial" {
		m.lastSuccess.WithLabelValues(job).Set(float64(finished.UnixNano()) / 1e9)
	}
	for table, n := range rows {
		if n > 0 {
			m.rows.WithLabelValues(table).Add(float64(n))
		}
	}
}

// EventsRecorded counts events appended to the outbox, by type.
func (m *Metrics) EventsRecorded(byType map[string]int) {
	for typ, n := range byType {
		m.recorded.WithLabelValues(typ).Add(float64(n))
	}
}

// EventPublished counts an event JetStream acknowledged, latency after its commit.
func (m *Metrics) EventPublished(typ string, latency time.Duration) {
	m.published.WithLabelValues(typ).Inc()
	m.publishLatency.Observe(latency.Seconds())
}

// StreamRepaired counts an event the stream audit published again.
func (m *Metrics) StreamRepaired() { m.streamRepaired.Inc() }

// StreamSwept counts an audit that checked the whole event log again,
// and why (publish.SweepRecreated and the like).
func (m *Metrics) StreamSwept(reason string) { m.streamSweeps.WithLabelValues(reason).Inc() }

// MessageRejected counts a message or snapshot read back from NATS that
// was set aside, and why.
func (m *Metrics) MessageRejected(reason string) { m.rejected.WithLabelValues(reason).Inc() }

// GaugeFunc registers a gauge read at every scrape.
func (m *Metrics) GaugeFunc(name, help string, fn func() float64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, fn))
}

// GaugeFuncWith registers a labelled gauge read at every scrape.
func (m *Metrics) GaugeFuncWith(name, help string, labels prometheus.Labels, fn func() float64) {
	m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels}, fn))
}

// CounterFunc registers a counter read at every scrape, labelled.
func (m *Metrics) CounterFunc(name, help string, labels prometheus.Labels, fn func() float64) {
	m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels}, fn))
}
