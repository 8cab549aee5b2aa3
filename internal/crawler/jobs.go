package crawler

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/robfig/cron/v3"
	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/store"
)

// Names of the scheduled jobs, as crawl_runs, the metrics' crawl_job label
// and readiness name them.
const (
	JobCrawl         = "crawl"
	JobSweep         = "sweep"
	JobAdvisories    = "advisories"
	JobSubscriptions = "subscriptions"
	JobPrune         = "prune"
	// JobBackfill is a pass of the backfill of the tags' histories that
	// runs beside the schedule (Run), recorded like the jobs.
	JobBackfill = "backfill"
)

// Job is scheduled work.
type Job struct {
	Name     string
	Schedule cron.Schedule // nil: the job is off
	Run      func(ctx context.Context) error
	// AtStart is what runs once when the jobs start; nil: Run.
	AtStart func(ctx context.Context) error
	// NoStartRun leaves the job's first run to its schedule.
	NoStartRun bool
}

// Scheduler runs jobs: each once at start, one after another in the order
// given, and then on its schedule until ctx is done. A job still running
// when it is due again skips that run; a panic in a job is logged and the
// schedule goes on.
type Scheduler struct {
	// Jitter delays each scheduled run by a random amount up to it, so
	// replicas and jobs do not hit the platform in step.
	Jitter time.Duration
	Logger *slog.Logger
}

// Run runs jobs until ctx is done.
func (s Scheduler) Run(ctx context.Context, jobs ...Job) error {
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	logger := cronLogger{log}
	sched := cron.New(cron.WithChain(cron.Recover(logger), cron.SkipIfStillRunning(logger)), cron.WithLogger(logger))
	for _, j := range jobs {
		if j.Schedule == nil {
			continue
		}
		sched.Schedule(j.Schedule, cron.FuncJob(func() {
			if s.Jitter > 0 && !sleep(ctx, rand.N(s.Jitter)) {
				return
			}
			runLogged(ctx, log, j.Name, j.Run)
		}))
	}
	sched.Start()
	for _, j := range jobs {
		if j.Schedule == nil || j.NoStartRun {
			continue
		}
		run := j.Run
		if j.AtStart != nil {
			run = j.AtStart
		}
		runLogged(ctx, log, j.Name, run)
	}
	<-ctx.Done()
	<-sched.Stop().Done()
	return nil
}

// sleep waits d, or less when ctx is done first; it reports whether it
// waited the whole of d.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func runLogged(ctx context.Context, log *slog.Logger, name string, run func(context.Context) error) {
	if ctx.Err() != nil {
		return
	}
	if err := run(ctx); err != nil && ctx.Err() == nil {
		log.Error(name+" failed", "err", err)
	}
}

// cronLogger adapts slog to cron.Logger.
type cronLogger struct{ log *slog.Logger }

func (l cronLogger) Info(msg string, kv ...any) { l.log.Debug("cron: "+msg, kv...) }
func (l cronLogger) Error(err error, msg string, kv ...any) {
	l.log.Error("cron: "+msg, append(kv, "err", err)...)
}

// Run runs the extra jobs and the crawler's own (the incremental crawl, the
// sweep and the advisories, on the schedules of its Config) until ctx is
// done: each once at start, the extra jobs first, and then on its schedule.
// Extra jobs are reported to OnRun as the crawler's are. The sweep waits
// for its schedule, since the crawl at start lists everything already.
func (c *Crawler) Run(ctx context.Context, extra ...Job) error {
	// Extra jobs run first at start: the event subscription should be in
	// place before a long first crawl, so pushes are not missed meanwhile.
	jobs := make([]Job, 0, len(extra)+3)
	for _, j := range extra {
		jobs = append(jobs, c.observed(j))
	}
	jobs = append(jobs, c.jobs(c.cfg.Now())...)
	// The backfill runs beside the schedule, not in the crawl's job: the
	// crawls go on while it reads, and mark the tags they see move.
	ctx, stop := context.WithCancel(ctx)
	backfill := make(chan struct{})
	go func() {
		defer close(backfill)
		c.backfillLoop(ctx)
	}()
	err := Scheduler{Jitter: c.cfg.Jitter, Logger: c.log}.Run(ctx, jobs...)
	stop()
	<-backfill
	return err
}

// jobs are the crawler's own jobs, for a start at started.
func (c *Crawler) jobs(started time.Time) []Job {
	advisories := func(ctx context.Context) error { _, err := c.SyncAdvisories(ctx); return err }
	return []Job{
		{Name: JobCrawl, Schedule: c.cfg.Schedule, Run: c.thenBackfill(c.sync)},
		{Name: JobSweep, Schedule: c.cfg.SweepSchedule, NoStartRun: true, Run: c.thenBackfill(c.sweep)},
		{Name: JobAdvisories, Schedule: c.cfg.AdvisoriesSchedule, Run: advisories, AtStart: func(ctx context.Context) error {
			if !c.AdvisoriesListedSince(started) {
				return advisories(ctx)
			}
			// The run is recorded (crawl_runs, metrics, freshness) as what
			// it is: the advisories are in the mirror, and it cost nothing.
			c.log.Info("advisories were listed by the baseline crawl; their job starts with its schedule")
			_, err := c.recordRun(ctx, JobAdvisories, func(*summary) error { return nil })
			return err
		}},
	}
}

// thenBackfill runs crawl and then asks the backfill loop for a pass: the
// first crawl's listings fill the backfill, and a pass that ended with
// reads failed goes on after a later crawl.
func (c *Crawler) thenBackfill(crawl func(context.Context) (Summary, error)) func(context.Context) error {
	return func(ctx context.Context) error {
		_, err := crawl(ctx)
		c.backfillSoon()
		return err
	}
}

// observed wraps j's runs so that OnRun is told of each.
func (c *Crawler) observed(j Job) Job {
	if c.cfg.OnRun == nil {
		return j
	}
	wrap := func(run func(context.Context) error) func(context.Context) error {
		if run == nil {
			return nil
		}
		return func(ctx context.Context) error {
			start := c.cfg.Now()
			err := run(ctx)
			c.cfg.OnRun(j.Name, outcomeOf(ctx, err, Summary{}), Summary{Duration: c.cfg.Now().Sub(start)}, c.cfg.Now())
			return err
		}
	}
	j.Run, j.AtStart = wrap(j.Run), wrap(j.AtStart)
	return j
}

// Pruner is what the prune job needs of the store.
type Pruner interface {
	PruneEvents(ctx context.Context, cutoff time.Time) (int64, error)
	PruneDeliveries(ctx context.Context, cutoff time.Time) (int64, error)
}

// deliveryRetention is how long the ids of pushed events are remembered:
// far longer than the platform retries a delivery.
const deliveryRetention = 7 * 24 * time.Hour

// PruneJob deletes published events older than retention, and the ids of
// deliveries older than a week, at start and hourly. Every role runs it: a
// standby's and a follower's mirror keep the events they applied.
func PruneJob(st Pruner, retention time.Duration, log *slog.Logger) Job {
	return Job{Name: JobPrune, Schedule: cron.Every(time.Hour), Run: func(ctx context.Context) error {
		if n, err := st.PruneEvents(ctx, time.Now().Add(-retention)); err != nil && ctx.Err() == nil {
			log.Warn("pruning old events failed", "err", err)
		} else if n > 0 {
			log.Info("pruned published events", "count", n, "older_than", retention.String())
		}
		if _, err := st.PruneDeliveries(ctx, time.Now().Add(-deliveryRetention)); err != nil && ctx.Err() == nil {
			log.Warn("pruning old delivery ids failed", "err", err)
		}
		return nil
	}}
}

// ResolveFollowed readies a mirror built from the stream for crawling, when
// its replica is promoted to leader: the tags it knows only from the stream
// get the history the old leader had (see store.ResolveHistory), so that the
// first crawl announces only what is new. The reads share the crawler's
// pool of history reads; one that fails leaves its tag to be read silently.
func (c *Crawler) ResolveFollowed(ctx context.Context) error {
	refs, err := c.store.UnresolvedTags(ctx)
	if err != nil || len(refs) == 0 {
		return err
	}
	start := c.cfg.Now()
	g, gctx := errgroup.WithContext(ctx)
	var mu sync.Mutex
	resolved := 0
	for _, ref := range refs {
		if err := c.histories.Acquire(gctx, 1); err != nil {
			break // gctx is done: g.Wait says why
		}
		g.Go(func() error {
			ok, err := c.resolveHistory(gctx, ref)
			if ok {
				mu.Lock()
				resolved++
				mu.Unlock()
			}
			return err
		})
	}
	if err = g.Wait(); err == nil {
		err = ctx.Err()
	}
	c.log.Info("readied the followed mirror for crawling", "tags", len(refs), "resolved", resolved, "took", c.cfg.Now().Sub(start).Round(time.Millisecond).String())
	return err
}

// resolveHistory reads one tag's whole history and resolves the tag with
// it, holding a slot of the history pool until the read is done.
func (c *Crawler) resolveHistory(ctx context.Context, ref store.TagRef) (bool, error) {
	recs, err := c.client.HistorySince(ctx, c.client.PrivateImage(ref.Path), ref.Name, time.Time{})
	c.histories.Release(1)
	if err != nil {
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		c.log.Warn("read history to ready a tag for crawling; its history is read silently", "repo", ref.Path, "tag", ref.Name, "err", err)
		return false, nil
	}
	out := make([]store.HistoryRecord, len(recs))
	for i, rec := range recs {
		out[i] = store.HistoryRecord{Time: rec.UpdateTimestamp, Digest: rec.Digest}
	}
	if _, err := c.store.ResolveHistory(ctx, ref, out); err != nil {
		return false, err
	}
	return true, nil
}
