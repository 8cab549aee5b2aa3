package crawler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path"
	"sync"
	"sync/atomic"
	"time"

	"github.com/robfig/cron/v3"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// Config configures a Crawler.
type Config struct {
	Group   string   // uid of the group whose repos are mirrored
	Include []string // repo name patterns (path.Match); empty: all
	Exclude []string // repo name patterns to leave out
	// PublicImages are images of PublicOrg whose latest and latest-dev
	// history is followed anonymously.
	PublicImages []string
	PublicOrg    string
	// Families are the hidden tag families to list and mirror.
	Families Families
	// Concurrency is how many repos are listed at once, and separately how
	// many tag histories are read at once across all repos: most of a
	// crawl's requests are history reads, so they are pooled rather than
	// read one after another within each repo. When the client keeps at
	// most Concurrency requests on the wire (platform.Config.MaxInFlight),
	// twice as many history reads go at once, so that the wire stays full.
	Concurrency int
	// Schedule runs the incremental crawl; SweepSchedule the full sweep,
	// the only pass that records deletions; AdvisoriesSchedule the
	// advisories. A nil schedule disables its job.
	Schedule, SweepSchedule, AdvisoriesSchedule cron.Schedule
	// Jitter delays each scheduled run by a random amount up to it, so
	// replicas and jobs do not hit the platform in step.
	Jitter time.Duration
	Logger *slog.Logger
	Now    func() time.Time
	// ProgressEvery is how often a long crawl logs its progress; default 10s.
	ProgressEvery time.Duration
	// UpdatedSinceMargin is how far before the newest tag update the mirror
	// holds an incremental crawl asks from (updated_since): room for the
	// upstream's clock and for updates committed out of order. Default 2m.
	UpdatedSinceMargin time.Duration
	// OnRun, when set, is told of every finished job (for metrics and
	// readiness): its outcome (ok, partial, failed, canceled), duration and
	// counts.
	OnRun func(job, outcome string, sum Summary, finished time.Time)
}

// Crawler mirrors the platform into the store.
type Crawler struct {
	client *platform.Client
	store  *store.Store
	cfg    Config
	log    *slog.Logger
	mu     sync.Mutex // one crawl at a time
	// histories bounds the history reads in flight, shared by the crawl
	// and the refresh jobs pushed events ask for.
	histories *semaphore.Weighted
	// committing bounds the history reads started and not yet committed;
	// pending the records they hold.
	committing *semaphore.Weighted
	pending    *recordGate
	commits    *historyCommitter
	// reading counts the history reads whose request is under way.
	reading atomic.Int64
	// waitingForBaseline counts the pushes' refreshes waiting for the end
	// of the baseline (afterBaseline).
	waitingForBaseline atomic.Int64
	// advisoriesListed is when a crawl last listed every advisory (unix
	// nanoseconds of cfg.Now), as a baseline crawl does.
	advisoriesListed atomic.Int64
	paths            *paths
	failed           *failures
	// skipped holds the uids of repos the include and exclude patterns
	// leave out, as the repo listing found them.
	skipped sync.Map
	// backfilling is held by the backfill pass under way; backfillDue asks
	// Run's backfill loop for one.
	backfilling sync.Mutex
	backfillDue chan struct{}
	// beforeSkip, set by tests only, runs as the backfill asks whether
	// to leave out a tag of the store's answer.
	beforeSkip func(uid string, underWay func(uid string) bool)
}

// New returns a Crawler.
func New(client *platform.Client, st *store.Store, cfg Config) *Crawler {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Concurrency <= 0 {
		cfg.Concurrency = 4
	}
	if cfg.ProgressEvery <= 0 {
		cfg.ProgressEvery = 10 * time.Second
	}
	if cfg.UpdatedSinceMargin <= 0 {
		cfg.UpdatedSinceMargin = 2 * time.Minute
	}
	// A history read holds its slot from before its request to after its
	// answer is decoded. When the client itself keeps no more than
	// Concurrency requests on the wire, twice as many reads go at once, so
	// that one is ready to send the moment a request ends: with only as
	// many reads as requests, each request's place stayed empty while its
	// answer was decoded and the next read started (13% of a
	// latency-bound sync's connection time at 20 ms a request).
	readers := cfg.Concurrency
	if m := client.MaxInFlight(); m > 0 && m <= cfg.Concurrency {
		readers = 2 * cfg.Concurrency
	}
	c := &Crawler{client: client, store: st, cfg: cfg, log: cfg.Logger, histories: semaphore.NewWeighted(int64(readers)),
		committing: semaphore.NewWeighted(int64(8 * cfg.Concurrency)),
		pending:    newRecordGate(maxPendingRecords),
		paths:      newPaths(cfg.Group, client), failed: newFailures(st, cfg.Now), backfillDue: make(chan struct{}, 1)}
	c.commits = newHistoryCommitter(st, &c.reading)
	return c
}

// Summary is what one crawl did.
type Summary struct {
	Repos, Tags, HistoryReads, HistoryRecords int64
	Advisories, Deleted                       int64
	Events                                    int64
	// Failures counts the repos and tags whose reads failed (or were held
	// back after failing before); the run is then partial.
	Failures int64
	Requests int64
	Duration time.Duration
}

// AdvisoriesListedSince reports whether a crawl listed every advisory at t
// or later, as the baseline crawl of an empty mirror does: a start of syncd
// then has no need to list them again at once.
func (c *Crawler) AdvisoriesListedSince(t time.Time) bool {
	return c.advisoriesListed.Load() >= t.UnixNano()
}

// Sync runs one incremental crawl: repos, their tags, and the history of
// the tags that changed. It records the run in crawl_runs. Then it reads
// what the backfill holds (see Backfill), so that the mirror holds every
// history when it returns.
func (c *Crawler) Sync(ctx context.Context) (Summary, error) {
	return c.recordRun(ctx, JobCrawl, func(s *summary) error { return c.crawl(ctx, s, false, true) })
}

// sync is Sync without the backfill: the scheduled crawl's, whose backfill
// runs beside the schedule (see Run).
func (c *Crawler) sync(ctx context.Context) (Summary, error) {
	return c.recordRun(ctx, JobCrawl, func(s *summary) error { return c.crawl(ctx, s, false, false) })
}

// Sweep lists everything, like Sync, and also records deletions: a repo or
// tag the mirror holds that a finished listing did not show, and for which
// a Get answered 404. A listing that failed deletes nothing. Like Sync, it
// reads what the backfill holds before it returns.
func (c *Crawler) Sweep(ctx context.Context) (Summary, error) {
	return c.recordRun(ctx, JobSweep, func(s *summary) error { return c.crawl(ctx, s, true, true) })
}

func (c *Crawler) sweep(ctx context.Context) (Summary, error) {
	return c.recordRun(ctx, JobSweep, func(s *summary) error { return c.crawl(ctx, s, true, false) })
}

// SyncAdvisories lists the advisories into the store.
func (c *Crawler) SyncAdvisories(ctx context.Context) (Summary, error) {
	return c.recordRun(ctx, JobAdvisories, func(s *summary) error { return c.advisories(ctx, s, false) })
}

// recordRun runs one job under the crawl lock and records it in crawl_runs.
func (c *Crawler) recordRun(ctx context.Context, job string, fn func(*summary) error) (Summary, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.runRecorded(ctx, job, fn)
}

// runRecorded runs one job and records it in crawl_runs, without the crawl
// lock: the backfill beside the schedule holds its own.
func (c *Crawler) runRecorded(ctx context.Context, job string, fn func(*summary) error) (Summary, error) {
	start := c.cfg.Now()
	req0 := c.client.Requests()
	run, err := c.store.StartRun(ctx, job)
	if err != nil {
		return Summary{}, err
	}
	var s summary
	err = fn(&s)
	sum := s.snapshot()
	sum.Requests = c.client.Requests() - req0
	sum.Duration = c.cfg.Now().Sub(start)
	run.Requests, run.Changes, run.Failures = sum.Requests, int(sum.Events), int(sum.Failures)
	if ferr := c.store.FinishRun(ctx, run, err); ferr != nil {
		err = errors.Join(err, ferr)
	}
	if c.cfg.OnRun != nil {
		c.cfg.OnRun(job, outcomeOf(ctx, err, sum), sum, c.cfg.Now())
	}
	if err != nil {
		return sum, err
	}
	c.log.Info(job+" finished", "repos", sum.Repos, "tags", sum.Tags, "history_reads", sum.HistoryReads,
		"advisories", sum.Advisories, "deleted", sum.Deleted, "events", sum.Events, "requests", sum.Requests,
		"failures", sum.Failures, "took", sum.Duration.Round(time.Millisecond).String())
	return sum, nil
}

type summary struct {
	repos, tags, historyReads, historyRecords, events atomic.Int64
	advisories, deleted                               atomic.Int64
	reposTotal, tagsTotal                             atomic.Int64
	// failures counts scopes that failed. reposFailed and historiesFailed
	// count the scopes that had not failed before and failed now, which
	// tell a crawl where some scopes failed from one where all did.
	failures, reposRead, reposFailed, historiesFailed atomic.Int64
	historyQueued                                     atomic.Int64
	firstFailure                                      atomic.Pointer[error]
	// listOnly: the crawl lists and reads no history but in the places its
	// listings leave free (spare reads), as the baseline crawl does; the
	// backfill reads the histories after it.
	listOnly atomic.Bool
}

// fail counts a failed scope and keeps the first error.
func (s *summary) fail(err error) {
	s.failures.Add(1)
	s.firstFailure.CompareAndSwap(nil, &err)
}

func (s *summary) snapshot() Summary {
	return Summary{Repos: s.repos.Load(), Tags: s.tags.Load(), HistoryReads: s.historyReads.Load(),
		HistoryRecords: s.historyRecords.Load(), Events: s.events.Load(), Advisories: s.advisories.Load(),
		Deleted:  s.deleted.Load(),
		Failures: s.failures.Load()}
}

// crawl is one crawl; with backfill it then reads what the backfill holds,
// in the same run (Sync and Sweep), rather than leaving it to Run's loop.
func (c *Crawler) crawl(ctx context.Context, s *summary, sweep, backfill bool) error {
	baseline, err := c.store.InBaseline(ctx)
	if err != nil {
		return err
	}
	if baseline {
		// Nothing is news yet: the indexes that cost most per row written
		// wait until the baseline ends.
		if err := c.store.DeferIndexes(ctx); err != nil {
			return err
		}
		// The baseline is the listings alone: the current state of every
		// repo, tag and advisory. The histories are the backfill's, once
		// the mirror serves that state.
		s.listOnly.Store(true)
	}
	if err := c.failed.load(ctx); err != nil {
		return err
	}
	// Progress from the first request: a platform that does not answer
	// the repo listing is what an operator most needs to see.
	stop := c.progress(ctx, s)
	defer stop()
	repos, err := c.listRepos(ctx, s)
	if err != nil {
		return err
	}
	s.reposTotal.Store(int64(len(repos)))

	if sweep {
		if err := c.sweepRepos(ctx, repos, s); err != nil {
			return err
		}
	}
	// A sweep lists the advisories too, to find withdrawn ones, and so
	// does a baseline crawl: advisories listed after the baseline would
	// all be news. They are listed alongside the repos, whose crawl leaves
	// most of the requests in flight to history reads, rather than a page
	// at a time after it.
	advisories := make(chan error, 1)
	actx, stopAdvisories := context.WithCancel(ctx)
	defer stopAdvisories()
	if baseline || sweep {
		go func() {
			err := c.advisories(actx, s, sweep)
			if err == nil {
				c.advisoriesListed.Store(c.cfg.Now().UnixNano())
			}
			advisories <- err
		}()
	} else {
		advisories <- nil
	}
	err = c.crawlTags(ctx, repos, baseline, sweep, s)
	if err == nil {
		err = s.allFailed()
	}
	if err != nil {
		stopAdvisories() // the baseline cannot end anyway
	}
	if aerr := <-advisories; err == nil {
		err = aerr
	}
	if err != nil {
		return err
	}
	if err := c.publicImages(ctx, s); err != nil {
		return err
	}
	if baseline {
		c.log.Info(
			"baseline listings complete: the mirror holds the current state, and from now on every change is an event; the histories follow in the backfill",
		)
		if err := c.store.EndBaseline(ctx); err != nil {
			return err
		}
	}
	if !backfill {
		return nil
	}
	s.listOnly.Store(false)
	if err := c.backfillPass(ctx, s); err != nil {
		return err
	}
	return s.allFailed()
}

// crawlTags lists the organization's tags and reads the histories that
// changed: everything in a baseline or a sweep, else only the tags updated
// since the newest update the mirror holds (less the margin), and the
// histories an earlier run failed to read. A sweep then records the
// deletions of each repo's tags.
func (c *Crawler) crawlTags(ctx context.Context, repos []store.Repo, baseline, sweep bool, s *summary) error {
	l := &tagListing{repos: make(map[string]store.Repo, len(repos)), unknown: make(map[string]bool)}
	for _, r := range repos {
		l.repos[r.UID] = r
	}
	if sweep {
		l.seen = make(map[string]map[string]bool, len(repos))
	}
	q := platform.ListQuery{DescendantsOf: c.cfg.Group}
	if !baseline && !sweep {
		newest, err := c.store.NewestTagUpdate(ctx, c.cfg.Group)
		if err != nil {
			return err
		}
		if !newest.IsZero() {
			q.UpdatedSince = newest.Add(-c.cfg.UpdatedSinceMargin)
			l.track = true
		}
	}
	if err := c.listAllTags(ctx, l, q, s); err != nil {
		return err
	}
	if !q.UpdatedSince.IsZero() {
		if err := c.readPending(ctx, l, s); err != nil {
			return err
		}
	}
	if err := c.crawlUnknown(ctx, l, s); err != nil {
		return err
	}
	// A repo that failed before (its path could not be resolved) and is
	// back: an updated_since listing would not show its older tags, so it
	// is listed whole, which also ends its failure.
	for _, r := range repos {
		if c.failed.has(r.UID) {
			if _, err := c.crawlScope(ctx, r, s); err != nil {
				return err
			}
		}
	}
	if !sweep {
		return nil
	}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(c.cfg.Concurrency)
	for _, r := range repos {
		g.Go(func() error { return c.sweepTags(gctx, r, l.seen[r.UID], s) })
	}
	return g.Wait()
}

// crawlScope crawls one repo as crawlRepo does, unless an earlier failure
// holds it back, and records its failure rather than failing the crawl. It
// returns the listed tags' uids, nil when the repo's listing did not finish.
func (c *Crawler) crawlScope(ctx context.Context, r store.Repo, s *summary) (map[string]bool, error) {
	if f, held := c.failed.heldBack(r.UID, c.cfg.Now()); held {
		c.log.Debug("repo held back after failing", "repo", r.Path, "attempts", f.Attempts, "next_attempt", f.NextAttempt)
		s.fail(
			fmt.Errorf(
				"repo %s: held back until %s after %d failed attempts: %s",
				r.Path,
				f.NextAttempt.UTC().Format(time.RFC3339),
				f.Attempts,
				f.Error,
			),
		)
		return nil, nil
	}
	seen, err := c.crawlRepo(ctx, r, s)
	if scopeFailed(ctx, err) {
		if !c.failed.has(r.UID) {
			s.reposFailed.Add(1)
		}
		s.fail(err)
		f, rerr := c.failed.record(finish(ctx), store.Failure{Kind: "repo", UID: r.UID, RepoUID: r.UID, Path: r.Path}, err)
		if rerr != nil {
			return nil, rerr
		}
		c.log.Warn(
			"repo failed; the rest of the crawl goes on",
			"repo",
			r.Path,
			"attempts",
			f.Attempts,
			"next_attempt",
			f.NextAttempt,
			"err",
			err,
		)
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	s.reposRead.Add(1)
	if ok, err := c.failed.clear(finish(ctx), r.UID); err != nil {
		return nil, err
	} else if ok {
		c.log.Info("repo recovered", "repo", r.Path)
	}
	return seen, nil
}

// allFailed is the crawl's error when every scope it tried failed: then
// the cause is most likely not one repo but the credentials or the
// platform, and the crawl has failed rather than partly succeeded.
func (s *summary) allFailed() error {
	first := s.firstFailure.Load()
	if first == nil {
		return nil
	}
	switch {
	// One scope failing alone says nothing of the others; several, with
	// none read, point at a common cause.
	case s.reposFailed.Load() > 1 && s.reposRead.Load() == 0:
		return fmt.Errorf("every repo's reads failed (%d newly); the first: %w", s.reposFailed.Load(), *first)
	case s.historiesFailed.Load() > 1 && s.historyReads.Load() == 0:
		return fmt.Errorf("every tag history read failed (%d newly); the first: %w", s.historiesFailed.Load(), *first)
	}
	return nil
}

// progress logs how far the crawl is, with an estimate of the time left,
// until the returned func is called.
func (c *Crawler) progress(ctx context.Context, s *summary) func() {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	start, req0 := c.cfg.Now(), c.client.Requests()
	go func() {
		defer close(done)
		t := time.NewTicker(c.cfg.ProgressEvery)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
				p := c.progressNow(s, start, req0)
				c.log.Info("crawling", "repos", p.Repos, "tags_listed", p.TagsListed, "tags_total", p.TagsTotal,
					"history_reads", p.HistoryRead, "history_queued", p.HistoryQueued, "requests_per_second", p.RequestsPerSecond,
					"held_by_rate_limit", p.HeldByRateLimit, "events", s.events.Load(), "eta", p.ETA)
				if b, err := json.Marshal(p); err == nil {
					if err := c.store.SetMeta(ctx, store.ProgressKey, string(b)); err != nil && ctx.Err() == nil {
						c.log.Debug("record crawl progress", "err", err)
					}
				}
			}
		}
	}()
	return func() {
		cancel()
		<-done
		if err := c.store.SetMeta(context.WithoutCancel(ctx), store.ProgressKey, ""); err != nil {
			c.log.Debug("clear crawl progress", "err", err)
		}
	}
}

// Progress is how far a running crawl is, as "syncd status" shows it.
type Progress struct {
	Started           time.Time `json:"started"`
	Repos             int64     `json:"repos"`
	TagsListed        int64     `json:"tags_listed"`
	TagsTotal         int64     `json:"tags_total"`
	HistoryRead       int64     `json:"history_read"`
	HistoryQueued     int64     `json:"history_queued"`
	Requests          int64     `json:"requests"`
	RequestsPerSecond float64   `json:"requests_per_second"`
	RateLimit         float64   `json:"rate_limit,omitempty"`
	HeldByRateLimit   bool      `json:"held_by_rate_limit"`
	ETA               string    `json:"eta,omitempty"`
	// Retrying says which request is being retried and why, while the
	// platform fails requests ("" when the latest request succeeded).
	Retrying string `json:"retrying,omitempty"`
}

// progressNow measures the crawl's progress: the tags listed, the history
// reads done of those queued, the request rate against the client's limit,
// and the time left at the rate of the reads so far.
func (c *Crawler) progressNow(s *summary, start time.Time, req0 int64) Progress {
	elapsed := max(c.cfg.Now().Sub(start).Seconds(), 1e-3)
	p := Progress{Started: start, Repos: s.reposTotal.Load(), TagsListed: s.tags.Load(), TagsTotal: s.tagsTotal.Load(),
		HistoryRead: s.historyReads.Load(), HistoryQueued: s.historyQueued.Load(), Requests: c.client.Requests() - req0,
		RateLimit: c.client.RequestsPerSecond()}
	p.RequestsPerSecond = float64(p.Requests) / elapsed
	p.HeldByRateLimit = p.RateLimit > 0 && p.RequestsPerSecond >= 0.9*p.RateLimit
	if r := c.client.Retrying(); r != nil {
		p.Retrying = fmt.Sprintf(
			"%s failed %d times, next try at %s: %s",
			r.Endpoint,
			r.Attempt,
			store.FormatTime(r.NextTry),
			r.Err,
		)
	}
	// The baseline's listings read only the histories their free places
	// allow, which say nothing of the time left.
	if p.HistoryRead > 0 && !s.listOnly.Load() {
		// The histories still to read: those queued, and as many again
		// per tag as so far for the tags not listed yet.
		left := float64(p.HistoryQueued - p.HistoryRead)
		if p.TagsTotal > p.TagsListed && p.TagsListed > 0 {
			left += float64(p.HistoryQueued) / float64(p.TagsListed) * float64(p.TagsTotal-p.TagsListed)
		}
		p.ETA = (time.Duration(left / (float64(p.HistoryRead) / elapsed) * float64(time.Second))).Round(time.Second).String()
	}
	return p
}

// listRepos lists the group's repos page by page into the store, starting
// over (a bounded number of times) when the listing restarts under it.
func (c *Crawler) listRepos(ctx context.Context, s *summary) ([]store.Repo, error) {
	var repos []store.Repo
	err := c.retryRestarted("repo", func() error {
		repos = nil
		lister := c.client.Repos(platform.ListQuery{DescendantsOf: c.cfg.Group})
		for page, err := range lister.Pages(ctx) {
			if err != nil {
				return err
			}
			batch := make([]store.Repo, 0, len(page))
			for _, r := range page {
				if !c.wanted(r.Name) {
					c.paths.learn(r.UID, r.Name)
					c.skipped.Store(r.UID, true)
					continue
				}
				sr, err := c.storeRepo(ctx, r)
				if scopeFailed(ctx, err) {
					// Its path is unknown, so its history cannot be read:
					// it fails alone, and is not mistaken for deleted.
					if !c.failed.has(r.UID) {
						s.reposFailed.Add(1)
					}
					s.fail(err)
					if _, rerr := c.failed.record(finish(ctx), store.Failure{Kind: "repo", UID: r.UID, RepoUID: r.UID, Path: r.UID},
						err); rerr != nil {
						return rerr
					}
					continue
				}
				if err != nil {
					return err
				}
				batch = append(batch, sr)
			}
			n, err := c.store.ApplyRepos(finish(ctx), batch)
			if err != nil {
				return err
			}
			s.events.Add(int64(n))
			// The crawl keeps of each repo only what its tags need:
			// with their raw JSON and active tags, the whole
			// organization's repos were most of what grew the
			// crawl's memory with the organization.
			for _, r := range batch {
				repos = append(repos, store.Repo{UID: r.UID, Name: r.Name, Path: r.Path})
			}
			c.log.Debug("listed repos", "seen", len(repos), "total", lister.Total())
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list repos of group %s: %w", c.cfg.Group, err)
	}
	s.repos.Store(int64(len(repos)))
	return repos, nil
}

// retryRestarted runs list, one pass over a listing, again from the start
// when the listing restarted under it (a *platform.ListRestartedError: its
// page token expired), three passes at the most. what names the listing in
// the log, with args. list gets its page tokens afresh on each pass; what
// it collects that a restarted pass would leave short it resets itself.
func (c *Crawler) retryRestarted(what string, list func() error, args ...any) error {
	for attempt := 1; ; attempt++ {
		err := list()
		var restarted *platform.ListRestartedError
		if errors.As(err, &restarted) && attempt < 3 {
			c.log.Warn(what+" listing restarted under us; listing again", append(args, "err", err)...)
			continue
		}
		return err
	}
}

// excluded reports whether the repo uid is left out by the patterns.
func (c *Crawler) excluded(uid string) bool {
	_, ok := c.skipped.Load(uid)
	return ok
}

func (c *Crawler) wanted(name string) bool {
	if len(c.cfg.Include) > 0 {
		ok := false
		for _, p := range c.cfg.Include {
			if m, _ := path.Match(p, name); m {
				ok = true
				break
			}
		}
		if !ok {
			return false
		}
	}
	for _, p := range c.cfg.Exclude {
		if m, _ := path.Match(p, name); m {
			return false
		}
	}
	return true
}

// crawlRepo lists the tags of one repo into the store and reads the
// history of each tag the store says changed, as a crawl lists the
// organization's (listTagsOnce), with a query for the repo's tags. It
// returns the uids of the tags the finished listing showed.
func (c *Crawler) crawlRepo(ctx context.Context, repo store.Repo, s *summary) (map[string]bool, error) {
	l := &tagListing{
		repos:   map[string]store.Repo{repo.UID: repo},
		seen:    make(map[string]map[string]bool, 1),
		unknown: make(map[string]bool),
	}
	err := c.retryRestarted("tag", func() error {
		clear(l.seen)
		return c.listTagsOnce(ctx, l, platform.ListQuery{ChildrenOf: repo.UID}, s)
	}, "repo", repo.Path)
	if err != nil {
		// The repo's own listing answered an error: it fails the repo.
		return nil, fmt.Errorf("crawl repo %s: %w", repo.Path, readErr(err))
	}
	if l.seen[repo.UID] == nil {
		return map[string]bool{}, nil // listed whole, and no tag
	}
	return l.seen[repo.UID], nil
}

// syncHistory reads a tag's history from its bookmark and hands it to the
// store, which records one tag.moved per new record. read is called when
// the requests are done, before the commit.
//
// A read that fails fails only its tag: it is recorded in crawl_failures and
// the tag's bookmark stays, so the next run reads it again.
func (c *Crawler) syncHistory(ctx context.Context, ref store.TagRef, s *summary, read func()) error {
	if f, held := c.failed.heldBack(ref.UID, c.cfg.Now()); held {
		read()
		s.fail(
			fmt.Errorf(
				"tag %s:%s: held back until %s after %d failed attempts: %s",
				ref.Path,
				ref.Name,
				f.NextAttempt.UTC().Format(time.RFC3339),
				f.Attempts,
				f.Error,
			),
		)
		return nil
	}
	// Reads waiting for their commit are bounded before the request, not
	// after it: a read that waited with its answer decoded let the next
	// read start, so that under a writer slower than the reads the
	// decoded histories piled up without bound. They are bounded by count
	// and by records, as one heavy tag holds thousands.
	if err := c.committing.Acquire(ctx, 1); err != nil {
		read()
		return err
	}
	defer c.committing.Release(1)
	if err := c.pending.wait(ctx); err != nil {
		read()
		return err
	}
	c.reading.Add(1)
	recs, err := c.client.HistorySince(ctx, c.client.PrivateImage(ref.Path), ref.Name, ref.Bookmark.LastTime)
	c.reading.Add(-1)
	c.commits.signal()
	read()
	var unwalkable *platform.UnwalkableError
	if err != nil && !errors.As(err, &unwalkable) {
		if !scopeFailed(ctx, readErr(err)) {
			return err
		}
		if !c.failed.has(ref.UID) {
			s.historiesFailed.Add(1)
		}
		s.fail(err)
		f, rerr := c.failed.record(
			finish(ctx),
			store.Failure{Kind: "tag", UID: ref.UID, RepoUID: ref.RepoUID, Path: ref.Path, Tag: ref.Name},
			err,
		)
		if rerr != nil {
			return rerr
		}
		c.log.Warn(
			"tag history failed; the rest of the crawl goes on",
			"repo",
			ref.Path,
			"tag",
			ref.Name,
			"attempts",
			f.Attempts,
			"next_attempt",
			f.NextAttempt,
			"err",
			err,
		)
		return nil
	}
	if unwalkable != nil {
		c.log.Warn(
			"tag history cannot be read whole; keeping what was read",
			"repo",
			ref.Path,
			"tag",
			ref.Name,
			"err",
			unwalkable,
		)
	}
	out := make([]store.HistoryRecord, len(recs))
	for i, r := range recs {
		out[i] = store.HistoryRecord{Time: r.UpdateTimestamp, Digest: r.Digest}
	}
	recs = nil // the client's records are not kept while the commit waits
	c.pending.add(len(out))
	n, aerr := c.commits.apply(ctx, store.HistoryUpdate{Ref: ref, Records: out, Complete: unwalkable == nil})
	c.pending.done(len(out))
	if aerr != nil {
		return aerr
	}
	s.historyReads.Add(1)
	s.historyRecords.Add(int64(len(out)))
	s.events.Add(int64(n))
	if ok, err := c.failed.clear(finish(ctx), ref.UID); err != nil {
		return err
	} else if ok {
		c.log.Info("tag history recovered", "repo", ref.Path, "tag", ref.Name)
	}
	return nil
}

// storeRepo is r as the store keeps it, with its registry path.
func (c *Crawler) storeRepo(ctx context.Context, r platform.Repo) (store.Repo, error) {
	p, err := c.paths.of(ctx, r.UID, r.Name)
	if err != nil {
		return store.Repo{}, err
	}
	return store.Repo{UID: r.UID, Name: r.Name, Path: p, Description: r.Description, CatalogTier: r.CatalogTier,
		Aliases: r.Aliases, ActiveTags: r.ActiveTags, Bundles: r.Bundles, CreateTime: r.CreateTime,
		UpdateTime: r.UpdateTime, Raw: r.Raw}, nil
}

func storeTag(t platform.Tag) store.Tag {
	return store.Tag{UID: t.UID, Name: t.Name, Digest: t.Digest, Deprecated: t.Deprecated, Bundles: t.Bundles,
		CreateTime: t.CreateTime, UpdateTime: t.UpdateTime, Raw: t.Raw}
}

// outcomeOf names how a job ended, as crawl_runs records it.
func outcomeOf(ctx context.Context, err error, sum Summary) string {
	switch {
	case err == nil && sum.Failures > 0:
		return "partial"
	case err == nil:
		return "ok"
	case ctx.Err() != nil:
		return "canceled"
	default:
		return "failed"
	}
}

// finish is the context of a store write: a page read before shutdown began
// is committed whole rather than thrown away, and the crawl stops after it.
func finish(ctx context.Context) context.Context { return context.WithoutCancel(ctx) }
