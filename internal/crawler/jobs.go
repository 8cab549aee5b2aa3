package crawler

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/robfig/cron/v3"
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
