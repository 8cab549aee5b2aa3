package platform_test

import (
	"bytes"
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
)

// lockedBuffer is a log sink safe for the client's goroutines.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// TestClient_RetriesWarnOncePerBurst: a burst of failing requests is
// retried and logged at WARN once, with what failed, the attempt and the
// next try, not once per retry, and never with the token.
func TestClient_RetriesWarnOncePerBurst(t *testing.T) {
	var calls atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if calls.Add(1)%3 != 0 { // two failures before each success
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"uid":"org1/r","name":"nginx"}`))
	}))
	defer srv.Close()
	var logs lockedBuffer
	c, err := platform.New(
		platform.Config{BaseURL: srv.URL, RegistryURL: srv.URL, Token: platform.StaticToken("secret-token-xyz"),
			RetryInitialInterval: time.Millisecond, RetryMaxInterval: 2 * time.Millisecond,
			Logger: slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))},
	)
	if err != nil {
		t.Fatal(err)
	}
	for range 5 {
		if _, err := c.GetRepo(context.Background(), "org1/r"); err != nil {
			t.Fatal(err)
		}
	}
	if got := c.Retries(); got != 10 {
		t.Fatalf("retries=%d, want 10", got)
	}
	out := logs.String()
	if n := strings.Count(out, "level=WARN"); n != 1 {
		t.Errorf("%d warnings for one burst of 10 retries, want 1:\n%s", n, out)
	}
	for _, want := range []string{
		"retrying with backoff",
		"endpoint=\"GET /registry/v2/repos/{uid}\"",
		"attempt=1",
		"next_try_in=",
		"503",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("the warning does not say %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "secret-token-xyz") {
		t.Error("the token reached the log")
	}
}
