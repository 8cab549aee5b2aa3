package main

import (
	"database/sql"
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

// historyCounter counts the simulator's tag history requests per
// "<repo path>:<tag>".
type historyCounter struct {
	mu    sync.Mutex
	reads map[string]int
}

func (c *historyCounter) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if image, tag, ok := strings.Cut(strings.TrimPrefix(r.URL.Path, "/v2/acme/"), "/_chainguard/history/"); ok {
			c.mu.Lock()
			c.reads[image+":"+tag]++
			c.mu.Unlock()
		}
		h.ServeHTTP(w, r)
	})
}

func (c *historyCounter) of(key string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads[key]
}

// queryInt runs a count on the mirror at dbPath, read-only; -1 when the
// mirror cannot answer yet.
func queryInt(dbPath, q string) int {
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		return -1
	}
	defer db.Close()
	var n int
	if db.QueryRow(q).Scan(&n) != nil {
		return -1
	}
	return n
}

// TestBackfill_CurrentFirstAndResumesAfterSIGKILL: "syncd run" on an empty
// mirror serves the current state (the mirror and the KV buckets hold
// every tag) while the histories are still being read; killed with
// SIGKILL part way through the backfill and started again, it reads only
// the histories it had not committed, each once, and completes the mirror.
func TestBackfill_CurrentFirstAndResumesAfterSIGKILL(t *testing.T) {
	ns := testutil.NATS(t)
	counter := &historyCounter{reads: map[string]int{}}
	sim, simURL := testutil.Sim(t, platformsim.Options{Seed: 31, Tokens: []string{e2eToken}},
		platformsim.Scale{Repos: 4, TagsPerRepo: 20, HistoryPerTag: 2, Advisories: 2, PublicImages: -1}, counter.wrap)
	truth := sim.Truth()
	tags := len(truth.Tags)
	dbPath := filepath.Join(t.TempDir(), "syncd.db")
	// At 20 requests a second the 80 histories take four seconds: time to
	// look at the mirror before they are all read, and to kill it midway.
	cfg := testConfig{simURL: simURL, natsURL: ns.URL(), dbPath: dbPath,
		crawl: "schedule = \"@every 1s\"\njitter = \"0s\"\nrequests_per_second = 20.0\nconcurrency = 2"}.write(t)
	start := func() *exec.Cmd {
		cmd := exec.Command(os.Args[0], "run", "--config", cfg)
		cmd.Env = append(os.Environ(), execMainEnv+"=1")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
		return cmd
	}
	const left = `SELECT COUNT(*) FROM backfill`
	t0 := time.Now()
	cmd := start()

	// The current state: every tag listed, in the mirror and in the KV
	// bucket, while histories are still to read.
	waitBaseline(t, dbPath)
	t.Logf("%s: baseline", time.Since(t0))
	js := testutil.JetStream(t, ns.URL())
	testutil.WaitFor(t, 30*time.Second, "the tags bucket to hold every tag", func() bool {
		return len(kvBucket(t, js, "syncd_tags")) == tags
	})
	if n := queryInt(dbPath, left); n <= 0 {
		t.Fatalf("backfill left = %d once the current state was in the KV bucket, want histories still to read", n)
	}
	checkBucketsMatchTruth(t, js, truth)
	t.Logf("%s: KV", time.Since(t0))

	// Kill it with some histories read and others not.
	testutil.WaitFor(t, 30*time.Second, "a part of the backfill", func() bool {
		n := queryInt(dbPath, left)
		return n >= 0 && n <= tags-15
	})
	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	pending := map[string]bool{}
	db, err := sql.Open("sqlite", "file:"+dbPath+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	rows, err := db.Query(
		`SELECT r.path || ':' || t.name FROM backfill b JOIN tags t ON t.uid = b.tag_uid JOIN repos r ON r.uid = t.repo_uid`,
	)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var key string
		if err := rows.Scan(&key); err != nil {
			t.Fatal(err)
		}
		pending[key] = true
	}
	rows.Close()
	db.Close()
	if len(pending) == 0 || len(pending) == tags {
		t.Fatalf("killed with %d of %d histories left, want some read and some not", len(pending), tags)
	}

	t.Logf("%s: killed", time.Since(t0))
	cmd = start()
	testutil.WaitFor(t, 60*time.Second, "the backfill to complete", func() bool { return queryInt(dbPath, left) == 0 })
	t.Logf("%s: complete", time.Since(t0))
	// Done with it: what it committed is what is checked.
	cmd.Process.Kill()
	cmd.Wait()

	paths := map[string]string{}
	for _, r := range truth.Repos {
		paths[r.UID] = r.Path
	}
	twice := 0
	for _, tag := range truth.Tags {
		key := paths[tag.RepoUID] + ":" + tag.Name
		n := counter.of(key)
		switch {
		case !pending[key] && n != 1:
			t.Errorf("tag %s, committed before the kill: history read %d times, want once", key, n)
		case pending[key] && (n < 1 || n > 2):
			t.Errorf(
				"tag %s, left at the kill: history read %d times, want once or, if read but not committed when killed, twice",
				key,
				n,
			)
		case n == 2:
			twice++
		}
	}
	var records int
	for _, h := range sim.Truth().History {
		records += len(h)
	}
	if got := queryInt(dbPath, `SELECT COUNT(*) FROM tag_history`); got != records {
		t.Errorf("%d history records in the mirror, want %d", got, records)
	}
	if got := queryInt(dbPath, `SELECT COUNT(DISTINCT tag_uid) FROM tag_history`); got != tags {
		t.Errorf("history of %d tags in the mirror, want %d", got, tags)
	}
	// Read twice only what was on the wire or waiting for its commit when
	// killed: at most the pool's reads and those queued for the writer.
	if twice > 2*2+8*2 {
		t.Errorf("%d histories read twice, more than the reads a kill can catch in flight", twice)
	}
	t.Logf("killed with %d of %d histories left; %d read again after the restart", len(pending), tags, twice)
	if n := queryInt(dbPath, `SELECT COUNT(*) FROM events WHERE type != 'history.recorded'`); n != 0 {
		t.Errorf("%d events for an organization that did not change, want none", n)
	}
}
