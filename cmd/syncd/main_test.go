package main

import (
	"bytes"
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	_ "modernc.org/sqlite"
)

// syncBuffer is a bytes.Buffer safe for the concurrent writes of a logger.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// openReader opens the mirror read-only, as an analyst would.
func openReader(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro&_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func runMain(ctx context.Context, args ...string) (code int, stdout, stderr string) {
	var out, errb syncBuffer
	code = NewMain(&out, &errb, nil).Run(ctx, args)
	return code, out.String(), errb.String()
}

func TestMain_ConfigErrorsExit2(t *testing.T) {
	for _, tc := range []struct {
		name, file, want string
	}{
		{"UnknownKey", "[nats]\nsubject_prefix = \"x\"\nurll = \"nats://a:1\"\n", ":3: nats.urll: unknown key"},
		{"Malformed", "[nats]\nurl = nats://a:1\n", "syncd.toml:2"},
		{"BadSchedule", "[crawl]\nschedule = \"sometimes\"\n", "crawl.schedule"},
		{"MissingRequired", "[platform]\nbase_url = \"https://api.example.com\"\n", "platform.registry_url: required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := writeFile(t, "syncd.toml", tc.file)
			code, _, stderr := runMain(context.Background(), "run", "--config", p)
			if code != exitUsage {
				t.Fatalf("exit=%d, want %d; stderr: %s", code, exitUsage, stderr)
			}
			if !strings.Contains(stderr, tc.want) {
				t.Fatalf("stderr=%q, want it to contain %q", stderr, tc.want)
			}
		})
	}
}

func TestMain_Usage(t *testing.T) {
	if code, _, stderr := runMain(context.Background(), "frobnicate"); code != exitUsage ||
		!strings.Contains(stderr, "unknown command") {
		t.Fatalf("exit=%d stderr=%q, want 2 and 'unknown command'", code, stderr)
	}
	if code, _, stderr := runMain(context.Background(), "sync"); code != exitUsage ||
		!strings.Contains(stderr, "--once is required") {
		t.Fatalf("exit=%d stderr=%q, want 2 and '--once is required'", code, stderr)
	}
	for _, args := range [][]string{{"--version"}, {"version"}} {
		if code, stdout, _ := runMain(context.Background(), args...); code != exitOK || !strings.HasPrefix(stdout, "syncd ") {
			t.Errorf("syncd %s: exit=%d, stdout=%q; want 0 and the version", args[0], code, stdout)
		}
	}
	for _, cmd := range []string{"run", "sync", "status", "sim", "subscriptions", "identity", "follow", "check", "query"} {
		code, _, stderr := runMain(context.Background(), cmd, "--help")
		if code != exitOK || !strings.Contains(stderr, "Usage: syncd "+cmd) || !strings.Contains(stderr, "Example") {
			t.Errorf("%s --help: exit=%d, stderr=%q; want 0, usage and examples", cmd, code, stderr)
		}
	}
}
