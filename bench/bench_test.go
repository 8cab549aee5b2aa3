package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/publish"
)

// results is what one run measured; make bench writes it to results.json.
type results struct {
	Machine machine `json:"machine"`
	Params  params  `json:"params"`
	Org     struct {
		Repos, Tags, HistoryRecords, Advisories int
	} `json:"org"`
	Minimum      minimum `json:"minimum_requests"`
	MinimumTotal int     `json:"minimum_requests_total"`

	FullSync          syncResult `json:"full_sync"`
	RowsPerSec        float64    `json:"rows_per_s"`
	CeilingRowsPerSec float64    `json:"sqlite_ceiling_rows_per_s"`
	// CeilingDeferredRowsPerSec is the same loop with the history's
	// indexes by time and digest built after the rows, the build timed:
	// how a crawl's baseline and a follower catching up from nothing write
	// them. A reference beside the ceiling, not a target's.
	CeilingDeferredRowsPerSec float64 `json:"sqlite_ceiling_deferred_rows_per_s"`
	IngestRatio               float64 `json:"ingest_ratio"`
	// PerTagTxRowsPerSec is the same loop with one transaction per tag,
	// the unit in which the store's ApplyHistory writes: what ingest could
	// reach with the store as it is. It runs on a tenth of the rows.
	PerTagTxRowsPerSec float64 `json:"sqlite_per_tag_tx_rows_per_s"`
	RequestRatio       float64 `json:"request_ratio"`

	LatencySync  syncResult `json:"latency_sync"`
	LatencyFloor float64    `json:"latency_floor_s"`
	LatencyRatio float64    `json:"latency_ratio"`
	// LatencyCeiling is the same sync's ratio to a plain loop of its
	// requests, and MachineLatencyRatio a bare net/http pair's ratio to its
	// own floor: what the machine leaves of the floor before syncd or the
	// simulator does anything.
	LatencyCeiling      latencyCeiling `json:"latency_ceiling"`
	MachineLatencyRatio float64        `json:"machine_latency_ratio"`

	Idle syncResult `json:"idle_resync"`
	// IdleLimit is the most requests an idle crawl may make: the repo
	// pages and two more (one page of recently updated tags, and one spare).
	IdleLimit   int        `json:"idle_limit"`
	Moved       int        `json:"moved_tags"`
	Incremental syncResult `json:"incremental_resync"`
	// IncrementalMinimum is the fewest requests after Moved moves: the repo
	// pages, ceil(moved/200) tag pages and one history read per move.
	IncrementalMinimum int     `json:"incremental_minimum"`
	IncrementalRatio   float64 `json:"incremental_ratio"`

	// Advisories is the advisories job after 1% of the advisories moved.
	Advisories advisoryResult `json:"advisories_job"`

	// Query is the query service on the full sync's mirror: each
	// endpoint's latency at a fixed rate, and its throughput against a
	// plain loop of the same reads.
	Query queryResult `json:"query"`

	Relay relayResult `json:"relay"`
	// Follow is a follower joining after the baseline, and a snapshot of
	// the full mirror written and restored.
	Follow followResult `json:"follow"`
	Push   pushResult   `json:"push"`
	// KV is the relay keeping the KV buckets: its rate against Relay's,
	// and the pushes timed to the bucket.
	KV kvResult `json:"kv"`
	// SyncInterval is the relay against an embedded server with each
	// JetStream sync_interval.
	SyncInterval syncIntervalResult `json:"sync_interval"`
	// Verify is what the replicas' verification costs: checkpoints and the
	// stream audit the relay, the replica digest's triggers the writer.
	Verify verifyResult `json:"verify"`

	Memory       []memResult `json:"memory"`
	MemoryGrowth float64     `json:"memory_growth_1x_to_4x"`

	// Realistic is the same set of measures on an organization shaped
	// like a real one (platformsim.RealisticScenario).
	Realistic realisticResult `json:"realistic"`

	Targets []target `json:"targets"`
	Total   float64  `json:"total_s"`
}

type machine struct {
	CPUs      int    `json:"nproc"`
	CPU       string `json:"cpu"`
	Go        string `json:"go"`
	LoadStart string `json:"loadavg_at_start"`
	Date      string `json:"date"`
}

func thisMachine() machine {
	m := machine{CPUs: runtime.NumCPU(), Go: runtime.Version(), Date: time.Now().UTC().Format(time.RFC3339)}
	if b, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "model name"); ok {
				m.CPU = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(v), ":"))
				break
			}
		}
	}
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		m.LoadStart = strings.Join(strings.Fields(string(b))[:3], " ")
	}
	return m
}

// target is one of the targets and whether this run met it.
type target struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Want  string  `json:"want"`
	Met   bool    `json:"met"`
}

// BenchmarkSyncd measures syncd against the limits of the machine and of
// the API, every figure in one run, and prints one table. It runs once
// whatever b.N is (make bench passes -benchtime 1x): each phase already
// moves a million rows.
func BenchmarkSyncd(b *testing.B) {
	p, dir := setUp(b)
	ctx := context.Background()
	began := time.Now()
	var r results
	r.Machine, r.Params = thisMachine(), p
	progress := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "bench %6.1fs: %s\n", time.Since(began).Seconds(), fmt.Sprintf(format, args...))
	}

	sc := orgScale(p.Scale)
	progress("generating the organization: %d repos x %d tags, %d advisories", sc.Repos, sc.TagsPerRepo, sc.Advisories)
	o := startOrg(sc)
	defer o.Close()
	truth := o.sim.Truth()
	r.Org.Repos, r.Org.Tags, r.Org.Advisories = len(truth.Repos), len(truth.Tags), len(truth.Advisories)
	for _, h := range truth.History {
		r.Org.HistoryRecords += len(h)
	}
	r.Minimum = minimumRequests(truth)
	r.MinimumTotal = r.Minimum.Total()
	truth = platformsim.Truth{}

	progress("SQLite ceiling: %d rows, %d per transaction", r.Org.HistoryRecords, ceilingRowsPerTx)
	var err error
	if r.CeilingRowsPerSec, err = sqliteCeiling(ctx, dir, r.Org.HistoryRecords, r.Org.Tags, ceilingRowsPerTx); err != nil {
		b.Fatal(err)
	}
	progress("SQLite ceiling with the history indexes built after the rows")
	if r.CeilingDeferredRowsPerSec, err = sqliteCeilingDeferred(ctx, dir, r.Org.HistoryRecords, r.Org.Tags,
		ceilingRowsPerTx); err != nil {
		b.Fatal(err)
	}
	perTag := (r.Org.HistoryRecords + r.Org.Tags - 1) / r.Org.Tags
	progress("SQLite with one transaction per tag: %d rows", r.Org.HistoryRecords/10)
	if r.PerTagTxRowsPerSec, err = sqliteCeiling(ctx, dir, r.Org.HistoryRecords/10, r.Org.Tags/10, perTag); err != nil {
		b.Fatal(err)
	}

	// The full sync runs in a child process, which measures its peak
	// memory too (the first of the three sizes); its mirror stays for the
	// resyncs.
	progress("full initial sync in a child process, concurrency %d", p.Concurrency)
	aDir := filepath.Join(dir, "a")
	mem1, full, err := childSync(ctx, p, o, 1, aDir)
	if err != nil {
		b.Fatal(err)
	}
	r.Memory, r.FullSync = append(r.Memory, mem1), full
	r.RowsPerSec = float64(r.FullSync.HistoryRows) / r.FullSync.WallSeconds
	r.IngestRatio = r.RowsPerSec / r.CeilingRowsPerSec
	r.RequestRatio = float64(r.FullSync.Requests) / float64(r.MinimumTotal)
	a, err := openMirror(ctx, aDir, o.URL(), p.Concurrency, "none")
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()

	progress("idle resync")
	if r.Idle, err = syncOnce(ctx, o, a); err != nil {
		b.Fatal(err)
	}

	tags := o.sim.Truth().Tags
	r.Moved = max(1, len(tags)/100)
	r.IdleLimit = r.Minimum.RepoPages + 2
	r.IncrementalMinimum = r.Minimum.RepoPages + (r.Moved+199)/200 + r.Moved
	progress("incremental resync after moving %d tags", r.Moved)
	o.sim.Advance(time.Second)
	for i := range r.Moved {
		if err := o.sim.MoveTag(tags[(i*97)%len(tags)].UID, fmt.Sprintf("sha256:%064x", 0xa00+i)); err != nil {
			b.Fatal(err)
		}
	}
	if r.Incremental, err = syncOnce(ctx, o, a); err != nil {
		b.Fatal(err)
	}
	r.IncrementalRatio = float64(r.Incremental.Requests) / float64(r.IncrementalMinimum)

	progress("advisories job after 1%% of the advisories took a lifecycle step")
	if r.Advisories, err = measureAdvisories(ctx, o, a); err != nil {
		b.Fatal(err)
	}
	r.Advisories.FullSyncRequests = r.FullSync.AdvisoryRequests

	progress(
		"query service on the mirror: each endpoint at %d req/s, then %d clients against a plain loop of the same reads",
		queryRate,
		queryClients,
	)
	if r.Query, err = measureQuery(ctx, a.store, o.sim.Truth()); err != nil {
		b.Fatal(err)
	}

	progress("latency-bound sync: %s per request, concurrency %d", p.Latency, p.Concurrency)
	// A snapshot mirror: its first sync fills the outbox the relay is
	// measured on (one created event per repo, tag and advisory).
	l, err := openMirror(ctx, filepath.Join(dir, "l"), o.URL(), p.Concurrency, "snapshot")
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	o.sim.SetFaults(platformsim.Fault{Pattern: "*", RespondAfter: p.Latency})
	r.LatencySync, err = syncOnce(ctx, o, l)
	o.sim.SetFaults()
	if err != nil {
		b.Fatal(err)
	}
	r.LatencyFloor = float64(r.MinimumTotal) * p.Latency.Seconds() / float64(p.Concurrency)
	r.LatencyRatio = r.LatencySync.WallSeconds / r.LatencyFloor
	progress("latency-bound sync's ceilings: a plain loop of its requests, a bare net/http pair")
	if r.LatencyCeiling, err = measureLatencyCeiling(ctx, o, p, r.MinimumTotal, r.LatencySync.WallSeconds); err != nil {
		b.Fatal(err)
	}
	if r.MachineLatencyRatio, err = measureMachineLatency(ctx, p.Concurrency, p.Latency, machineRequests); err != nil {
		b.Fatal(err)
	}

	pcfg := publishConfig(filepath.Join(dir, "nats"), o.URL()+"/org1")
	conn, err := publish.Connect(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	kvCopy := filepath.Join(dir, "kv.db")
	if err := copyMirror(ctx, filepath.Join(dir, "l", "syncd.db"), kvCopy); err != nil {
		b.Fatal(err)
	}
	progress("relay against a plain JetStream publish loop")
	if r.Relay, err = measureRelay(ctx, conn, l.store, pcfg); err != nil {
		b.Fatal(err)
	}
	progress("relay keeping the KV buckets, on the same events")
	if r.KV, err = measureRelayKV(ctx, conn, kvCopy, pcfg, r.Relay); err != nil {
		b.Fatal(err)
	}

	syncEvents := max(200, int(4000*p.Scale))
	progress("relay against embedded servers with sync_interval 2m, 1s and always: %d events each", syncEvents)
	if r.SyncInterval, err = measureSyncInterval(ctx, syncEvents); err != nil {
		b.Fatal(err)
	}

	progress(
		"checkpoints and the stream audit against the plain relay, %d events each; the writer with and without the replica digest's triggers",
		verifyPass*max(40, int(80*p.Scale)),
	)
	if r.Verify, err = measureVerify(ctx, conn, filepath.Join(dir, "verify"), p.Scale); err != nil {
		b.Fatal(err)
	}

	if p.Follow {
		progress("a follower joining after the baseline; a snapshot of the full mirror written and restored")
		if r.Follow, err = measureFollow(ctx, conn, a.store, pcfg, filepath.Join(dir, "follow"),
			r.CeilingRowsPerSec); err != nil {
			b.Fatal(err)
		}
	}

	progress("push to NATS: %d moves one at a time", p.Pushes)
	if r.Push, err = measurePush(ctx, o, a, conn, pcfg, p.Pushes); err != nil {
		b.Fatal(err)
	}
	r.KV.PushP50ms, r.KV.PushP99ms = quantileMs(r.Push.kv, 0.50), quantileMs(r.Push.kv, 0.99)
	// The memory runs generate bigger organizations: free this one first.
	o.Close()

	for _, f := range []float64{2, 4} {
		sc := orgScale(p.Scale * f)
		progress("peak memory: generating the organization at %gx (%d repos), a child process syncs it", f, sc.Repos)
		big := startOrg(sc)
		m, _, err := childSync(ctx, p, big, f, filepath.Join(dir, fmt.Sprintf("mem%g", f)))
		big.Close()
		if err != nil {
			b.Fatal(err)
		}
		r.Memory = append(r.Memory, m)
	}
	r.MemoryGrowth = r.Memory[2].PeakMB/r.Memory[0].PeakMB - 1
	if r.Realistic, err = measureRealistic(ctx, p, filepath.Join(dir, "realistic"), progress); err != nil {
		b.Fatal(err)
	}
	r.Total = time.Since(began).Seconds()
	r.Targets = targets(r)

	printTable(os.Stdout, r)
	name := "results.json"
	if p.Scale != 1 {
		name = "results-quick.json"
	}
	out, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		b.Fatal(err)
	}
	if err := os.WriteFile(name, append(out, '\n'), 0o644); err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(r.IngestRatio, "ingest/ceiling")
	b.ReportMetric(r.LatencyRatio, "latency/floor")
}

// setUp reads the run's parameters and makes its data directory, which
// goes when the benchmark ends.
func setUp(b *testing.B) (params, string) {
	p, err := paramsFromEnv()
	if err != nil {
		b.Fatal(err)
	}
	dir, err := dataDir()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { os.RemoveAll(dir) })
	return p, dir
}

// dataDir makes the directory for the run's databases and NATS storage
// under BENCH_DIR, by default /dev/shm where there is one: on a shared
// machine the disk's contention would swamp what the benchmark measures,
// and ceilings and syncd share whatever storage is used.
func dataDir() (string, error) {
	base := os.Getenv("BENCH_DIR")
	if base == "" {
		base = os.TempDir()
		if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
			base = "/dev/shm"
		}
	}
	return os.MkdirTemp(base, "syncd-bench-")
}

// startProfile writes a CPU profile of the full initial sync to path, when
// path is set (BENCH_CPUPROFILE), for finding what bounds ingest.
func startProfile(path string) (stop func(), err error) {
	if path == "" {
		return func() {}, nil
	}
	f, err := os.Create(path)
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, err
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

// overBarePair is a latency-bound ratio over the same run's bare net/http
// pair's (#31: the machine's own share taken out); 0 when that was not
// measured.
func (r results) overBarePair(ratio float64) float64 {
	if r.MachineLatencyRatio <= 0 {
		return 0
	}
	return ratio / r.MachineLatencyRatio
}

func targets(r results) []target {
	ts := []target{
		{"requests / minimum", r.RequestRatio, "<= 1.01", r.RequestRatio <= 1.01},
		{"ingest / SQLite ceiling", r.IngestRatio, ">= 0.5", r.IngestRatio >= 0.5},
		{"relay / JetStream ceiling", r.Relay.RatioToCeiling, ">= 0.7", r.Relay.RatioToCeiling >= 0.7},
		{"follower apply / SQLite ceiling", r.Follow.RowsRatio, ">= 0.6", r.Follow.RowsRatio >= 0.6},
		{
			"snapshot restore / decompress to disk",
			r.Follow.SnapshotRestoreRatio,
			"<= 1.5",
			r.Follow.SnapshotRestoreRatio <= 1.5 && r.Follow.SnapshotRestoreRatio > 0,
		},
		{"relay with KV / plain relay", r.KV.RatioToPlain, ">= 0.8", r.KV.RatioToPlain >= 0.8},
		{"relay with checkpoints / without", r.Verify.CheckpointRatio, ">= 0.95", r.Verify.CheckpointRatio >= 0.95},
		{"relay with audits at audit_every / without", r.Verify.AuditRatio, ">= 0.95", r.Verify.AuditRatio >= 0.95},
		{"writer time with digest triggers / without", r.Verify.Writer.Ratio, "<= 1.05", r.Verify.Writer.Ratio <= 1.05},
		{"idle resync history requests", float64(r.Idle.HistoryRequests), "0", r.Idle.HistoryRequests == 0},
		{"idle resync requests", float64(r.Idle.Requests), fmt.Sprintf("<= %d", r.IdleLimit), r.Idle.Requests <= r.IdleLimit},
		{"incremental requests / minimum", r.IncrementalRatio, "<= 1.02", r.IncrementalRatio <= 1.02},
		{"advisories job requests / minimum", r.Advisories.Ratio, "<= 1.02", r.Advisories.Ratio <= 1.02},
		{"latency-bound sync / floor", r.LatencyRatio, "<= 1.05", r.LatencyRatio <= 1.05},
		{"latency-bound / floor, over the bare pair's", r.overBarePair(r.LatencyRatio), "<= 1.03",
			r.overBarePair(r.LatencyRatio) <= 1.03 && r.MachineLatencyRatio > 0},
		{"push-to-NATS p99 (ms)", r.Push.P99ms, "<= 50", r.Push.P99ms <= 50},
		{"peak memory at 1x (MB)", r.Memory[0].PeakMB, "<= 200", r.Memory[0].PeakMB <= 200},
		{"peak memory growth 1x -> 4x", r.MemoryGrowth, "< 0.15", r.MemoryGrowth < 0.15},
		{"realistic: requests / minimum", r.Realistic.RequestRatio, "<= 1.01", r.Realistic.RequestRatio <= 1.01},
		{
			"realistic: idle requests",
			float64(r.Realistic.Idle.Requests),
			fmt.Sprintf("<= %d", r.Realistic.IdleLimit),
			r.Realistic.Idle.Requests <= r.Realistic.IdleLimit,
		},
		{"realistic: incremental / minimum", r.Realistic.IncrementalRatio, "<= 1.02", r.Realistic.IncrementalRatio <= 1.02},
		{"realistic: latency-bound / floor", r.Realistic.LatencyRatio, "<= 1.05", r.Realistic.LatencyRatio <= 1.05},
		{"realistic: latency-bound / floor, over the bare pair's", r.overBarePair(r.Realistic.LatencyRatio),
			"<= 1.03", r.overBarePair(r.Realistic.LatencyRatio) <= 1.03 && r.MachineLatencyRatio > 0},
		{"realistic: peak memory (MB)", r.Realistic.Memory.PeakMB, "<= 200", r.Realistic.Memory.PeakMB <= 200},
		{
			"realistic: current ready at the default rate / listing floor",
			r.Realistic.RateCurrentRatio,
			"<= 1.2",
			r.Realistic.RateCurrentRatio > 0 && r.Realistic.RateCurrentRatio <= 1.2,
		},
	}
	return append(ts, queryTargets(r.Query)...)
}

func printTable(w io.Writer, r results) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	row := func(cols ...string) { fmt.Fprintln(tw, strings.Join(cols, "\t")) }
	f := func(format string, args ...any) string { return fmt.Sprintf(format, args...) }
	status := map[string]string{}
	for _, t := range r.Targets {
		s := "MISSED"
		if t.Met {
			s = "met"
		}
		status[t.Name] = f("%s %s", t.Want, s)
	}
	fmt.Fprintf(w, "\nsyncd benchmarks: %d repos, %d tags, %d history records, %d advisories (scale %g); concurrency %d\n",
		r.Org.Repos, r.Org.Tags, r.Org.HistoryRecords, r.Org.Advisories, r.Params.Scale, r.Params.Concurrency)
	fmt.Fprintf(
		w,
		"machine: %d CPUs, %s, %s, load at start %s\n\n",
		r.Machine.CPUs,
		r.Machine.CPU,
		r.Machine.Go,
		r.Machine.LoadStart,
	)
	row("measure", "value", "ceiling / reference", "ratio", "target")
	row("full sync: wall", f("%.1f s", r.FullSync.WallSeconds), "", "", "")
	row(
		"full sync: history rows/s",
		f("%.0f", r.RowsPerSec),
		f("SQLite loop %.0f", r.CeilingRowsPerSec),
		f("%.2f", r.IngestRatio),
		status["ingest / SQLite ceiling"],
	)
	if r.CeilingDeferredRowsPerSec > 0 {
		row("  against the loop with the history indexes built after", "",
			f("SQLite loop %.0f", r.CeilingDeferredRowsPerSec), f("%.2f", r.RowsPerSec/r.CeilingDeferredRowsPerSec), "")
	}
	row(
		"  (SQLite loop, 1 tx per tag)",
		f("%.0f", r.PerTagTxRowsPerSec),
		"",
		f("%.2f", r.PerTagTxRowsPerSec/r.CeilingRowsPerSec),
		"",
	)
	row(
		"full sync: requests",
		f("%d", r.FullSync.Requests),
		f("minimum %d", r.MinimumTotal),
		f("%.3f", r.RequestRatio),
		status["requests / minimum"],
	)
	row(
		"  (minimum repo by repo, a token per image)",
		"",
		f("%d", r.Minimum.PerRepoTotal()),
		f("%.3f", float64(r.FullSync.Requests)/float64(r.Minimum.PerRepoTotal())),
		"",
	)
	row(
		f("latency sync (%s/req): wall", r.Params.Latency),
		f("%.1f s", r.LatencySync.WallSeconds),
		f("floor %.1f s", r.LatencyFloor),
		f("%.2f", r.LatencyRatio),
		status["latency-bound sync / floor"],
	)
	phaseRows(row, "  ", r.LatencySync, r.Minimum, r.LatencyFloor, r.Params.Latency)
	row(
		"  against its requests in a plain loop",
		f("%.2f ms a request", r.LatencyCeiling.PerRequestMs),
		f("ceiling %.1f s", r.LatencyCeiling.CeilingSeconds),
		f("%.2f", r.LatencyCeiling.Ratio),
		"",
	)
	row("  a bare net/http pair's own ratio", "", "", f("%.3f", r.MachineLatencyRatio), "")
	row("  the sync's ratio over the bare pair's", "", "", f("%.3f", r.overBarePair(r.LatencyRatio)),
		status["latency-bound / floor, over the bare pair's"])
	row(
		"idle resync: crawl requests",
		f("%d (history %d)", r.Idle.Requests, r.Idle.HistoryRequests),
		f("limit %d", r.IdleLimit),
		"",
		status["idle resync requests"]+"; history "+status["idle resync history requests"],
	)
	row("idle resync: wall", f("%.2f s", r.Idle.WallSeconds), "", "", "")
	row(
		"  advisories job beside it: requests",
		f("%d", r.Idle.AdvisoryRequests),
		f("minimum %d", r.Minimum.AdvisoryPages),
		"",
		"",
	)
	row(
		f("incremental (%d moved): crawl requests", r.Moved),
		f("%d (history %d)", r.Incremental.Requests, r.Incremental.HistoryRequests),
		f("minimum %d", r.IncrementalMinimum),
		f("%.3f", r.IncrementalRatio),
		status["incremental requests / minimum"],
	)
	row("incremental: wall", f("%.2f s", r.Incremental.WallSeconds), "", "", "")
	row(
		"full sync: advisory requests",
		f("%d", r.Advisories.FullSyncRequests),
		f("minimum %d", r.Advisories.Minimum),
		"",
		"",
	)
	row(
		f("advisories job (%d stepped): requests", r.Advisories.Steps),
		f("%d (list %d, get %d)", r.Advisories.Requests, r.Advisories.ListRequests, r.Advisories.GetRequests),
		f("minimum %d", r.Advisories.Minimum),
		f("%.3f", r.Advisories.Ratio),
		status["advisories job requests / minimum"],
	)
	row("advisories job: wall / events", f("%.2f s / %d", r.Advisories.WallSeconds, r.Advisories.Events), "", "", "")
	queryRows(row, status, r.Query)
	row(
		"relay: events/s",
		f("%.0f", r.Relay.RelayPerSec),
		f("JetStream loop %.0f", r.Relay.CeilingPerSec),
		f("%.2f", r.Relay.RatioToCeiling),
		status["relay / JetStream ceiling"],
	)
	fo := r.Follow
	if !r.Params.Follow {
		row("follower joining late, snapshots", "not run", "BENCH_FOLLOW=0", "", "")
	} else {
		row("follower joining late: rows/s applied", f("%.0f", fo.RowsPerSec), f("SQLite loop %.0f",
			r.CeilingRowsPerSec), f("%.2f", fo.RowsRatio), status["follower apply / SQLite ceiling"])
		if r.CeilingDeferredRowsPerSec > 0 {
			row("  against the loop with the history indexes built after", "",
				f("SQLite loop %.0f", r.CeilingDeferredRowsPerSec), f("%.2f", fo.RowsPerSec/r.CeilingDeferredRowsPerSec), "")
		}
		row("  events/s (history.recorded: a tag's history)", f("%.0f", fo.ApplyPerSec), "", f("%.2f", fo.Ratio), "")
		row("  catch-up after the whole baseline", f("%.1f s", fo.CatchUpSeconds),
			f("%d events, %d history rows", fo.Events, fo.HistoryRows), "", "")
		row("snapshot of the full mirror: write / restore", f("%.1f s / %.1f s", fo.SnapshotWriteSec, fo.SnapshotRestoreSec),
			f("%.0f MB, zstd %.0f MB", float64(fo.SnapshotRawBytes)/1e6, float64(fo.SnapshotBytes)/1e6), "", "")
		row("  restore (a new follower's mirror file) / decompression to disk", f("%.1f s", fo.SnapshotRestoreSec),
			f("decompressed to disk %.1f s (in the restore %.1f s)", fo.SnapshotDecompressSec, fo.SnapshotDownloadSec),
			f("%.2f", fo.SnapshotRestoreRatio),
			status["snapshot restore / decompress to disk"])
		row("    every run, the faster of each side counting", "restore "+seconds(fo.SnapshotRestoreRuns),
			"decompression "+seconds(fo.SnapshotDecompressRuns), "", "")
	}
	row(
		"push to NATS: p50 / p99",
		f("%.1f / %.1f ms", r.Push.P50ms, r.Push.P99ms),
		f("%d pushes (first %.0f ms)", r.Push.Pushes, r.Push.FirstMs),
		"",
		status["push-to-NATS p99 (ms)"],
	)
	row(
		"relay keeping KV buckets: events/s",
		f("%.0f", r.KV.RelayPerSec),
		f("plain relay %.0f", r.Relay.RelayPerSec),
		f("%.2f", r.KV.RatioToPlain),
		status["relay with KV / plain relay"],
	)
	row("  KV reconciled at a start (up to date)", f("%.2f s", r.KV.ReconcileSeconds), f("%d keys", r.KV.Keys), "", "")
	row("push to KV value: p50 / p99", f("%.1f / %.1f ms", r.KV.PushP50ms, r.KV.PushP99ms), "", "", "")
	si := r.SyncInterval
	row(
		"relay, embedded sync_interval 1s (default): events/s",
		f("%.0f", si.DefaultPerSec),
		f("2m (JetStream's) %.0f", si.LazyPerSec),
		f("%.2f", si.DefaultRatio),
		"",
	)
	row(
		"relay, embedded sync_interval always: events/s",
		f("%.0f", si.AlwaysPerSec),
		f("2m (JetStream's) %.0f", si.LazyPerSec),
		f("%.2f", si.AlwaysRatio),
		f("%d events each, in %s", si.Events, si.Dir),
	)
	v := r.Verify
	row(
		f("relay, a checkpoint every %s: events/s", verifyCheckpointEvery),
		f("%.0f", v.CheckpointPerSec),
		f("without %.0f", v.RelayPerSec),
		f("%.3f", v.CheckpointRatio),
		status["relay with checkpoints / without"],
	)
	row(
		"  checkpoints: count, mean time",
		f("%d, %.2f ms", v.Checkpoints, v.CheckpointMs),
		f("%d events a side, %d a pass", v.Events, v.PassEvents),
		"",
		"",
	)
	row(
		"relay, audits at their default proportion: events/s",
		f("%.0f", v.AuditPerSec),
		f("without %.0f", v.RelayPerSec),
		f("%.3f", v.AuditRatio),
		status["relay with audits at audit_every / without"],
	)
	row(
		"  audits: count, events checked",
		f("%d, %d in %.1f s", v.Audits, v.AuditChecked, v.AuditSeconds),
		f("a whole audit alone %.0f events/s", v.WholeAuditPerSec),
		"",
		"",
	)
	dw := v.Writer
	row(
		"writer with the digest's triggers: time",
		f("%.2f s", dw.WithSeconds),
		f("without %.2f s", dw.WithoutSeconds),
		f("%.3f", dw.Ratio),
		status["writer time with digest triggers / without"],
	)
	row(
		"  (its baseline and moves)",
		f("%d tags, %d history rows, %d moves", dw.Tags, dw.HistoryRows, dw.Moves),
		"",
		"",
		"",
	)
	for i, m := range r.Memory {
		st := ""
		switch i {
		case 0:
			st = status["peak memory at 1x (MB)"]
		case 2:
			st = f(
				"growth %+.0f%%; < 15%% %s",
				100*r.MemoryGrowth,
				strings.TrimPrefix(status["peak memory growth 1x -> 4x"], "< 0.15 "),
			)
		}
		row(
			f("peak RSS at %gx (%d history rows)", m.Factor, m.HistoryRows),
			f("%.0f MB", m.PeakMB),
			f("sync %.0f s", m.WallSeconds),
			"",
			st,
		)
	}
	rr := r.Realistic
	row("", "", "", "", "")
	row(f("realistic org: %d repos, %d tags, %d history records", rr.Repos, rr.Tags, rr.HistoryRecords), "", "", "", "")
	row(
		"  full sync: requests",
		f("%d", rr.FullSync.Requests),
		f("minimum %d", rr.MinimumTotal),
		f("%.3f", rr.RequestRatio),
		status["realistic: requests / minimum"],
	)
	row(
		"  full sync: wall, peak RSS",
		f("%.1f s, %.0f MB", rr.FullSync.WallSeconds, rr.Memory.PeakMB),
		"",
		"",
		status["realistic: peak memory (MB)"],
	)
	row(
		f("  latency sync (%s/req, %g of the org: %d tags): wall", r.Params.Latency, rr.LatencyScale, rr.LatencyTags),
		f("%.1f s", rr.LatencySync.WallSeconds),
		f("floor %.1f s", rr.LatencyFloor),
		f("%.2f", rr.LatencyRatio),
		status["realistic: latency-bound / floor"],
	)
	row("    its ratio over the bare pair's", "", "", f("%.3f", r.overBarePair(rr.LatencyRatio)),
		status["realistic: latency-bound / floor, over the bare pair's"])
	row(
		f("  at %g requests/s (%g of the org): time to current ready", rr.RequestsPerSecond, rr.LatencyScale),
		f("%.1f s", rr.RateCurrentSeconds),
		f("floor %.1f s (listing pages ÷ rate)", rr.RateCurrentFloor),
		f("%.2f", rr.RateCurrentRatio),
		status["realistic: current ready at the default rate / listing floor"],
	)
	phaseRows(row, "    ", rr.LatencySync, rr.LatencyMinimum, rr.LatencyFloor, r.Params.Latency)
	row(
		"    against its requests in a plain loop",
		f("%.2f ms a request", rr.LatencyCeiling.PerRequestMs),
		f("ceiling %.1f s", rr.LatencyCeiling.CeilingSeconds),
		f("%.2f", rr.LatencyCeiling.Ratio),
		"",
	)
	row(f("  at requests_per_second %g", rr.RequestsPerSecond), f("%.1f h", rr.RateBoundHours), "minimum / rate", "", "")
	row(
		"  idle resync: crawl requests",
		f("%d (history %d)", rr.Idle.Requests, rr.Idle.HistoryRequests),
		f("limit %d", rr.IdleLimit),
		"",
		status["realistic: idle requests"],
	)
	row(
		f("  incremental (%d moved): crawl requests", rr.Moved),
		f("%d (history %d)", rr.Incremental.Requests, rr.Incremental.HistoryRequests),
		f("minimum %d", rr.IncrementalMinimum),
		f("%.3f", rr.IncrementalRatio),
		status["realistic: incremental / minimum"],
	)
	tw.Flush()
	fmt.Fprintf(w, "\ntotal %.0f s\n", r.Total)
}

// printRows prints the rows rows gives as one aligned table.
func printRows(w io.Writer, rows func(row func(...string))) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	rows(func(cols ...string) { fmt.Fprintln(tw, strings.Join(cols, "\t")) })
	tw.Flush()
}

// defaultRate is [crawl] requests_per_second's default, at which the first
// sync's phases have the floors the table shows beside the measured ones.
const defaultRate = 20.0

// phaseRows prints a first sync's two phases: the time to the current
// state against its latency floor (the listings' pages one after another),
// and to the history complete against the sync's floor; and the floors of
// both at the default request rate (pages ÷ rate).
func phaseRows(
	row func(...string),
	indent string,
	sr syncResult,
	m minimum,
	historyFloor float64,
	latency time.Duration,
) {
	f := fmt.Sprintf
	lf := listingFloor(m, latency)
	row(
		indent+"  time to current ready",
		f("%.1f s", sr.CurrentSeconds),
		f("floor %.1f s", lf),
		f("%.2f", sr.CurrentSeconds/lf),
		"",
	)
	row(
		indent+"  time to history complete",
		f("%.1f s", sr.WallSeconds),
		f("floor %.1f s", historyFloor),
		f("%.2f", sr.WallSeconds/historyFloor),
		"",
	)
	pages := m.RepoPages + m.TagPages + m.AdvisoryPages
	row(
		indent+f("  floors at %g requests/s", defaultRate),
		f("current %.0f s, history %.0f s", float64(pages)/defaultRate, float64(m.Total())/defaultRate),
		f("%d listing pages, %d requests", pages, m.Total()),
		"",
		"",
	)
}
