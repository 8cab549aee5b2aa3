package cluster_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
)

// fakeRelay publishes nothing; it records what the duties asked of it.
type fakeRelay struct {
	mu      sync.Mutex
	running bool
	flushes int
	// stoppedBeforeWork is whether Run had returned when the work ended.
	stoppedBeforeWork bool
}

func (r *fakeRelay) Run(ctx context.Context) error {
	r.set(func() { r.running = true })
	<-ctx.Done()
	r.set(func() { r.running = false })
	return nil
}

func (r *fakeRelay) Flush(context.Context) error {
	r.set(func() { r.flushes++ })
	return nil
}

func (r *fakeRelay) set(fn func()) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fn()
}

// work blocks until ctx is done, then takes finish to wind down, and
// records whether the relay was still running then.
func (r *fakeRelay) work(finish time.Duration) func(ctx context.Context) error {
	return func(ctx context.Context) error {
		<-ctx.Done()
		time.Sleep(finish) // the page in flight
		r.set(func() { r.stoppedBeforeWork = !r.running })
		return ctx.Err()
	}
}

// TestDuties_Shutdown: at shutdown the relay keeps publishing while the
// work finishes its page, and then what was committed is flushed; a leader
// that lost its lease stops publishing at once and flushes nothing; work
// that outlives the grace period is an error.
func TestDuties_Shutdown(t *testing.T) {
	for _, tc := range []struct {
		name        string
		drain       bool
		finish      time.Duration
		wantErr     bool
		wantFlushes int
		wantStopped bool
	}{
		{name: "Drain", drain: true, finish: 20 * time.Millisecond, wantFlushes: 1},
		{name: "LeaseLost", drain: false, finish: 20 * time.Millisecond, wantStopped: true},
		{name: "WorkOutlivesGrace", drain: true, finish: time.Second, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := &fakeRelay{}
			d := &cluster.Duties{Work: []func(context.Context) error{r.work(tc.finish)}, Relay: r,
				Grace: 300 * time.Millisecond, Drain: func() bool { return tc.drain }}
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- d.Run(ctx) }()
			cancel()
			err := <-done
			if got := err != nil; got != tc.wantErr {
				t.Fatalf("Run = %v, want an error: %v", err, tc.wantErr)
			}
			if tc.wantErr {
				return
			}
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.flushes != tc.wantFlushes || r.stoppedBeforeWork != tc.wantStopped {
				t.Errorf(
					"flushes=%d, relay stopped before the work=%v; want %d and %v",
					r.flushes,
					r.stoppedBeforeWork,
					tc.wantFlushes,
					tc.wantStopped,
				)
			}
		})
	}
}

// TestDuties_WorkFails: work that fails on its own ends Run with its error.
func TestDuties_WorkFails(t *testing.T) {
	boom := errors.New("boom")
	d := &cluster.Duties{
		Work:  []func(context.Context) error{func(context.Context) error { return boom }},
		Relay: &fakeRelay{},
		Grace: time.Second,
	}
	if err := d.Run(context.Background()); !errors.Is(err, boom) {
		t.Fatalf("Run = %v, want %v", err, boom)
	}
}
