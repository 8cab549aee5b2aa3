package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/publish"
)

// Relay is what the leader's duties need of the outbox relay.
type Relay interface {
	// Run publishes what is committed until ctx is done.
	Run(ctx context.Context) error
	// Flush publishes until the outbox is empty or an error stops it.
	Flush(ctx context.Context) error
}

// UnpublishedCounter counts the events not published yet, for the log at
// shutdown: the store.
type UnpublishedCounter interface {
	UnpublishedCount(ctx context.Context) (int, time.Time, error)
}

// Duties are the leader's work, and the one place its shutdown sequence is
// written: stop taking work, let the work finish the page in flight, then
// publish what was committed, all within Grace. "syncd run" runs them
// directly in single mode, and as a Replica's Lead while it holds the lease
// in cluster mode.
type Duties struct {
	// Work runs until its context is done: the crawler's jobs and the
	// receiver's queue. A crawl stopped by shutdown commits the page it
	// read before it stops.
	Work []func(ctx context.Context) error
	// Relay publishes the outbox while the work runs, and what the work
	// committed until it stopped.
	Relay  Relay
	Outbox UnpublishedCounter
	// Grace bounds the shutdown, counted from the end of Run's context.
	Grace time.Duration
	// Drain, when set, says at the end of Run's context whether to publish
	// what was committed: not when the lease was lost, since another
	// replica may lead already and the relay must stop at once. nil: always.
	Drain  func() bool
	Logger *slog.Logger
}

// Run does the duties until ctx is done, and then shuts them down. It
// returns an error when the work failed on its own, or did not stop within
// Grace; events left unpublished are logged and go out at the next start
// (or are recorded again by the next leader).
func (d *Duties) Run(ctx context.Context) error {
	log := d.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	// The relay outlives the work, so that what the work commits while it
	// finishes is published too.
	relayCtx, cancelRelay := context.WithCancel(context.WithoutCancel(ctx))
	relayDone := make(chan error, 1)
	go func() { relayDone <- d.Relay.Run(relayCtx) }()
	stopRelay := sync.OnceFunc(func() { cancelRelay(); <-relayDone })
	defer stopRelay()
	workDone := make(chan error, 1)
	go func() { workDone <- d.work(ctx) }()

	select {
	case err := <-workDone:
		if ctx.Err() == nil || (err != nil && !errors.Is(err, context.Canceled)) {
			return err
		}
		// The work ended with the shutdown, and its goroutine ran before
		// this select (a shutdown as Run starts, work that returns at once):
		// shut down all the same, flush included, rather than return its
		// context.Canceled as a failure with nothing flushed.
		workDone <- err
	case <-ctx.Done():
	}
	deadline := time.Now().Add(d.Grace)
	drain := d.Drain == nil || d.Drain()
	if drain {
		log.Info("shutting down: finishing the page in flight, then publishing what is committed", "grace", d.Grace.String())
	} else {
		stopRelay()
	}
	select {
	case err := <-workDone:
		if err != nil && !errors.Is(err, context.Canceled) {
			log.Error("stopping", "err", err)
		}
	case <-time.After(time.Until(deadline)):
		return fmt.Errorf(
			"work still running %s after the shutdown signal; exiting anyway (the mirror is consistent: unfinished transactions roll back)",
			d.Grace,
		)
	}
	stopRelay()
	if drain {
		d.flush(context.WithoutCancel(ctx), deadline, log)
	}
	return nil
}

// work runs Work until ctx is done or one of it fails.
func (d *Duties) work(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	for _, w := range d.Work {
		g.Go(func() error { return w(gctx) })
	}
	return g.Wait()
}

// flush publishes what is committed until deadline.
func (d *Duties) flush(ctx context.Context, deadline time.Time, log *slog.Logger) {
	fctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	if err := d.Relay.Flush(fctx); err != nil {
		n := -1
		if d.Outbox != nil {
			n, _, _ = d.Outbox.UnpublishedCount(ctx)
		}
		if n == 0 && errors.Is(err, publish.ErrKV) {
			log.Warn("stopped with every event published; the KV buckets are reconciled by the next leader", "err", err)
			return
		}
		log.Warn(
			"stopped with events unpublished; they are published at the next start, or recorded again by the next leader",
			"unpublished",
			n,
			"err",
			err,
		)
		return
	}
	log.Info("stopped")
}
