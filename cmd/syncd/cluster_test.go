package main

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// clusterTTL is the lease TTL of the cluster tests: short, so that a
// takeover is quick, and long enough for renewals on a busy machine.
const clusterTTL = 2 * time.Second

// requestCounter counts the simulator's requests per platform token, so
// that each replica's upstream traffic is known.
type requestCounter struct {
	mu    sync.Mutex
	count map[string]int
	first map[string]time.Time
}

func (c *requestCounter) wrap(h http.Handler, tokens []string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		c.mu.Lock()
		for _, tok := range tokens {
			if strings.Contains(auth, tok) {
				if c.count[tok] == 0 {
					c.first[tok] = time.Now()
				}
				c.count[tok]++
			}
		}
		c.mu.Unlock()
		h.ServeHTTP(w, r)
	})
}

func (c *requestCounter) get(tok string) (int, time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.count[tok], c.first[tok]
}

// node is one syncd process of the cluster test.
type node struct {
	name, token, dbPath, cfg string
	// replicas is [nats] replicas (default 1), admin is [admin] listen
	// (default none), snapshotEvery is [snapshot] every (default 6h).
	replicas      int
	admin         string
	snapshotEvery string
	// ttl is [cluster] lease_ttl; 0: clusterTTL.
	ttl time.Duration
	// dupWindow is [nats] duplicate_window and auditEvery [verify]
	// audit_every; "": the defaults.
	dupWindow, auditEvery string
	// noSnapshots: [snapshot] enabled = false.
	noSnapshots bool
	// schedule, when set, is every [crawl] job's schedule; "": the crawl
	// every second, the sweep every 3 s, the advisories every 2 s.
	schedule string
	// natsUser and natsPassword are [nats] user and password; signingKey
	// and verifyKeys [cluster] signing_key_file and verify_keys; "", nil:
	// none.
	natsUser, natsPassword string
	signingKey             string
	verifyKeys             []string
	// extra is appended to the configuration: tables of its own.
	extra string
	cmd   *exec.Cmd
	out   *syncBuffer
}

// clusterNodeConfig writes a cluster-mode configuration for one replica.
func clusterNodeConfig(t *testing.T, simURL, natsURL string, n *node) string {
	if n.snapshotEvery == "" {
		n.snapshotEvery = "6h"
	}
	return writeFile(t, "syncd-"+n.name+".toml", fmt.Sprintf(
		`[platform]
base_url = %[1]q
registry_url = %[1]q
token = %[2]q
group = "org1"
organization = "acme"
timeout = "2s"

[crawl]
schedule = %[12]q
sweep_schedule = %[13]q
advisories_schedule = %[14]q
jitter = "0s"
requests_per_second = 0.0

[nats]
url = %[3]q
replicas = %[7]d
%[10]s%[16]s

[store]
path = %[4]q
initial_events = "snapshot"

[admin]
listen = %[8]q

[snapshot]
every = %[9]q
enabled = %[15]t

[log]
level = "debug"
format = "json"

[cluster]
enabled = true
node_id = %[5]q
lease_ttl = %[6]q
consumer = "follow-%[5]s"
%[17]s%[11]s%[18]s`,
		simURL,
		n.token,
		natsURL,
		n.dbPath,
		n.name,
		cmp.Or(n.ttl, clusterTTL).String(),
		max(n.replicas, 1),
		n.admin,
		n.snapshotEvery,
		tomlLine("duplicate_window", n.dupWindow),
		tomlSection("verify", tomlLine("audit_every", n.auditEvery)),
		cmp.Or(n.schedule, "@every 1s"),
		cmp.Or(n.schedule, "@every 3s"),
		cmp.Or(n.schedule, "@every 2s"),
		!n.noSnapshots,
		tomlLine("user", n.natsUser)+tomlLine("password", n.natsPassword),
		tomlLine("signing_key_file", n.signingKey)+tomlList("verify_keys", n.verifyKeys),
		n.extra,
	))
}

// tomlLine is key = "value", or "" when value is.
func tomlLine(key, value string) string {
	if value == "" {
		return ""
	}
	return fmt.Sprintf("%s = %q\n", key, value)
}

// tomlList is key = ["value", …], or "" when there are no values.
func tomlList(key string, values []string) string {
	if len(values) == 0 {
		return ""
	}
	quoted := make([]string, len(values))
	for i, v := range values {
		quoted[i] = fmt.Sprintf("%q", v)
	}
	return fmt.Sprintf("%s = [%s]\n", key, strings.Join(quoted, ", "))
}

// tomlSection is a table of body, or "" when body is.
func tomlSection(name, body string) string {
	if body == "" {
		return ""
	}
	return "\n[" + name + "]\n" + body
}

// start runs the test binary as "syncd <args> --config n.cfg".
func (n *node) start(t *testing.T, cmdName string) {
	t.Helper()
	n.out = &syncBuffer{}
	n.cmd = exec.Command(os.Args[0], cmdName, "--config", n.cfg)
	n.cmd.Env = append(os.Environ(), execMainEnv+"=1")
	n.cmd.Stdout, n.cmd.Stderr = n.out, n.out
	if err := n.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	cmd := n.cmd
	t.Cleanup(func() {
		if cmd.ProcessState != nil {
			return
		}
		if !t.Failed() {
			cmd.Process.Kill()
			cmd.Wait()
			return
		}
		// A failed test's replica writes where each of its goroutines
		// stood into its log (Go's SIGQUIT dump), for the logs kept of
		// the run; killed if it has not exited in 5s.
		exited := make(chan struct{})
		go func() {
			cmd.Wait()
			close(exited)
		}()
		cmd.Process.Signal(syscall.SIGQUIT)
		select {
		case <-exited:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-exited
		}
	})
}

// meta reads a key of a mirror's meta table; "" when absent or unreadable.
func metaOf(path, key string) string {
	if _, err := os.Stat(path); err != nil {
		return ""
	}
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		return ""
	}
	defer db.Close()
	var v string
	db.QueryRow(`SELECT value FROM meta WHERE key = ?`, key).Scan(&v)
	return v
}

// waitSameMirror waits until the follower's mirror equals the leader's.
func waitSameMirror(t *testing.T, within time.Duration, followerPath, leaderPath string) {
	t.Helper()
	waitSame(t, within, followerPath, leaderPath, true)
}

// waitSameState waits until a mirror's resources equal the leader's; their
// histories are not compared.
func waitSameState(t *testing.T, within time.Duration, path, leaderPath string) {
	t.Helper()
	waitSame(t, within, path, leaderPath, false)
}

func waitSame(t *testing.T, within time.Duration, followerPath, leaderPath string, history bool) {
	t.Helper()
	fdb, ldb := openReader(t, followerPath), openReader(t, leaderPath)
	same := testutil.SameMirror
	if !history {
		same = testutil.SameState
	}
	testutil.Eventually(t, within, func() error {
		if err := same(fdb, ldb); err != nil {
			return fmt.Errorf("%s: %w", followerPath, err)
		}
		return nil
	})
}

// TestCluster_Failover runs three "syncd run" replicas in cluster mode as
// real processes against one NATS server and the simulator. It kills the
// leader with SIGKILL while data changes and checks that: a standby takes
// over within two lease TTLs; the consumer receives every move exactly once
// and the new leader's mirror converges to the truth; the standbys made no
// upstream request while standing by; the remaining standby's mirror equals
// the leader's; and a follower started late catches up from the stream.
func TestCluster_Failover(t *testing.T) {
	// A nats-server process of its own, shared by the three replicas.
	natsURL := startNATSProcess(t)
	nodes := []*node{{name: "a", token: "tok-a-1f3c"}, {name: "b", token: "tok-b-7d2e"}, {name: "c", token: "tok-c-9a4b"}}
	tokens := []string{nodes[0].token, nodes[1].token, nodes[2].token}
	counter := &requestCounter{count: map[string]int{}, first: map[string]time.Time{}}
	sim, simURL := testutil.Sim(t, platformsim.Options{Seed: 53, Tokens: tokens},
		platformsim.Scale{Repos: 3, TagsPerRepo: 3, HistoryPerTag: 4, Advisories: 4, PublicImages: -1},
		func(h http.Handler) http.Handler { return counter.wrap(h, tokens) })
	dir := t.TempDir()
	for _, n := range nodes {
		n.dbPath = filepath.Join(dir, n.name+".db")
		n.cfg = clusterNodeConfig(t, simURL, natsURL, n)
	}
	w := &world{t: t, sim: sim, simURL: simURL, natsURL: natsURL}
	w.takeBaseline()

	a, b, c := nodes[0], nodes[1], nodes[2]
	a.start(t, "run")
	testutil.WaitFor(t, 30*time.Second, "a to lead and finish its baseline", func() bool {
		return metaOf(a.dbPath, "role") == "leader" && metaOf(a.dbPath, "baseline_time") != ""
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rcv := consume(ctx, t, natsURL)
	b.start(t, "run")
	c.start(t, "run")
	for _, n := range []*node{b, c} {
		testutil.WaitFor(t, 30*time.Second, n.name+" to follow as a standby", func() bool {
			return metaOf(n.dbPath, "role") == "standby" && metaOf(n.dbPath, "lease_holder") == "a" &&
				metaOf(n.dbPath, "baseline_time") != ""
		})
	}

	sim.SetRates(changesOnly())
	changes := 0
	for range 5 {
		changes += len(sim.Step(2))
		time.Sleep(200 * time.Millisecond) // the data changes while a crawls
	}
	if err := a.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	a.cmd.Wait()
	killed := time.Now()
	changes += len(sim.Step(3)) // changes while nobody leads

	var leader, standby *node
	testutil.WaitFor(t, 4*clusterTTL, "a standby to take over", func() bool {
		for _, n := range []*node{b, c} {
			if metaOf(n.dbPath, "role") == "leader" {
				leader = n
				return true
			}
		}
		return false
	})
	takeover := time.Since(killed)
	if takeover > 2*clusterTTL {
		t.Errorf("takeover took %s, want at most two lease TTLs (%s)", takeover, 2*clusterTTL)
	}
	standby = b
	if leader == b {
		standby = c
	}
	for range 5 {
		changes += len(sim.Step(2))
		time.Sleep(200 * time.Millisecond)
	}
	w.dbPath = leader.dbPath
	w.converge(rcv, 40*time.Second)

	if n, _ := counter.get(standby.token); n != 0 {
		t.Errorf("standby %s made %d upstream requests, want 0", standby.name, n)
	}
	if n, first := counter.get(leader.token); n == 0 || first.Before(killed) {
		t.Errorf("new leader %s: %d upstream requests, the first at %s, before the kill at %s", leader.name, n, first, killed)
	}
	if n, _ := counter.get(a.token); n == 0 {
		t.Error("the first leader made no upstream request: the test proved nothing")
	}
	if got := metaOf(standby.dbPath, "lease_holder"); got != leader.name {
		t.Errorf("standby %s sees lease holder %q, want %q", standby.name, got, leader.name)
	}
	waitSameMirror(t, 20*time.Second, standby.dbPath, leader.dbPath)

	// A follower started late builds its mirror from the stream alone.
	late := &node{name: "late", token: "no-platform-access", dbPath: filepath.Join(dir, "late.db")}
	late.cfg = clusterNodeConfig(t, simURL, natsURL, late)
	late.start(t, "follow")
	waitSameMirror(t, 20*time.Second, late.dbPath, leader.dbPath)
	if got := metaOf(late.dbPath, "role"); got != "follower" {
		t.Errorf("late follower's role = %q, want follower", got)
	}
	total, distinct := rcv.counts()
	t.Logf(
		"takeover by %s %s after SIGKILL (lease TTL %s); %d changes; %d messages, %d distinct events; requests a=%d %s=%d %s=0",
		leader.name,
		takeover.Round(time.Millisecond),
		clusterTTL,
		changes,
		total,
		distinct,
		first(counter.get(a.token)),
		leader.name,
		first(counter.get(leader.token)),
		standby.name,
	)

	for _, n := range []*node{leader, standby, late} {
		n.cmd.Process.Signal(syscall.SIGTERM)
		if err := n.cmd.Wait(); err != nil {
			t.Errorf("%s after SIGTERM: %v; log tail:\n%s", n.name, err, tail(n.out.String(), 20))
		}
	}
}

func first(n int, _ time.Time) int { return n }

func tail(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// withoutDebug is log without its DEBUG and empty lines.
func withoutDebug(log string) string {
	var lines []string
	for _, l := range strings.Split(log, "\n") {
		if l != "" && !strings.Contains(l, `"level":"DEBUG"`) {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}

// logTail is the last n lines a replica logged before the goroutine dump
// a failed test has it write (SIGQUIT), but for DEBUG lines: what a failure
// is read against where the whole log is not kept (.ci/run keeps only the
// test's output; SYNCD_TEST_LOGDIR keeps it all).
func logTail(out string, n int) string {
	logged, dump, dumped := strings.Cut(out, "SIGQUIT: quit")
	s := tail(withoutDebug(logged), n)
	if dumped {
		s += fmt.Sprintf("\n(then a goroutine dump of %d lines)", strings.Count(dump, "\n"))
	}
	return s
}

// TestCluster_LeaderFrozenPastItsLease freezes the leader (SIGSTOP) for
// three lease TTLs while tags are created and moved, so that the standby
// takes over; the old leader wakes up (SIGCONT), stands by, and leads again
// when the other one stops. Its mirror must then equal the truth, history
// included: the first records of the tags created while it was frozen
// reached it only from the stream (history.recorded). Before, it lacked
// them and, as the leader, never read them again.
//
// A watcher of the tags bucket records every value each key took: none
// may go back to an older record of its tag's history, which a write the
// frozen leader had under way when it froze, sent when it woke after the
// other replica's writes, would do without the fence (#30). The consumer
// receives every move once, in order (converge).
func TestCluster_LeaderFrozenPastItsLease(t *testing.T) {
	natsURL := startNATSProcess(t)
	nodes := []*node{{name: "a", token: "tok-a-1f3c", admin: freePort(t)}, {name: "b", token: "tok-b-7d2e"}}
	sim, simURL := testutil.Sim(t, platformsim.Options{Seed: 71, Tokens: []string{nodes[0].token, nodes[1].token}},
		platformsim.Scale{Repos: 2, TagsPerRepo: 3, HistoryPerTag: 3, Advisories: 2, PublicImages: -1})
	dir := t.TempDir()
	for _, n := range nodes {
		n.dbPath = filepath.Join(dir, n.name+".db")
		n.cfg = clusterNodeConfig(t, simURL, natsURL, n)
	}
	w := &world{t: t, sim: sim, simURL: simURL, natsURL: natsURL}
	w.takeBaseline()
	a, b := nodes[0], nodes[1]
	a.start(t, "run")
	testutil.WaitFor(t, 30*time.Second, "a to lead and finish its baseline", func() bool {
		return metaOf(a.dbPath, "role") == "leader" && metaOf(a.dbPath, "baseline_time") != ""
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rcv := consume(ctx, t, natsURL)
	tags := watchKV(ctx, t, natsURL, "syncd_tags")
	b.start(t, "run")
	testutil.WaitFor(t, 30*time.Second, "b to stand by", func() bool {
		return metaOf(b.dbPath, "role") == "standby" && metaOf(b.dbPath, "lease_holder") == "a"
	})

	sim.SetRates(platformsim.Rates{CreateTag: 40, MoveTag: 60})
	// Freeze a while it has events to publish, so that it has writes to
	// send when it wakes: the writes the fence must refuse.
	created, pending := changesUntilPending(t, sim, a.dbPath)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	for time.Since(frozen) < 3*clusterTTL {
		created += len(sim.Step(2))
		time.Sleep(300 * time.Millisecond) // the data changes while b takes over
	}
	testutil.WaitFor(
		t,
		4*clusterTTL,
		"b to take over from the frozen leader",
		func() bool { return metaOf(b.dbPath, "role") == "leader" },
	)
	takeover := time.Since(frozen)
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 4*clusterTTL, "a to stand by after it woke", func() bool {
		return metaOf(a.dbPath, "role") == "standby" && metaOf(a.dbPath, "lease_holder") == "b"
	})
	woke := time.Now()
	fenced := fencedWrites(a.admin)
	if fenced < 0 {
		t.Errorf("a's /metrics has no syncd_fenced_writes_total")
	}
	created += len(sim.Step(2))
	// b stops; a leads again, with the mirror it followed.
	b.cmd.Process.Signal(syscall.SIGTERM)
	if err := b.cmd.Wait(); err != nil {
		t.Errorf("b after SIGTERM: %v", err)
	}
	bStopped := time.Now()
	testutil.WaitFor(t, 4*clusterTTL, "a to lead again", func() bool { return metaOf(a.dbPath, "role") == "leader" })
	w.dbPath = a.dbPath
	w.converge(rcv, 40*time.Second)
	total, distinct := rcv.counts()
	regressions, checked := tags.tagRegressions(rcv)
	// Against the upstream's order, a tag created after the baseline goes
	// back once by design: its tag.created carries the listing's digest,
	// and the tag.moved events of its earlier records follow.
	upstream, _ := tags.truthRegressions(sim.Truth())
	if len(regressions) > 0 {
		t.Logf("frozen at %s, b leads at %s, a woke at %s, b stopped at %s", frozen.Format("15:04:05.000"),
			frozen.Add(takeover).Format("15:04:05.000"), woke.Format("15:04:05.000"), bStopped.Format("15:04:05.000"))
		t.Errorf(
			"%d tag keys went back to an older state (of %d values watched):\n%s",
			len(regressions),
			checked,
			strings.Join(regressions, "\n"),
		)
	}
	if checked == 0 {
		t.Error("the KV watcher saw no tag value: the test proved nothing")
	}
	if m := tags.markers(); m < 3 {
		t.Errorf("the tags bucket's term marker took %d values, want one for each of the 3 terms at least", m)
	}
	t.Logf(
		"frozen %s with events to publish: %v; takeover %s; %d changes; %d messages, %d distinct events; %d tag values watched, %d regressions against the stream (%d against the upstream's order); a's fenced writes %d",
		3*clusterTTL,
		pending,
		takeover.Round(time.Millisecond),
		created,
		total,
		distinct,
		checked,
		len(regressions),
		len(upstream),
		fenced,
	)
	a.cmd.Process.Signal(syscall.SIGTERM)
	if err := a.cmd.Wait(); err != nil {
		t.Errorf("a after SIGTERM: %v; log tail:\n%s", err, tail(a.out.String(), 20))
	}
}

// changesUntilPending changes the simulator's data until the leader's
// mirror at path holds events it has not published yet, or for 10s, and
// returns the changes made and whether it saw such events. The relay
// publishes within milliseconds of a commit, so the outbox is looked at
// every millisecond.
func changesUntilPending(t *testing.T, sim *platformsim.Sim, path string) (int, bool) {
	t.Helper()
	db := openReader(t, path)
	changes := 0
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); {
		changes += len(sim.Step(2))
		for next := time.Now().Add(1500 * time.Millisecond); time.Now().Before(next); time.Sleep(time.Millisecond) {
			var n int
			if db.QueryRow(`SELECT count(*) FROM events WHERE published_time IS NULL`).Scan(&n) == nil && n > 0 {
				return changes, true
			}
		}
	}
	return changes, false
}
