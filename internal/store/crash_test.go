package store_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// The crash test re-runs the test binary as a helper process that writes one
// page and is killed with SIGKILL, either inside the page's transaction or
// after it committed. These variables select the helper and its database.
const (
	crashModeEnv = "STORE_CRASH_HELPER"
	crashDBEnv   = "STORE_CRASH_DB"
)

// crashRecords is the size of the page the helper writes: with the
// helper's small cache, large enough that SQLite spills uncommitted pages
// into the WAL before COMMIT, so recovery has to ignore frames on disk.
const crashRecords = 5000

func crashTag() store.TagRef {
	return store.TagRef{
		UID:        "g1/r1/t1",
		RepoUID:    "g1/r1",
		Repo:       "nginx",
		Name:       "latest",
		UpdateTime: ts("2026-01-01T00:00:00Z"),
	}
}

// crashPage is the history page the helper writes, oldest first; the first
// record is the one the parent already stored.
func crashPage() []store.HistoryRecord {
	t0 := ts("2025-01-01T00:00:00Z")
	recs := make([]store.HistoryRecord, crashRecords+1)
	for i := range recs {
		recs[i] = store.HistoryRecord{Time: t0.Add(time.Duration(i) * time.Minute), Digest: digest(i)}
	}
	return recs
}

func TestCrash_KilledMidTransaction(t *testing.T) {
	if mode := os.Getenv(crashModeEnv); mode != "" {
		crashHelper(t, mode, os.Getenv(crashDBEnv))
		return
	}
	for _, mode := range []string{"inside", "committed"} {
		t.Run(mode, func(t *testing.T) {
			// Each mode has its own mirror and helper process, and most of
			// its time is the helper starting: the two overlap.
			t.Parallel()
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "mirror.db")
			st, err := store.Open(ctx, path, store.Options{Now: newClock().Now})
			if err != nil {
				t.Fatal(err)
			}
			mustApplyRepos(t, st, nginx())
			mustApplyTags(t, st, nginx(), tag("g1/r1/t1", "latest", 0))
			if err := st.EndBaseline(ctx); err != nil {
				t.Fatal(err)
			}
			// The backfill's read of its first record.
			need, err := st.BackfillNext(ctx, 1, func(string) bool { return false })
			if err != nil || len(need) != 1 {
				t.Fatalf("backfill = %v (%v), want the tag", need, err)
			}
			if _, err := st.ApplyHistory(ctx, need[0], crashPage()[:1], false); err != nil {
				t.Fatal(err)
			}
			eventsBefore := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM events`)
			if err := st.Close(); err != nil {
				t.Fatal(err)
			}

			walBytes := runAndKill(t, mode, path)

			st = mustOpen(t, path, store.Options{Now: newClock().Now})
			db := st.Reader()
			if got, want := queryString(t, db, `PRAGMA integrity_check`), "ok"; got != want {
				t.Fatalf("integrity_check=%q, want %q", got, want)
			}
			history := queryInt(t, db, `SELECT COUNT(*) FROM tag_history`)
			moves := queryInt(t, db, `SELECT COUNT(*) FROM events`) - eventsBefore
			count := queryInt(t, db, `SELECT history_count FROM tags WHERE uid = 'g1/r1/t1'`)
			switch mode {
			case "inside":
				t.Logf("WAL left by the killed transaction: %d bytes", walBytes)
				if walBytes < 1<<20 {
					t.Fatalf(
						"the killed transaction left %d bytes of WAL; the test needs it to spill uncommitted pages to disk",
						walBytes,
					)
				}
				if history != 1 || moves != 0 || count != 1 {
					t.Fatalf(
						"after a kill inside the transaction: history=%d new events=%d bookmark=%d, want 1, 0, 1 (none of the page)",
						history,
						moves,
						count,
					)
				}
			case "committed":
				if history != crashRecords+1 || moves != crashRecords || count != crashRecords+1 {
					t.Fatalf("after a kill past the commit: history=%d new events=%d bookmark=%d, want %d, %d, %d (all of the page)",
						history, moves, count, crashRecords+1, crashRecords, crashRecords+1)
				}
			}
			// The mirror goes on from where the crash left it.
			ref := crashTag()
			ref.Bookmark = store.Bookmark{LastTime: crashPage()[count-1].Time, LastCount: 1, Count: count}
			if _, err := st.ApplyHistory(ctx, ref, crashPage()[count-1:], true); err != nil {
				t.Fatal(err)
			}
			if got, want := queryInt(t, db, `SELECT COUNT(*) FROM tag_history`), crashRecords+1; got != want {
				t.Fatalf("history after resuming=%d, want %d", got, want)
			}
		})
	}
}

// runAndKill starts the helper in mode on the database at path, waits for it
// to report that it reached its kill point, kills it with SIGKILL, and
// returns the size of the WAL file it left.
func runAndKill(t *testing.T, mode, path string) int64 {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrash_KilledMidTransaction$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashModeEnv+"="+mode, crashDBEnv+"="+path)
	// The helper blocks reading stdin, which stays open until it is killed.
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var out []string
	reached := false
	sc := bufio.NewScanner(stdout)
	for sc.Scan() {
		out = append(out, sc.Text())
		if sc.Text() == "crash-helper: at kill point" {
			reached = true
			break
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("kill helper: %v", err)
	}
	go io.Copy(io.Discard, stdout) // let Wait finish however much is left
	werr := cmd.Wait()
	if !reached {
		t.Fatalf(
			"helper never reached its kill point (%v)\nstdout:\n%s\nstderr:\n%s",
			werr,
			strings.Join(out, "\n"),
			stderr.String(),
		)
	}
	if st, ok := cmd.ProcessState.Sys().(interface{ Signaled() bool }); !ok || !st.Signaled() {
		t.Fatalf("helper ended with %v, want killed by a signal", werr)
	}
	fi, err := os.Stat(path + "-wal")
	if err != nil {
		t.Fatalf("no WAL after the kill: %v", err)
	}
	return fi.Size()
}

// crashHelper is the helper process: it writes the page and then blocks at
// the kill point, inside the transaction or after its commit, until killed.
func crashHelper(t *testing.T, mode, path string) {
	ctx := context.Background()
	block := func(context.Context) error {
		fmt.Println("crash-helper: at kill point")
		io.Copy(io.Discard, os.Stdin) // returns only if the parent goes away
		return fmt.Errorf("parent went away")
	}
	// A small cache makes SQLite write the page's uncommitted pages to the
	// WAL before COMMIT, so the kill leaves frames that recovery must ignore.
	opts := store.Options{Now: newClock().Now, CacheKiB: 256}
	if mode == "inside" {
		opts.BeforeCommit = block
	}
	st, err := store.Open(ctx, path, opts)
	if err != nil {
		t.Fatalf("helper: %v", err)
	}
	ref := crashTag()
	ref.Bookmark = store.Bookmark{LastTime: crashPage()[0].Time, LastCount: 1, Count: 1}
	if _, err := st.ApplyHistory(ctx, ref, crashPage(), false); err != nil {
		t.Fatalf("helper: %v", err)
	}
	block(ctx)
	t.Fatal("helper: not killed")
}
