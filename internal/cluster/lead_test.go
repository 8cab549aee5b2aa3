package cluster_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/publish"
)

// fakeRelay publishes nothing; it records what the duties asked of it.
type fakeRelay struct {
	mu      sync.Mutex
	running bool
	flushes int
	// flushErr is what Flush returns.
	flushErr error
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
	return r.flushErr
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

// countedOutbox is an outbox of n unpublished events.
type countedOutbox int

func (n countedOutbox) UnpublishedCount(context.Context) (int, time.Time, error) {
	return int(n), time.Time{}, nil
}

// TestDuties_ShutdownSaysWhatTheFlushLeft: a flush at shutdown that
// failed only in the KV buckets, with every event published, says so
// (the next leader reconciles them); one that left events behind says
// how many; one that succeeded says stopped.
func TestDuties_ShutdownSaysWhatTheFlushLeft(t *testing.T) {
	for _, tc := range []struct {
		name   string
		err    error
		outbox countedOutbox
		want   string
	}{
		{"KVBehind", fmt.Errorf("write the KV buckets: %w", publish.ErrKV), 0,
			`level=WARN msg="stopped with every event published; the KV buckets are reconciled by the next leader"`},
		{"EventsLeft", errors.New("nats: timeout"), 7,
			`level=WARN msg="stopped with events unpublished; they are published at the next start, or recorded again by the next leader" unpublished=7`},
		{"KVFailedWithEventsLeft", publish.ErrKV, 3, `msg="stopped with events unpublished;`},
		{"Flushed", nil, 0, `level=INFO msg=stopped`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs strings.Builder
			r := &fakeRelay{flushErr: tc.err}
			d := &cluster.Duties{Work: []func(context.Context) error{r.work(0)}, Relay: r, Outbox: tc.outbox,
				Grace: time.Second, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			if err := d.Run(ctx); err != nil {
				t.Fatalf("Run: %v", err)
			}
			if !strings.Contains(logs.String(), tc.want) {
				t.Errorf("the log does not say %s:\n%s", tc.want, logs.String())
			}
		})
	}
}

// shutDown is a context that has ended (Err is context.Canceled) but whose
// Done channel never says so: Run then sees the work end before it sees
// the shutdown, as it can when the shutdown comes as Run starts and the
// work's goroutine runs first.
type shutDown struct{ context.Context }

func (shutDown) Done() <-chan struct{} { return nil }
func (shutDown) Err() error            { return context.Canceled }

// TestDuties_WorkEndingWithTheShutdownStillDrains: work that ended with
// the shutdown (context.Canceled) before Run saw the shutdown is a
// shutdown all the same: what was committed is flushed, and Run returns
// no error. Before, Run returned the work's context.Canceled, with
// nothing flushed.
func TestDuties_WorkEndingWithTheShutdownStillDrains(t *testing.T) {
	r := &fakeRelay{}
	d := &cluster.Duties{Relay: r, Grace: time.Second,
		Work: []func(context.Context) error{func(context.Context) error { return context.Canceled }}}
	if err := d.Run(shutDown{context.Background()}); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	if r.flushes != 1 {
		t.Errorf("%d flushes, want the drain's 1", r.flushes)
	}
}
