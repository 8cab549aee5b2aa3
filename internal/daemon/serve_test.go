package daemon_test

import (
	"context"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/daemon"
)

// TestServeHTTP_StopsWithARequestInFlight: a request that is still running
// when the server is told to stop is cut after the shutdown wait, and the
// server stops without an error. Before, ServeHTTP returned "context
// deadline exceeded", and "syncd run --demo" exited 1 when the simulator
// served a request as it stopped (TestRunDemo_LeavesProductionAlone, now
// and then).
func TestServeHTTP_StopsWithARequestInFlight(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	started, release := make(chan struct{}), make(chan struct{})
	defer close(release)
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		close(started)
		<-release
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- daemon.ServeHTTP(ctx, ln, h) }()
	go http.Get("http://" + ln.Addr().String()) //nolint:errcheck // cut by the server
	<-started
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("ServeHTTP with a request in flight at shutdown: %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ServeHTTP did not return within 10s of its context's end")
	}
}
