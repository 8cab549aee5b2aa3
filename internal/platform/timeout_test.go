package platform_test

import (
	"context"
	"errors"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

const getRepoPattern = "GET /registry/v2/repos/{uid}"

func oneRepo(t *testing.T) (*env, string) {
	e := newEnv(t, platformsim.Scale{Repos: 1, TagsPerRepo: 1, HistoryPerTag: 1, PublicImages: -1}, nil)
	return e, e.sim.Truth().Repos[0].UID
}

func TestClient_StalledBodyTimesOutThenRetrySucceeds(t *testing.T) {
	e, uid := oneRepo(t)
	// Half the body, then nothing until the client gives up.
	e.sim.SetFaults(platformsim.Fault{Pattern: getRepoPattern, StallRate: 1, Remaining: 1})
	c := e.client(func(cfg *platform.Config) { cfg.Timeout = 300 * time.Millisecond })
	r, err := c.GetRepo(ctxT(t), uid)
	if err != nil || r.UID != uid {
		t.Fatalf("GetRepo = %+v, %v", r, err)
	}
	if got, want := e.requests(getRepoPattern), 2; got != want {
		t.Errorf("%d requests, want %d", got, want)
	}
	if got, want := c.Retries(), int64(1); got != want {
		t.Errorf("%d retries, want %d", got, want)
	}
}

func TestClient_StallingServerGivesUp(t *testing.T) {
	e, uid := oneRepo(t)
	e.sim.SetFaults(platformsim.Fault{Pattern: getRepoPattern, StallRate: 1})
	c := e.client(func(cfg *platform.Config) {
		cfg.Timeout = 100 * time.Millisecond
		cfg.MaxRetryTime = 500 * time.Millisecond
	})
	_, err := c.GetRepo(ctxT(t), uid)
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("err = %v, want the attempt timeout", err)
	}
	if n := e.requests(getRepoPattern); n < 2 {
		t.Errorf("%d requests; want a retry before giving up", n)
	}
}

func TestClient_CancelStopsARequestInFlight(t *testing.T) {
	e, uid := oneRepo(t)
	e.sim.SetFaults(platformsim.Fault{Pattern: getRepoPattern, StallRate: 1})
	arrived := make(chan struct{}, 1)
	var sent atomic.Int64 // counted here: the simulator may count after the call returns
	e.setFront(func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		sent.Add(1)
		select {
		case arrived <- struct{}{}:
		default:
		}
		h.ServeHTTP(w, r)
	})
	c := e.client(nil) // a 10s attempt timeout: only the cancel ends this
	ctx, cancel := context.WithCancel(ctxT(t))
	go func() {
		<-arrived
		cancel()
	}()
	_, err := c.GetRepo(ctx, uid)
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("err = %v, want context.Canceled", err)
	}
	if got := sent.Load(); got != 1 {
		t.Errorf("%d requests; a cancelled call must not retry", got)
	}
}

func TestClient_RequestsPerSecondBoundsTheRate(t *testing.T) {
	e, _ := oneRepo(t)
	const rps = 40
	c := e.client(func(cfg *platform.Config) { cfg.RequestsPerSecond = rps })
	// Eight callers ping as fast as they can for a moment. Whatever the
	// machine's speed, the token bucket lets through at most its burst
	// (rps) plus rps per second elapsed: a bound, not a timing.
	ctx, cancel := context.WithTimeout(ctxT(t), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				_ = c.Ping(ctx)
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	n := e.requests("GET /ping/v2/ping")
	if limit := rps + int(rps*elapsed.Seconds()) + 1; n > limit || n == 0 {
		t.Errorf("%d pings in %v; want 1 to %d", n, elapsed, limit)
	}
}
