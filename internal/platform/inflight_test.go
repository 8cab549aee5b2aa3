package platform_test

import (
	"net/http"
	"sync"
	"testing"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/platform"
)

// MaxInFlight bounds the requests on the wire however many calls are made
// at once, and every call still gets its answer.
func TestClient_MaxInFlightBoundsRequestsOnTheWire(t *testing.T) {
	e, _ := oneRepo(t)
	const bound, calls = 2, 8
	var (
		mu                  sync.Mutex
		cond                = sync.NewCond(&mu)
		inFlight, most, got int
	)
	// Each request waits in the server until the bound is reached (or the
	// last one came), so the bound is reached and any request past it
	// would be seen.
	e.setFront(func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		mu.Lock()
		inFlight++
		got++
		most = max(most, inFlight)
		cond.Broadcast()
		for inFlight < bound && got < calls {
			cond.Wait()
		}
		mu.Unlock()
		h.ServeHTTP(w, r)
		mu.Lock()
		inFlight--
		mu.Unlock()
	})
	c := e.client(func(cfg *platform.Config) { cfg.MaxInFlight = bound })
	if c.MaxInFlight() != bound {
		t.Fatalf("MaxInFlight() = %d, want %d", c.MaxInFlight(), bound)
	}
	var g errgroup.Group
	for range calls {
		g.Go(func() error { return c.Ping(ctxT(t)) })
	}
	if err := g.Wait(); err != nil {
		t.Fatal(err)
	}
	if most != bound || got != calls {
		t.Errorf("at most %d requests at once of %d; want %d of %d", most, got, bound, calls)
	}
}
