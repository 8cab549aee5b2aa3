package publish_test

import (
	"bytes"
	"log/slog"
	"strings"
	"sync"
	"testing"

	"github.com/syncd-dev/syncd/internal/publish"
)

type syncWriter struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (w *syncWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

func (w *syncWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

// TestStartEmbedded_LogsReachSyncd: the embedded server's own log lines go
// to syncd's logger (notices at debug), where they were discarded before.
func TestStartEmbedded_LogsReachSyncd(t *testing.T) {
	var out syncWriter
	log := slog.New(slog.NewTextHandler(&out, &slog.HandlerOptions{Level: slog.LevelDebug}))
	ns, err := publish.StartEmbedded(publish.Config{DataDir: t.TempDir()}, log)
	if err != nil {
		t.Fatal(err)
	}
	ns.Shutdown()
	ns.WaitForShutdown()
	if s := out.String(); !strings.Contains(s, "JetStream") || !strings.Contains(s, "level=DEBUG") {
		t.Errorf("the embedded server's start was not logged:\n%s", s)
	}
}
