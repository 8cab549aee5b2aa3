package crawler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"
)

// The backfill reads the tags' histories after the baseline's listings,
// while the mirror already serves the current state: at the default
// request rate the listings of a large organization take a minute, its
// histories hours. The store holds what is left to read (store.BackfillNext)
// in its order: the tags a later listing showed moving first, since their
// moves are news waiting on the read, then the newest update first, since
// recent tags are the ones people ask about. The scheduled crawls go on
// meanwhile and mark the tags they see move.

// backfillBatch is how many tags the backfill asks the store for at a time:
// few enough that a tag marked moved waits for few reads before its own,
// enough that the queries cost nothing beside the reads.
func (c *Crawler) backfillBatch() int { return max(64, 4*c.cfg.Concurrency) }

// maxBackfillFailed bounds the tags whose reads failed in one pass of the
// backfill: past it the platform is failing, not a few tags, and the pass
// ends; the next crawl starts another.
const maxBackfillFailed = 1000

// Backfill reads the history of every tag the backfill holds, through the
// crawler's pool of history reads, and returns when none is left, or when
// every one left failed in this pass (recorded in crawl_failures, read
// again by a later pass). One backfill runs at a time; a crawl may run
// beside it.
func (c *Crawler) Backfill(ctx context.Context) (Summary, error) {
	start, req0 := c.cfg.Now(), c.client.Requests()
	var s summary
	err := c.backfillPass(ctx, &s)
	sum := s.snapshot()
	sum.Requests = c.client.Requests() - req0
	sum.Duration = c.cfg.Now().Sub(start)
	return sum, err
}

// backfillPass is Backfill's work, counted in s: a crawl that runs the
// backfill in its own run (Sync, Sweep) counts its reads and failures.
func (c *Crawler) backfillPass(ctx context.Context, s *summary) error {
	c.backfilling.Lock()
	defer c.backfilling.Unlock()
	left, err := c.store.BackfillRemaining(ctx)
	if err != nil || left == 0 {
		return errors.Join(err, c.store.EndBackfill(ctx))
	}
	// A backfill resumed at start, before any crawl, holds back the tags
	// whose reads failed as a crawl does.
	if err := c.failed.load(ctx); err != nil {
		return err
	}
	start, read0 := c.cfg.Now(), s.historyReads.Load()
	c.log.Info("backfill: reading the tags' histories behind the current state", "tags", left)
	stop := c.backfillProgress(ctx, s, read0, left)
	err = c.backfill(ctx, s)
	stop()
	if err != nil {
		return fmt.Errorf("backfill: %w", err)
	}
	if left, err = c.store.BackfillRemaining(ctx); err != nil {
		return err
	}
	if left > 0 {
		c.log.Warn(
			"backfill pass ended with histories left to read; the next crawl goes on with them",
			"left",
			left,
			"failures",
			s.failures.Load(),
		)
		return nil
	}
	if err := c.store.EndBackfill(ctx); err != nil {
		return err
	}
	c.log.Info("backfill complete: the mirror holds every tag's history", "history_reads", s.historyReads.Load()-read0,
		"took", c.cfg.Now().Sub(start).Round(time.Millisecond).String())
	return nil
}

// backfill is one pass over the backfill: it asks the store for the next
// tags in order and reads them as slots of the history pool free up, until
// the store has none but those under way or failed in this pass.
func (c *Crawler) backfill(ctx context.Context, s *summary) error {
	g, gctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	// reading are the tags whose read is under way, failed those whose
	// read failed in this pass: BackfillNext leaves both out. It also
	// leaves out justRead, the tags read since it began: its snapshot of
	// the mirror may be older than their commit, and without them a tag
	// read while the store was asked came back for a second read.
	reading, failed, justRead := map[string]bool{}, map[string]bool{}, map[string]bool{}
	finished := make(chan struct{}, 1)
	underWay := func(uid string) bool {
		mu.Lock()
		defer mu.Unlock()
		return reading[uid]
	}
	skip := func(uid string) bool {
		if c.beforeSkip != nil {
			c.beforeSkip(uid, underWay)
		}
		mu.Lock()
		defer mu.Unlock()
		return reading[uid] || failed[uid] || justRead[uid]
	}
	err := func() error {
		for {
			// A tag read before this call is out of the snapshot it reads.
			mu.Lock()
			clear(justRead)
			mu.Unlock()
			refs, err := c.store.BackfillNext(gctx, c.backfillBatch(), skip)
			if err != nil {
				return err
			}
			mu.Lock()
			busy, nfailed := len(reading), len(failed)
			mu.Unlock()
			if nfailed >= maxBackfillFailed {
				return nil
			}
			if len(refs) == 0 {
				if busy == 0 {
					return nil
				}
				// Only reads under way are left: wait for one to end,
				// since a failed one may leave its tag for the next pass.
				select {
				case <-finished:
				case <-gctx.Done():
					return gctx.Err()
				}
				continue
			}
			for _, ref := range refs {
				mu.Lock()
				reading[ref.UID] = true
				mu.Unlock()
				err := c.startHistoryRead(gctx, g, ref, s, nil, func(err error) error {
					mu.Lock()
					delete(reading, ref.UID)
					justRead[ref.UID] = true
					if c.failed.has(ref.UID) {
						failed[ref.UID] = true
					}
					mu.Unlock()
					select {
					case finished <- struct{}{}:
					default:
					}
					return err
				})
				if err != nil {
					return err
				}
			}
		}
	}()
	return errors.Join(err, g.Wait())
}

// backfillProgress logs how far the backfill is until the returned func is
// called: the histories read (past read0, s's count at its start), those
// left, and the time left at the
// client's rate limit (or, without one, at the rate of the reads so far).
func (c *Crawler) backfillProgress(ctx context.Context, s *summary, read0, total int64) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start := c.cfg.Now()
	go func() {
		defer close(done)
		t := time.NewTicker(c.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				read := s.historyReads.Load() - read0 // a crawl's own reads came before
				left := max(total-read, 0)
				rate := c.client.RequestsPerSecond()
				if rate <= 0 {
					rate = float64(read) / max(c.cfg.Now().Sub(start).Seconds(), 1e-3)
				}
				c.log.Info("backfill", "history_reads", read, "left", left, "eta", BackfillETA(left, rate).String())
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// BackfillETA is the time the backfill needs for left histories at rate
// requests a second, one request each: the rate limit bounds it. Zero for
// an unknown rate.
func BackfillETA(left int64, rate float64) time.Duration {
	if rate <= 0 {
		return 0
	}
	return (time.Duration(float64(left) / rate * float64(time.Second))).Round(time.Second)
}

// backfillSoon asks the backfill loop of Run for a pass.
func (c *Crawler) backfillSoon() {
	select {
	case c.backfillDue <- struct{}{}:
	default:
	}
}

// backfillLoop runs a backfill pass whenever a crawl asks for one, until
// ctx is done: beside the scheduled crawls, which go on meanwhile.
func (c *Crawler) backfillLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.backfillDue:
			// A pass with something to read is a recorded run, whose
			// failures (a tag whose history read failed) show in
			// crawl_runs, syncd status and the metrics as a crawl's do.
			if left, err := c.store.BackfillRemaining(ctx); err != nil || left == 0 {
				if err == nil {
					err = c.store.EndBackfill(ctx)
				}
				if err != nil && ctx.Err() == nil {
					c.log.Error("backfill: check what is left", "err", err)
				}
				continue
			}
			_, err := c.runRecorded(ctx, JobBackfill, func(s *summary) error {
				if err := c.backfillPass(ctx, s); err != nil {
					return err
				}
				return s.allFailed()
			})
			if err != nil && ctx.Err() == nil {
				c.log.Error("backfill failed; the next crawl starts it again", "err", err)
			}
		}
	}
}
