package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/metrics"
	"runtime/pprof"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The memory runs re-execute the test binary as a child that holds nothing
// but syncd's parts (client, crawler, store): the simulator, which holds
// the whole organization, stays in the parent and serves the child over
// loopback, so the child's peak resident memory is syncd's alone.
const (
	memSimEnv         = "BENCH_MEM_SIM"
	memConcurrencyEnv = "BENCH_MEM_CONCURRENCY"
	memDirEnv         = "BENCH_MEM_DIR"
	memResultPrefix   = "BENCHMEM "
)

// memResult is one child's full sync and its peak resident memory.
type memResult struct {
	Factor      float64 `json:"factor"`
	Repos       int     `json:"repos"`
	Tags        int     `json:"tags"`
	HistoryRows int64   `json:"history_rows"`
	// PeakMB is the child's VmHWM. (Its rusage ru_maxrss is no measure:
	// Linux carries the parent's resident set at the exec into it.)
	PeakMB      float64 `json:"peak_rss_mb"`
	WallSeconds float64 `json:"wall_s"`
	CPUSeconds  float64 `json:"cpu_s"` // user and system time of the child
	// GoHeapPeakMB is the most the Go heap's objects took, sampled every
	// 20 ms; the rest of the peak is mostly SQLite's page caches, which
	// live outside the Go heap. RSSPeakAtSeconds is when in the sync the
	// resident set was largest.
	GoHeapPeakMB     float64 `json:"go_heap_peak_mb"`
	RSSPeakAtSeconds float64 `json:"rss_peak_at_s"`
	// AtPeak is what the resident set was made of when it was largest.
	AtPeak rssParts `json:"at_rss_peak"`
}

// rssParts splits a resident set: anonymous memory (the Go runtime's and
// SQLite's allocations), pages of mapped files, and shared memory (pages of
// a mapped file on tmpfs, as the benchmark's databases are); GoMB is what
// the Go runtime has mapped and not given back, of which GoHeapMB its
// heap's objects.
type rssParts struct {
	AnonMB   float64 `json:"anon_mb"`
	FileMB   float64 `json:"file_mb"`
	ShmemMB  float64 `json:"shmem_mb"`
	GoMB     float64 `json:"go_mb"`
	GoHeapMB float64 `json:"go_heap_mb"`
}

// rssNow reads the parts of this process's resident set from /proc.
func rssNow(goSamples []metrics.Sample) rssParts {
	var p rssParts
	metrics.Read(goSamples)
	p.GoMB = float64(goSamples[0].Value.Uint64()-goSamples[2].Value.Uint64()) / (1 << 20)
	p.GoHeapMB = float64(goSamples[1].Value.Uint64()) / (1 << 20)
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return p
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		switch k {
		case "RssAnon":
			p.AnonMB = kb / 1024
		case "RssFile":
			p.FileMB = kb / 1024
		case "RssShmem":
			p.ShmemMB = kb / 1024
		}
	}
	return p
}

// memPeaks is what sampleMemory saw.
type memPeaks struct {
	goHeapMB float64
	rssAt    time.Duration
	atPeak   rssParts
}

// sampleMemory samples the Go heap and the resident set every 20 ms until
// the returned func is called, which returns the peaks.
func sampleMemory() func() memPeaks {
	start := time.Now()
	done := make(chan struct{})
	result := make(chan memPeaks, 1)
	go func() {
		var p memPeaks
		var rssMax int64
		s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
		parts := []metrics.Sample{
			{Name: "/memory/classes/total:bytes"},
			{Name: "/memory/classes/heap/objects:bytes"},
			{Name: "/memory/classes/heap/released:bytes"},
		}
		t := time.NewTicker(20 * time.Millisecond)
		defer t.Stop()
		trace, lastTrace := os.Getenv("BENCH_MEMTRACE") != "", time.Time{}
		profile := os.Getenv("BENCH_HEAPPROFILE")
		profiled := 0.0
		var heap bytes.Buffer
		defer func() {
			if profile != "" && heap.Len() > 0 {
				_ = os.WriteFile(profile, heap.Bytes(), 0o600)
			}
		}()
		for {
			metrics.Read(s)
			p.goHeapMB = max(p.goHeapMB, float64(s[0].Value.Uint64())/(1<<20))
			if profile != "" && p.goHeapMB > profiled+1 {
				// A heap profile near the Go heap's peak (BENCH_HEAPPROFILE):
				// what the live objects were, as of the last collection.
				profiled = p.goHeapMB
				heap.Reset()
				_ = pprof.Lookup("heap").WriteTo(&heap, 0)
			}
			if trace && time.Since(lastTrace) >= time.Second {
				// BENCH_MEMTRACE: the resident set's parts every second.
				lastTrace = time.Now()
				pt := rssNow(parts)
				fmt.Fprintf(
					os.Stderr,
					"mem %6.1f s  rss %6.1f MB  anon %6.1f (Go %5.1f, heap objects %5.1f)  file %5.1f  shmem %5.1f%s\n",
					time.Since(start).
						Seconds(),
					float64(residentBytes())/(1<<20),
					pt.AnonMB,
					pt.GoMB,
					pt.GoHeapMB,
					pt.FileMB,
					pt.ShmemMB,
					extraMemTrace(),
				)
			}
			if rss := residentBytes(); rss > rssMax {
				rssMax, p.rssAt = rss, time.Since(start)
				p.atPeak = rssNow(parts)
			}
			select {
			case <-done:
				result <- p
				return
			case <-t.C:
			}
		}
	}()
	return func() memPeaks { close(done); return <-result }
}

// residentBytes is this process's resident set now (from /proc/self/statm),
// or 0 if it cannot be read.
func residentBytes() int64 {
	b, err := os.ReadFile("/proc/self/statm")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return 0
	}
	pages, _ := strconv.ParseInt(f[1], 10, 64)
	return pages * int64(os.Getpagesize())
}

// TestMemoryChild is the child side of the memory runs; it is skipped
// unless BenchmarkSyncd started it.
func TestMemoryChild(t *testing.T) {
	url := os.Getenv(memSimEnv)
	if url == "" {
		t.Skip("runs only as the child process of BenchmarkSyncd")
	}
	conc, err := strconv.Atoi(os.Getenv(memConcurrencyEnv))
	if err != nil {
		t.Fatalf("%s: %v", memConcurrencyEnv, err)
	}
	ctx := context.Background()
	m, err := openMirror(ctx, os.Getenv(memDirEnv), url, conc, "none")
	if err != nil {
		t.Fatal(err)
	}
	defer m.Close()
	stopProfile, err := startProfile(os.Getenv("BENCH_CPUPROFILE"))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	stopSampling := sampleMemory()
	if _, err := m.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	if !m.crawler.AdvisoriesListedSince(start) {
		if _, err := m.crawler.SyncAdvisories(ctx); err != nil {
			t.Fatal(err)
		}
	}
	wall := time.Since(start)
	peaks := stopSampling()
	stopProfile()
	hwm, err := vmHWM()
	if err != nil {
		t.Fatal(err)
	}
	rows, err := m.count(ctx, "tag_history")
	if err != nil {
		t.Fatal(err)
	}
	tags, err := m.count(ctx, "tags")
	if err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(memResult{PeakMB: hwm, HistoryRows: rows, Tags: int(tags), WallSeconds: wall.Seconds(),
		GoHeapPeakMB: peaks.goHeapMB, RSSPeakAtSeconds: peaks.rssAt.Seconds(), AtPeak: peaks.atPeak})
	fmt.Println(memResultPrefix + string(out))
}

// vmHWM reads this process's peak resident set size, in MB, from /proc.
func vmHWM() (float64, error) {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return 0, err
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
			if err != nil {
				return 0, fmt.Errorf("VmHWM %q: %w", v, err)
			}
			return float64(kb) / 1024, nil
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/self/status")
}

// childSync has a child process make a full initial sync of o into a new
// mirror in dir, which the parent may open afterwards, and returns its
// figures with the requests the simulator served.
func childSync(ctx context.Context, p params, o *org, factor float64, dir string) (memResult, syncResult, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^TestMemoryChild$", "-test.count=1", "-test.timeout=10m")
	cmd.Env = append(
		os.Environ(),
		memSimEnv+"="+o.URL(),
		memConcurrencyEnv+"="+strconv.Itoa(p.Concurrency),
		memDirEnv+"="+dir,
	)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if os.Getenv("BENCH_MEMTRACE") != "" || os.Getenv("BENCH_LOG") != "" {
		cmd.Stderr = io.MultiWriter(&stderr, os.Stderr)
	}
	o.sim.ResetStats()
	out, err := cmd.Output()
	if err != nil {
		return memResult{}, syncResult{}, fmt.Errorf("sync child at %gx: %w\n%s%s", factor, err, out, stderr.Bytes())
	}
	st := o.sim.Stats()
	var r memResult
	found := false
	lines := bufio.NewScanner(bytes.NewReader(out))
	for lines.Scan() {
		if v, ok := strings.CutPrefix(lines.Text(), memResultPrefix); ok {
			if err := json.Unmarshal([]byte(v), &r); err != nil {
				return memResult{}, syncResult{}, err
			}
			found = true
		}
	}
	if !found {
		return memResult{}, syncResult{}, fmt.Errorf("sync child at %gx printed no result:\n%s", factor, out)
	}
	if ru, ok := cmd.ProcessState.SysUsage().(*syscall.Rusage); ok {
		r.CPUSeconds = float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
	}
	r.Factor, r.Repos = factor, o.sc.Repos
	sr := syncResult{Wall: time.Duration(r.WallSeconds * float64(time.Second)), WallSeconds: r.WallSeconds,
		Requests: st.Total, HistoryRequests: st.ByEndpoint[historyEndpoint], HistoryRows: r.HistoryRows,
		AdvisoryRequests: st.ByEndpoint[advisoryListEndpoint] + st.ByEndpoint[advisoryGetEndpoint]}
	return r, sr, nil
}

// BenchmarkMemory is the memory runs of BenchmarkSyncd alone: a child
// process syncs the organization at each factor of BENCH_MEM_FACTORS
// (default 1,4, times BENCH_SCALE) and reports its peak resident set and
// what it was made of:
//
//	BENCH_SCALE=0.5 go test -run '^$' -bench '^BenchmarkMemory$' -benchtime 1x ./bench/
func BenchmarkMemory(b *testing.B) {
	p, dir := setUp(b)
	ctx := context.Background()
	factors := []float64{1, 4}
	if v := os.Getenv("BENCH_MEM_FACTORS"); v != "" {
		factors = nil
		for f := range strings.SplitSeq(v, ",") {
			x, err := strconv.ParseFloat(f, 64)
			if err != nil {
				b.Fatalf("BENCH_MEM_FACTORS=%q: %v", v, err)
			}
			factors = append(factors, x)
		}
	}
	for _, f := range factors {
		o := startOrg(orgScale(p.Scale * f))
		m, _, err := childSync(ctx, p, o, f, filepath.Join(dir, fmt.Sprintf("mem%g", f)))
		o.Close()
		if err != nil {
			b.Fatal(err)
		}
		out, _ := json.Marshal(m)
		fmt.Fprintf(
			os.Stderr,
			"memory at %gx: peak RSS %.0f MB at %.1f s of %.1f s; %s\n",
			f,
			m.PeakMB,
			m.RSSPeakAtSeconds,
			m.WallSeconds,
			out,
		)
	}
}

// extraMemTrace adds to BENCH_MEMTRACE's lines; a build with a tag of its
// own may set it (SQLite's allocator's counters, say).
var extraMemTrace = func() string { return "" }
