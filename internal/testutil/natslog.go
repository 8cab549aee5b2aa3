package testutil

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// serverLog keeps the last lines a NATS server of a test logged (notices,
// warnings and errors), so that a failed test can say what the server saw:
// a JetStream request that went unanswered is otherwise a bare timeout.
type serverLog struct {
	mu    sync.Mutex
	lines []string
	next  int // where the next line goes once lines is full
}

// serverLogLines bounds what a serverLog keeps.
const serverLogLines = 4000

func (l *serverLog) add(level, format string, v ...any) {
	line := time.Now().UTC().Format("15:04:05.000000") + " " + level + " " + fmt.Sprintf(format, v...)
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.lines) < serverLogLines {
		l.lines = append(l.lines, line)
		return
	}
	l.lines[l.next] = line
	l.next = (l.next + 1) % serverLogLines
}

// String is the lines kept, oldest first.
func (l *serverLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(append(append([]string(nil), l.lines[l.next:]...), l.lines[:l.next]...), "\n") + "\n"
}

func (l *serverLog) Noticef(format string, v ...any) { l.add("INF", format, v...) }
func (l *serverLog) Warnf(format string, v ...any)   { l.add("WRN", format, v...) }
func (l *serverLog) Errorf(format string, v ...any)  { l.add("ERR", format, v...) }
func (l *serverLog) Fatalf(format string, v ...any)  { l.add("FTL", format, v...) }
func (l *serverLog) Debugf(string, ...any)           {}
func (l *serverLog) Tracef(string, ...any)           {}

// keepOnFailure has a failed test keep the log: in the directory
// $SYNCD_TEST_LOGDIR names, if any, as <test>-nats-<server>.log; otherwise
// its last lines in the test's output, for the servers of a cluster
// (where a node's view of its peers is what a failure turns on).
func (l *serverLog) keepOnFailure(tb testing.TB, clustered bool, nameOf func() string) {
	tb.Cleanup(func() {
		if !tb.Failed() {
			return
		}
		server := nameOf()
		dir := os.Getenv("SYNCD_TEST_LOGDIR")
		if dir == "" {
			if clustered {
				tb.Logf("NATS server %s, last lines of its log:\n%s", server, tailLines(l.String(), 40))
			}
			return
		}
		name := strings.NewReplacer("/", "_", " ", "_").Replace(tb.Name()) + "-nats-" + server + ".log"
		path := filepath.Join(dir, name)
		err := os.MkdirAll(dir, 0o700)
		if err == nil {
			err = os.WriteFile(path, []byte(l.String()), 0o600)
		}
		if err != nil {
			tb.Logf("keep the log of NATS server %s: %v", server, err)
			return
		}
		tb.Logf("NATS server %s log: %s", server, path)
	})
}

// tailLines is the last n lines of s.
func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
