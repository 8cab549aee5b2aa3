package main

import (
	"bufio"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// execMainEnv makes the test binary run as syncd itself, so crash tests can
// SIGKILL a real syncd process without building a second binary.
const execMainEnv = "SYNCD_TEST_EXEC_MAIN"

// execNATSEnv makes the test binary run as a NATS server with JetStream,
// storing under the directory it names, on a loopback port it picks and
// prints: tests that want a nats-server process of its own get one without
// a download.
const execNATSEnv = "SYNCD_TEST_EXEC_NATS"

func TestMain(m *testing.M) {
	if dir := os.Getenv(execNATSEnv); dir != "" {
		os.Exit(runNATSServer(dir))
	}
	if os.Getenv(execMainEnv) == "1" {
		ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
		code := NewMain(os.Stdout, os.Stderr, os.Environ()).Run(ctx, os.Args[1:])
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}

// runNATSServer is the body of a nats-server process: it prints its
// client URL on a line of its own and serves until SIGTERM or SIGINT.
func runNATSServer(dir string) int {
	ns, err := server.NewServer(
		&server.Options{
			Host:      "127.0.0.1",
			Port:      server.RANDOM_PORT,
			JetStream: true,
			StoreDir:  dir,
			NoLog:     true,
			NoSigs:    true,
		},
	)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	go ns.Start()
	if !ns.ReadyForConnections(10 * time.Second) {
		fmt.Fprintln(os.Stderr, "nats-server not ready")
		return 1
	}
	fmt.Println(ns.ClientURL())
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ns.Shutdown()
	ns.WaitForShutdown()
	return 0
}

// startNATSProcess runs a nats-server in a process of its own on a
// loopback port and returns its URL; it stops with the test.
func startNATSProcess(t *testing.T) string {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), execNATSEnv+"="+t.TempDir())
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		cmd.Wait()
	})
	url := make(chan string, 1)
	go func() {
		line, _ := bufio.NewReader(out).ReadString('\n')
		url <- strings.TrimSpace(line)
		io.Copy(io.Discard, out)
	}()
	select {
	case u := <-url:
		if !strings.HasPrefix(u, "nats://") {
			t.Fatalf("the nats-server process said %q, not its URL", u)
		}
		return u
	case <-time.After(15 * time.Second):
		t.Fatal("the nats-server process did not say its URL within 15s")
		return ""
	}
}

// trials is how many times a reliability scenario repeats: a few in
// make test, more in make soak (SOAK_TRIALS).
func trials(def int) int {
	if n, err := strconv.Atoi(os.Getenv("SOAK_TRIALS")); err == nil && n > 0 {
		return n
	}
	return def
}

// world is a simulator, a NATS server and a mirror path, with the ground
// truth recorded when the baseline is taken.
type world struct {
	t        *testing.T
	sim      *platformsim.Sim
	simURL   string
	natsURL  string
	dbPath   string
	baseline map[string]int // history records per tag when the baseline was taken
	failures atomic.Int64   // 5xx and 429 answers the simulator gave
}

// statusCounter counts the error answers passing through it.
type statusCounter struct {
	http.ResponseWriter
	w *world
}

func (s statusCounter) WriteHeader(code int) {
	if code == http.StatusTooManyRequests || code >= 500 {
		s.w.failures.Add(1)
	}
	s.ResponseWriter.WriteHeader(code)
}

// Hijack lets the simulator's connection-reset fault through the wrapper.
func (s statusCounter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	s.w.failures.Add(1)
	return s.ResponseWriter.(http.Hijacker).Hijack()
}

func (s statusCounter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func newWorld(t *testing.T, seed int64, sc platformsim.Scale, natsURL string) *world {
	t.Helper()
	w := &world{t: t, natsURL: natsURL, dbPath: filepath.Join(t.TempDir(), "syncd.db")}
	w.sim, w.simURL = testutil.Sim(
		t,
		platformsim.Options{Seed: seed, Tokens: []string{e2eToken}},
		sc,
		func(h http.Handler) http.Handler {
			return http.HandlerFunc(func(rw http.ResponseWriter, r *http.Request) { h.ServeHTTP(statusCounter{rw, w}, r) })
		},
	)
	w.takeBaseline()
	return w
}

// takeBaseline records how many history records each tag has now.
func (w *world) takeBaseline() {
	w.baseline = map[string]int{}
	for uid, h := range w.sim.Truth().History {
		w.baseline[uid] = len(h)
	}
}

// config writes syncd's configuration for this world: quick schedules,
// sweeps to catch deletions, no admin listener.
func (w *world) config() string {
	return testConfig{
		simURL:  w.simURL,
		natsURL: w.natsURL,
		dbPath:  w.dbPath,
		crawl:   "schedule = \"@every 1s\"\nsweep_schedule = \"@every 3s\"\nadvisories_schedule = \"@every 2s\"\njitter = \"0s\"\nrequests_per_second = 0.0",
	}.write(
		w.t,
	)
}

// mirrorDiff compares the mirror with the simulator's ground truth, row for
// row, and describes the first differences; "" when they agree.
func mirrorDiff(db *sql.DB, truth platformsim.Truth) string {
	var diffs []string
	add := func(format string, args ...any) {
		if len(diffs) < 10 {
			diffs = append(diffs, fmt.Sprintf(format, args...))
		}
	}
	repos := map[string]string{}
	rows, err := db.Query(`SELECT uid, name || ' at ' || path FROM repos WHERE deleted_time IS NULL AND uid LIKE 'org1/%'`)
	if err != nil {
		return err.Error()
	}
	for rows.Next() {
		var uid, name string
		rows.Scan(&uid, &name)
		repos[uid] = name
	}
	rows.Close()
	for _, r := range truth.Repos {
		if want := r.Name + " at " + r.Path; repos[r.UID] != want {
			add("repo %s: mirror %q, truth %q", r.UID, repos[r.UID], want)
		}
		delete(repos, r.UID)
	}
	for uid := range repos {
		add("repo %s live in the mirror, gone upstream", uid)
	}
	type tagRow struct {
		digest     string
		deprecated bool
		history    int
		rows       int
		last       string
	}
	tags := map[string]tagRow{}
	// The bookmark's count and the rows themselves: a replica that lacked
	// a tag's first record kept the bookmark's count right.
	rows, err = db.Query(`SELECT t.uid, t.digest, t.deprecated, t.history_count,
		(SELECT count(*) FROM tag_history h WHERE h.tag_uid = t.uid),
		COALESCE((SELECT h.digest FROM tag_history h WHERE h.tag_uid = t.uid ORDER BY h.seq DESC LIMIT 1), '')
		FROM tags t WHERE t.deleted_time IS NULL AND t.uid LIKE 'org1/%'`)
	if err != nil {
		return err.Error()
	}
	for rows.Next() {
		var uid string
		var r tagRow
		rows.Scan(&uid, &r.digest, &r.deprecated, &r.history, &r.rows, &r.last)
		tags[uid] = r
	}
	rows.Close()
	for _, tg := range truth.Tags {
		got, ok := tags[tg.UID]
		h := truth.History[tg.UID]
		switch {
		case !ok:
			add("tag %s missing from the mirror", tg.UID)
		case got.digest != tg.Digest || got.deprecated != tg.Deprecated:
			add("tag %s: mirror (%s %v), truth (%s %v)", tg.UID, got.digest, got.deprecated, tg.Digest, tg.Deprecated)
		case got.history != len(h) || got.rows != len(h) || (len(h) > 0 && got.last != h[len(h)-1].Digest):
			add("tag %s: %d history records (%d rows) ending %s, truth %d", tg.UID, got.history, got.rows, got.last, len(h))
		}
		delete(tags, tg.UID)
	}
	for uid := range tags {
		add("tag %s live in the mirror, gone upstream", uid)
	}
	advisories := map[string]bool{}
	rows, err = db.Query(`SELECT uid FROM advisories WHERE deleted_time IS NULL`)
	if err != nil {
		return err.Error()
	}
	for rows.Next() {
		var uid string
		rows.Scan(&uid)
		advisories[uid] = true
	}
	rows.Close()
	for _, a := range truth.Advisories {
		if live := a.DeleteTime == nil; advisories[a.UID] != live {
			add("advisory %s: live in the mirror %v, upstream %v", a.UID, advisories[a.UID], live)
		}
		delete(advisories, a.UID)
	}
	for uid := range advisories {
		add("advisory %s live in the mirror, gone upstream", uid)
	}
	return strings.Join(diffs, "\n")
}

// received is what a JetStream consumer saw.
type received struct {
	mu    sync.Mutex
	ids   map[string]int // id -> deliveries
	moves map[string][]string
	// subjects is the NATS subject of each tag's latest tag.moved, by uid.
	subjects map[string]string
	// tagStates is the digest after each tag event, by tag uid, in stream order.
	tagStates map[string][]string
	byType    map[string]int
	total     int
}

// counts are the messages received and the distinct events among them, read
// while the consumer may still run.
func (r *received) counts() (total, distinct int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.total, len(r.ids)
}

// consume reads the whole stream from the start, as a downstream service
// would, until ctx is done.
func consume(ctx context.Context, t *testing.T, natsURL string) *received {
	t.Helper()
	rcv := &received{
		ids:       map[string]int{},
		moves:     map[string][]string{},
		subjects:  map[string]string{},
		byType:    map[string]int{},
		tagStates: map[string][]string{},
	}
	js := testutil.JetStream(t, natsURL, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	var stream jetstream.Stream
	var err error
	testutil.WaitFor(t, 30*time.Second, "the SYNCD stream", func() bool {
		stream, err = js.Stream(ctx, "SYNCD")
		return err == nil
	})
	cons, err := stream.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{})
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ctx.Err() == nil {
			batch, err := cons.Fetch(100, jetstream.FetchMaxWait(200*time.Millisecond))
			if err != nil {
				continue
			}
			for m := range batch.Messages() {
				var ev cloudEvent
				if json.Unmarshal(m.Data(), &ev) != nil {
					continue
				}
				rcv.mu.Lock()
				rcv.total++
				rcv.ids[ev.ID]++
				if rcv.ids[ev.ID] == 1 {
					rcv.byType[ev.Type]++
					if strings.HasPrefix(ev.Type, "dev.syncd.tag.") && ev.Data.After.Digest != "" {
						rcv.tagStates[ev.Subject] = append(rcv.tagStates[ev.Subject], ev.Data.After.Digest)
					}
					if ev.Type == "dev.syncd.tag.moved" {
						rcv.moves[ev.Subject] = append(rcv.moves[ev.Subject], ev.Data.After.Digest)
						rcv.subjects[ev.Subject] = m.Subject()
					}
				}
				rcv.mu.Unlock()
			}
		}
	}()
	return rcv
}

// movesDiff checks the tag.moved events against the truth: for every tag
// alive upstream, one event per history record added after the baseline,
// in history order; "" when they agree.
func (w *world) movesDiff(rcv *received, truth platformsim.Truth) string {
	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	var diffs []string
	for _, tg := range truth.Tags {
		h := truth.History[tg.UID]
		from := max(w.baseline[tg.UID], 1)
		var want []string
		for i := from; i < len(h); i++ {
			want = append(want, h[i].Digest)
		}
		got := rcv.moves[tg.UID]
		if strings.Join(got, ",") != strings.Join(want, ",") {
			diffs = append(diffs, fmt.Sprintf("tag %s: received moves %v, want %v", tg.UID, short(got), short(want)))
		}
	}
	for id, n := range rcv.ids {
		if n > 1 {
			diffs = append(diffs, fmt.Sprintf("event %s received %d times", id, n))
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 10 {
		diffs = append(diffs[:10], fmt.Sprintf("... %d more", len(diffs)-10))
	}
	return strings.Join(diffs, "\n")
}

func short(ds []string) []string {
	out := make([]string, len(ds))
	for i, d := range ds {
		out[i] = strings.TrimPrefix(d, "sha256:")[:min(8, len(strings.TrimPrefix(d, "sha256:")))]
	}
	return out
}

// converge waits until the mirror equals the truth and the outbox is empty
// and every tag.moved event arrived, or fails with the differences.
func (w *world) converge(rcv *received, within time.Duration) {
	w.t.Helper()
	db := openReader(w.t, w.dbPath)
	truth := w.sim.Truth()
	testutil.Eventually(w.t, within, func() error {
		if diff := mirrorDiff(db, truth); diff != "" {
			return errors.New(diff)
		}
		var unpublished int
		db.QueryRow(`SELECT count(*) FROM events WHERE published_time IS NULL`).Scan(&unpublished)
		if unpublished > 0 {
			return fmt.Errorf("%d events unpublished", unpublished)
		}
		if diff := w.movesDiff(rcv, truth); diff != "" {
			return errors.New(diff)
		}
		return nil
	})
	var check string
	if err := db.QueryRow(`PRAGMA integrity_check`).Scan(&check); err != nil || check != "ok" {
		w.t.Fatalf("integrity_check: %q %v", check, err)
	}
}

// changesOnly makes the simulator's scenario move, deprecate and create
// tags and touch repos and advisories, but delete nothing, so every change
// stays visible to the oracle.
// moveATag moves an ordinary tag of sim to a new digest: a change every
// crawl sees, where a random step may make none (an epoch tag created, a
// family the replicas do not list), and a test waiting on the checkpoint
// the change makes would wait on nothing (cluster-test, 2026-11-27).
func moveATag(t *testing.T, sim *platformsim.Sim) {
	t.Helper()
	for _, tg := range sim.Truth().Tags {
		if tg.Family != "" {
			continue
		}
		d := fmt.Sprintf("sha256:%064x", time.Now().UnixNano())
		if err := sim.MoveTag(tg.UID, d); err != nil {
			t.Fatalf("move tag %s: %v", tg.UID, err)
		}
		return
	}
	t.Fatal("no ordinary tag to move")
}

func changesOnly() platformsim.Rates {
	return platformsim.Rates{MoveTag: 80, Deprecate: 5, CreateTag: 5, UpdateRepo: 3, CreateAdvisory: 4, UpdateAdvisory: 3}
}

// TestReliability_FaultsWhileDataChanges: with 10% 5xx, 5% 429 with
// Retry-After, 2% resets, 1% truncated bodies and latency spikes on every
// endpoint at once, while the data changes, the mirror converges to the
// ground truth and the consumer receives every move exactly once, in order.
func TestReliability_FaultsWhileDataChanges(t *testing.T) {
	t.Parallel() // it mostly waits: see "Parallel tests" in harness_test.go
	ns := testutil.NATS(t)
	w := newWorld(
		t,
		41,
		platformsim.Scale{Repos: 4, TagsPerRepo: 4, HistoryPerTag: 5, Advisories: 5, PublicImages: -1},
		ns.URL(),
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := startDaemon(t, w.config())
	waitBaseline(w.t, w.dbPath)
	rcv := consume(ctx, t, w.natsURL)

	w.sim.SetRates(changesOnly())
	w.sim.SetFaults(platformsim.Fault{Pattern: "*", ErrorRate: 0.10, RateLimitRate: 0.05, RetryAfter: time.Second,
		ResetRate: 0.02, TruncateRate: 0.01, LatencyExpMean: 5 * time.Millisecond})
	changes := 0
	for range 20 {
		changes += len(w.sim.Step(2))
		time.Sleep(100 * time.Millisecond) // the data changes while syncd crawls
	}
	w.sim.SetFaults()
	if w.failures.Load() == 0 {
		t.Fatal("no fault was injected: the scenario proved nothing")
	}
	w.converge(rcv, 60*time.Second)
	total, distinct := rcv.counts()
	t.Logf(
		"%d changes made, %d failed answers; %d messages received, %d distinct events",
		changes,
		w.failures.Load(),
		total,
		distinct,
	)
	d.stop(t)
}

// TestReliability_CrashRecovery kills a real syncd process with SIGKILL at
// seeded random moments while data changes, restarts it each time, and
// checks that it converges with nothing lost or duplicated and the
// database intact.
func TestReliability_CrashRecovery(t *testing.T) {
	t.Parallel() // it mostly waits: see "Parallel tests" in harness_test.go
	ns := testutil.NATS(t)
	w := newWorld(
		t,
		43,
		platformsim.Scale{Repos: 5, TagsPerRepo: 4, HistoryPerTag: 30, Advisories: 5, PublicImages: -1},
		ns.URL(),
	)
	cfg := w.config()
	rng := rand.New(rand.NewPCG(43, 7))
	start := func() (*exec.Cmd, *syncBuffer) {
		var out syncBuffer
		cmd := exec.Command(os.Args[0], "run", "--config", cfg)
		cmd.Env = append(os.Environ(), execMainEnv+"=1")
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		return cmd, &out
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cmd, _ := start()
	waitBaseline(w.t, w.dbPath)
	rcv := consume(ctx, t, w.natsURL)
	w.sim.SetRates(changesOnly())
	changes := 0
	n := trials(3)
	for i := range n {
		changes += len(w.sim.Step(3))
		// Kill it at a seeded random moment: crawling, committing or publishing.
		time.Sleep(time.Duration(100+rng.IntN(900)) * time.Millisecond)
		if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
			t.Fatal(err)
		}
		cmd.Wait()
		changes += len(w.sim.Step(2))
		t.Logf("trial %d: killed", i+1)
		cmd, _ = start()
	}
	w.converge(rcv, 90*time.Second)
	total, distinct := rcv.counts()
	t.Logf("%d kills survived, %d changes made; %d messages received, %d distinct events", n, changes, total, distinct)
	cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err != nil {
		t.Fatalf("syncd after SIGTERM: %v", err)
	}
}

// TestReliability_NATSOutage stops the NATS server while changes keep
// coming, restarts it, and checks that nothing was lost.
func TestReliability_NATSOutage(t *testing.T) {
	t.Parallel() // it mostly waits: see "Parallel tests" in harness_test.go
	ns := testutil.NATS(t)
	w := newWorld(t, 47, platformsim.Scale{Repos: 3, TagsPerRepo: 4, HistoryPerTag: 5, PublicImages: -1}, ns.URL())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := startDaemon(t, w.config())
	waitBaseline(w.t, w.dbPath)
	w.sim.SetRates(changesOnly())
	changes := len(w.sim.Step(3))
	ns.Stop()
	outage := outageLength()
	deadline := time.Now().Add(outage)
	for time.Now().Before(deadline) {
		changes += len(w.sim.Step(1))
		time.Sleep(200 * time.Millisecond) // changes keep coming while NATS is down
	}
	ns.Start()
	rcv := consume(ctx, t, w.natsURL)
	w.converge(rcv, 60*time.Second)
	total, distinct := rcv.counts()
	t.Logf("NATS down %s; %d changes made; %d messages received, %d distinct events", outage, changes, total, distinct)
	d.stop(t)
}

// outageLength is 3s in make test and 20s in make soak.
func outageLength() time.Duration {
	if d, err := time.ParseDuration(os.Getenv("SOAK_NATS_OUTAGE")); err == nil {
		return d
	}
	return 3 * time.Second
}
