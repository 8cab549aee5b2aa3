package daemon

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/robfig/cron/v3"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/events"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/store"
)

// ConfigError is a problem with the command line or the configuration,
// found by a command or while building a part: commands exit 2 for it.
type ConfigError struct{ Err error }

func (e ConfigError) Error() string { return e.Err.Error() }
func (e ConfigError) Unwrap() error { return e.Err }

// Schedules are the jobs' schedules, parsed once from [crawl]; a job whose
// schedule is empty is off and absent.
type Schedules map[string]cron.Schedule

// ParseSchedules parses the schedule of every job in c.
func ParseSchedules(c config.Crawl) (Schedules, error) {
	out := Schedules{}
	for job, spec := range map[string]string{crawler.JobCrawl: c.Schedule, crawler.JobSweep: c.SweepSchedule,
		crawler.JobAdvisories: c.AdvisoriesSchedule, crawler.JobSubscriptions: c.SubscriptionsSchedule} {
		sched, err := config.ParseSchedule(spec)
		if err != nil {
			return nil, ConfigError{fmt.Errorf("crawl: %s schedule %q: %w", job, spec, err)}
		}
		if sched != nil {
			out[job] = sched
		}
	}
	return out, nil
}

// App is a syncd that crawls and publishes: its parts, opened in order by
// Open (Close closes the connection and the mirror), and the observers
// each part was given.
type App struct {
	Config   config.Config
	Log      *slog.Logger
	Jobs     Schedules
	Metrics  *admin.Metrics
	Fresh    *admin.Freshness
	Store    *store.Store
	Client   *platform.Client
	NATS     *publish.Conn
	Relay    *publish.Relay
	Crawler  *crawler.Crawler
	Receiver *events.Receiver // nil when [events] listen is empty
	// Registrar keeps the event subscription; nil when [events] sink_url
	// is empty (crawl only).
	Registrar *events.Registrar
	// Snapshots writes the leader's snapshots; nil when [snapshot] enabled
	// is false.
	Snapshots *cluster.Snapshotter
	// Auditor audits the stream against the mirror, as the leader.
	Auditor *publish.Auditor
	// Maturity keeps the tags' matured digests, as the leader; nil when
	// [maturity] after is empty.
	Maturity *cluster.Maturity
	// Position is the stream sequence the mirror has applied, for the
	// query service.
	Position *query.Position
	// Fence fences the leader's writes by lease term; nil in single mode,
	// which is unfenced (one process writes, by the mirror's lock).
	Fence *publish.Fence
	// stepDown is what a fenced write calls: the lease's StepDown.
	stepDown atomic.Pointer[func()]
	// Trust signs what the relay publishes and checks what a standby
	// follows.
	Trust *Trust
	// Adopted is the snapshot whose file a cluster replica's new mirror
	// was made, if it was (AdoptSnapshot), and its check.
	Adopted
	version string
}

// Options are what a command chooses about an App beyond the config.
type Options struct {
	// Version is syncd's, for the metrics.
	Version string
	// Published is the level of the line logged for every published event.
	Published slog.Level
	// AdoptSnapshot: a cluster replica with no mirror yet makes the newest
	// verified snapshot its file before opening it (AdoptSnapshot); for
	// the daemon, not for a command that does not follow the stream.
	AdoptSnapshot bool
	// GiveUpAfter bounds the wait for an unreachable platform (each
	// request's retries) and NATS server (the first connection), for a
	// command that must end; 0: the daemon's (2m, and for ever).
	GiveUpAfter time.Duration
}

// auditGivesWay is the longest the stream audit waits, before each of its
// reads, for the relay's pass under way to end: the audit takes the time
// the relay does not use, and goes on under a relay that never rests.
const auditGivesWay = 50 * time.Millisecond

// Open opens the parts.
func Open(ctx context.Context, cfg config.Config, log *slog.Logger, opts Options) (*App, error) {
	a := &App{
		Config:   cfg,
		Log:      log,
		Metrics:  admin.NewMetrics(opts.Version),
		Position: query.NewPosition(),
		version:  opts.Version,
	}
	var err error
	if a.Jobs, err = ParseSchedules(cfg.Crawl); err != nil {
		return nil, err
	}
	if a.Trust, err = LoadTrust(cfg, log); err != nil {
		return nil, err
	}
	a.Trust.countTo(a.Metrics)
	if cfg.Events.SinkURL == "" {
		delete(a.Jobs, crawler.JobSubscriptions)
	}
	a.Fresh = admin.NewFreshness(a.Jobs, cfg.Admin.StaleFactor, nil)
	if a.Client, err = newClient(cfg, log, a.Metrics.ObserveRequest, opts.GiveUpAfter); err != nil {
		return nil, ConfigError{err}
	}
	pcfg := NATSConfig(cfg, log)
	pcfg.ConnectWait = opts.GiveUpAfter
	pcfg.OnAck = onAck(cfg.NATS.Stream, a.Position)
	// A new cluster replica's mirror may be the newest snapshot's file, as
	// a new follower's is (its standby would restore it anyway): NATS
	// first, then. Otherwise the mirror first, so that a mirror syncd
	// cannot open is reported whether NATS answers or not.
	early := opts.AdoptSnapshot && cfg.Cluster.Enabled && adoptionWanted(cfg, cluster.RestoreWhenEmpty, a.Trust, log)
	if early {
		if a.NATS, err = publish.Connect(ctx, pcfg); err != nil {
			return nil, err
		}
		a.Snapshot, err = AdoptSnapshot(ctx, a.NATS.JS, cfg, cluster.RestoreWhenEmpty, a.Trust, a.Metrics, log)
		if err != nil {
			a.Close()
			return nil, err
		}
	}
	if a.Store, err = OpenStore(ctx, cfg, log, store.Options{OnEvents: a.Metrics.EventsRecorded}); err != nil {
		a.Close()
		return nil, err
	}
	if !early {
		if a.NATS, err = publish.Connect(ctx, pcfg); err != nil {
			a.Close()
			return nil, err
		}
	}
	if cfg.Cluster.Enabled {
		if a.Fence, err = a.newFence(ctx, pcfg, log); err != nil {
			a.Close()
			return nil, err
		}
	}
	a.Metrics.CounterFunc(
		"syncd_fenced_writes_total",
		"Writes of this replica that JetStream refused because another replica's lease term began after its own.",
		nil,
		func() float64 { return float64(a.Fence.Refused()) },
	)
	relayOpts := []publish.RelayOption{publish.WithOnPublished(a.observePublished(pcfg.Format(), opts.Published)),
		publish.WithCheckpoints(a.Store, cfg.Verify.CheckpointEvery.Duration, cfg.Cluster.NodeID), publish.WithFence(a.Fence)}
	if a.Trust.Signer != nil {
		relayOpts = append(relayOpts, publish.WithSigner(a.Trust.Signer))
	}
	if cfg.KV.Enabled {
		var kv *publish.KV
		err := a.NATS.WaitAnswered(ctx, "open the KV buckets", func(ctx context.Context) (err error) {
			kv, err = publish.OpenKV(ctx, a.NATS.JS, kvConfig(cfg, log), a.Store)
			return err
		})
		if err != nil {
			a.Close()
			return nil, err
		}
		relayOpts = append(relayOpts, publish.WithKV(kv))
	}
	a.Relay = publish.NewRelay(a.NATS.JS, a.Store, pcfg, relayOpts...)
	a.Auditor = publish.NewAuditor(a.NATS.JS, a.Store, a.Relay.Message, publish.AuditConfig{Stream: cfg.NATS.Stream,
		SubjectPrefix: cfg.NATS.SubjectPrefix, Every: cfg.Verify.AuditEvery.Duration,
		SweepEvery: cfg.Verify.SweepEvery.Duration, Logger: log.With("part", "audit"),
		OnRepaired: func(store.Event) { a.Metrics.StreamRepaired() }, OnSweep: a.Metrics.StreamSwept,
		Fence: a.Fence, MsgID: a.Relay.MsgID, RepairMessage: a.Relay.RepairMessage,
		Yield: func(ctx context.Context) error { return a.Relay.Idle(ctx, auditGivesWay) }})
	a.Crawler = newCrawler(cfg, a.Client, a.Store, a.Jobs, a.observeRun, log)
	a.Receiver = newReceiver(cfg, a.Crawler, a.Store, log)
	a.Registrar = NewRegistrar(cfg, a.Client, a.Store, log)
	if ages, _ := cfg.Maturity.Ages(); len(ages) > 0 { // validated with the config
		a.Maturity = &cluster.Maturity{Store: a.Store, Ages: ages, Logger: log.With("part", "maturity")}
	}
	if sc := cfg.Snapshot; sc.Enabled {
		a.Snapshots = cluster.NewSnapshotter(
			a.NATS.JS,
			a.Store,
			cluster.SnapshotConfig{
				Bucket:   sc.Bucket,
				Replicas: cfg.NATS.Replicas,
				Stream:   cfg.NATS.Stream,
				Every:    sc.Every.Duration,
				Keep:     sc.Keep,
				Dir:      filepath.Dir(cfg.Store.Path),
				Mirror:   filepath.Base(cfg.Store.Path),
				Logger:   log.With("part", "snapshot"),
				Fence:    a.Fence,
				Signer:   a.Trust.Signer,
			},
		)
	}
	return a, nil
}

// newFence returns the fence of a cluster replica's writes, with as many
// lanes as the replica counts of the stream and the KV buckets need
// (publish.LanesFor).
func (a *App) newFence(ctx context.Context, pcfg publish.Config, log *slog.Logger) (*publish.Fence, error) {
	var s jetstream.Stream
	err := a.NATS.WaitAnswered(ctx, "look up the stream", func(ctx context.Context) (err error) {
		s, err = a.NATS.JS.Stream(ctx, pcfg.Stream)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", pcfg.Stream, err)
	}
	replicas := []int{s.CachedInfo().Config.Replicas}
	if a.Config.KV.Enabled {
		replicas = append(replicas, a.Config.BucketReplicas())
	}
	return publish.NewFence(a.NATS.JS, publish.FenceConfig{Node: a.Config.Cluster.Node(), Format: pcfg.Format(),
		Lanes: publish.LanesFor(replicas...), Stream: pcfg.Stream, OnFenced: a.fenced,
		Logger: log.With("part", "fence")}), nil
}

// fenced steps the replica down after JetStream refused one of its writes.
func (a *App) fenced() {
	if fn := a.stepDown.Load(); fn != nil {
		(*fn)()
	}
}

// kvConfig is the publish.KVConfig of [kv].
func kvConfig(cfg config.Config, log *slog.Logger) publish.KVConfig {
	k := cfg.KV
	var matured string
	if len(cfg.Maturity.After) > 0 {
		matured = k.Matured
	}
	return publish.KVConfig{Tags: k.Tags, Repos: k.Repos, Advisories: k.Advisories, Matured: matured, History: k.History,
		Replicas: cfg.BucketReplicas(), CheckOnly: !cfg.NATS.ManageStream, ReconcileInterval: k.ReconcileInterval.Duration,
		Logger: log.With("part", "kv")}
}

// observeRun is told of every finished crawl job.
func (a *App) observeRun(job, outcome string, sum crawler.Summary, finished time.Time) {
	a.Metrics.ObserveRun(job, outcome, sum.Duration, finished, map[string]int64{
		"repos": sum.Repos, "tags": sum.Tags, "tag_history": sum.HistoryRecords, "advisories": sum.Advisories})
	a.Fresh.Observe(job, outcome, finished)
	if outcome == "ok" && a.Relay != nil {
		// The replicas compare their mirrors with what this crawl left.
		a.Relay.RequestCheckpoint()
	}
}

// observePublished counts every event JetStream acknowledged and logs one
// line for it.
func (a *App) observePublished(format publish.Format, level slog.Level) func(store.Event) {
	return func(e store.Event) {
		a.Metrics.EventPublished(e.Type, e.Age())
		a.Log.Log(context.Background(), level, "published event", "type", e.Type, "subject", format.Subject(e), "id", e.ID)
	}
}

// Close closes the NATS connection, then the mirror, skipping either that
// Open did not get to (Open calls it when a later part fails). The
// connection is drained, and closed if the drain takes over 5 s, and the
// embedded server, if any, is stopped and waited for; publish.Conn logs
// what goes wrong there and Close returns nothing of it. The mirror's
// close error is logged and returned. The running parts (relay, crawler,
// receiver, auditor) are not stopped here: they end with the context they
// run under.
func (a *App) Close() error {
	if a.NATS != nil {
		a.NATS.Close()
	}
	if a.Store != nil {
		return CloseStore(a.Store, a.Log)
	}
	return nil
}

// OpenStore opens the mirror at [store] path.
func OpenStore(ctx context.Context, cfg config.Config, log *slog.Logger, opts store.Options) (*store.Store, error) {
	opts.InitialEvents, opts.Logger = cfg.Store.InitialEvents, log.With("part", "store")
	st, err := store.Open(ctx, cfg.Store.Path, opts)
	if err != nil {
		return nil, fmt.Errorf("open mirror %s: %w", cfg.Store.Path, err)
	}
	return st, nil
}

// CloseStore closes st, logging its error.
func CloseStore(st *store.Store, log *slog.Logger) error {
	err := st.Close()
	if err != nil {
		log.Error("close mirror", "err", err)
	}
	return err
}

// LockMirror takes the mirror's lock for this process, as command, before
// anything opens it: one process writes a mirror (and the embedded NATS
// store beside it) at a time. The lock goes with the process.
func LockMirror(cfg config.Config, command string, log *slog.Logger) (release func(), err error) {
	l, err := store.LockMirror(cfg.Store.Path, command)
	if err != nil {
		return nil, err
	}
	return func() {
		if err := l.Release(); err != nil {
			log.Error("release the mirror's lock", "err", err)
		}
	}, nil
}

// NATSConfig is where and how events are published.
func NATSConfig(cfg config.Config, log *slog.Logger) publish.Config {
	n := cfg.NATS
	sync, _ := publish.ParseSync(n.SyncInterval) // validated with the config; the default otherwise
	return publish.Config{
		URL: n.URL, Listen: n.Listen, DataDir: filepath.Dir(cfg.Store.Path),
		Credentials: n.Credentials, NKeySeed: n.NKeySeed, Token: n.Token, User: n.User, Password: n.Password,
		TLSCA: n.TLSCA, TLSCert: n.TLSCert, TLSKey: n.TLSKey,
		SubjectPrefix: n.SubjectPrefix, Stream: n.Stream, MaxAge: n.MaxAge.Duration,
		DuplicateWindow: n.DuplicateWindow.Duration, Replicas: n.Replicas, CheckStreamOnly: !n.ManageStream, Sync: sync,
		// The CloudEvents source: the platform and group the events describe.
		Source: strings.TrimRight(cfg.Platform.BaseURL, "/") + "/" + cfg.Platform.Group,
		Logger: log.With("part", "publish"),
	}
}

func newCrawler(cfg config.Config, client *platform.Client, st *store.Store, jobs Schedules,
	onRun func(job, outcome string, sum crawler.Summary, finished time.Time), log *slog.Logger) *crawler.Crawler {
	c := cfg.Crawl
	return crawler.New(client, st, crawler.Config{
		Group:              cfg.Platform.Group,
		Include:            c.Include,
		Exclude:            c.Exclude,
		PublicImages:       c.PublicImages,
		PublicOrg:          cfg.Platform.PublicOrg,
		Families:           crawler.ParseFamilies(c.TagFamilies),
		UpdatedSinceMargin: c.UpdatedSinceMargin.Duration,
		Concurrency:        c.Concurrency,
		Schedule:           jobs[crawler.JobCrawl],
		SweepSchedule:      jobs[crawler.JobSweep],
		AdvisoriesSchedule: jobs[crawler.JobAdvisories],
		Jitter:             c.Jitter.Duration,
		Logger:             log.With("part", "crawler"),
		OnRun:              onRun,
	})
}

// newReceiver takes the platform's pushed events; nil when [events] listen
// is empty.
func newReceiver(cfg config.Config, jobs events.Jobs, st *store.Store, log *slog.Logger) *events.Receiver {
	e := cfg.Events
	if e.Listen == "" {
		return nil
	}
	return events.NewReceiver(
		events.Config{Issuer: e.Issuer, Audience: e.Audience, Groups: []string{cfg.Platform.Group},
			TypePrefix: cfg.EventTypePrefix(), MaxBody: e.MaxBody, QueueSize: e.QueueSize, Logger: log.With("part", "events")},
		jobs,
		st,
	)
}

// NewRegistrar keeps syncd's event subscription; nil when [events]
// sink_url is empty.
func NewRegistrar(cfg config.Config, client *platform.Client, st *store.Store, log *slog.Logger) *events.Registrar {
	if cfg.Events.SinkURL == "" {
		return nil
	}
	return &events.Registrar{Client: client, Store: st, Groups: []string{cfg.Platform.Group},
		Sink: cfg.Events.SinkURL, Logger: log.With("part", "events")}
}

// NewClusterFollower builds the cluster.Follower that follows the stream
// into st, recording its lag there, advancing pos, counting in m what it
// sets aside and applying only what tr verifies; restore says when it
// starts from a snapshot, and adopted is the snapshot whose file st is
// (AdoptSnapshot), if it is one.
func NewClusterFollower(
	nc *publish.Conn,
	st *store.Store,
	cfg config.Config,
	restore cluster.RestoreMode,
	adopted *cluster.SnapshotInfo,
	pos *query.Position,
	m *admin.Metrics,
	tr *Trust,
	log *slog.Logger,
) *cluster.Follower {
	var f *cluster.Follower
	fc := followerConfig(cfg, restore, tr, log)
	fc.Meta, fc.Adopted, fc.OnBatch, fc.OnReject = st, adopted, followAt(pos, &f), m.MessageRejected
	f = cluster.NewFollower(nc.JS, st, fc)
	return f
}

// followerConfig is the configuration of the mirror's cluster.Follower,
// but for what it reports to and where its mirror is.
func followerConfig(
	cfg config.Config,
	restore cluster.RestoreMode,
	tr *Trust,
	log *slog.Logger,
) cluster.FollowerConfig {
	return cluster.FollowerConfig{
		Stream:         cfg.NATS.Stream,
		SubjectPrefix:  cfg.NATS.SubjectPrefix,
		Consumer:       cfg.Cluster.ConsumerName(cfg.Store.Path),
		Logger:         log.With("part", "follow"),
		SnapshotBucket: cfg.Snapshot.Bucket,
		Restore:        restore,
		SnapshotDir:    filepath.Dir(cfg.Store.Path),
		Verifier:       tr.Verifier,
		OnRejected:     tr.rejected,
	}
}

// adoptionWanted reports whether a replica or follower is to make the
// newest verified snapshot its mirror's file before opening it
// (AdoptSnapshot): the mirror does not exist, snapshots are trusted by a
// key, there is a bucket, and restore allows it. A mirror's leftover
// -wal, -shm or -journal without it is logged, and the mirror is created
// as usual.
func adoptionWanted(cfg config.Config, restore cluster.RestoreMode, tr *Trust, log *slog.Logger) bool {
	if tr.Verifier == nil || cfg.Snapshot.Bucket == "" || restore == cluster.RestoreNever {
		return false
	}
	path := cfg.Store.Path
	if _, err := os.Lstat(path); !errors.Is(err, fs.ErrNotExist) {
		return false
	}
	for _, p := range []string{path + "-wal", path + "-shm", path + "-journal"} {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			log.Warn("the mirror does not exist but a file of it does; not starting it from a snapshot's file",
				"file", p)
			return false
		}
	}
	return true
}

// AdoptSnapshot makes the newest snapshot signed by one of tr's keys the
// mirror's file, through js, when adoptionWanted (cluster.AdoptSnapshot):
// a new replica's quickest start. Snapshots passed over are counted in m.
// It returns the snapshot, nil when none was adopted: a failure is
// logged, and the replica starts from an empty mirror, which its follower
// restores into, as before.
func AdoptSnapshot(
	ctx context.Context,
	js jetstream.JetStream,
	cfg config.Config,
	restore cluster.RestoreMode,
	tr *Trust,
	m *admin.Metrics,
	log *slog.Logger,
) (*cluster.SnapshotInfo, error) {
	if !adoptionWanted(cfg, restore, tr, log) {
		return nil, nil
	}
	path := cfg.Store.Path
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	fc := followerConfig(cfg, restore, tr, log)
	fc.OnReject = m.MessageRejected
	log.Info("no mirror yet: looking for a snapshot to make its file", "bucket", cfg.Snapshot.Bucket, "mirror", path)
	info, found, err := cluster.AdoptSnapshot(ctx, js, fc, path, store.Options{Logger: log.With("part", "store")})
	switch {
	case ctx.Err() != nil:
		return nil, ctx.Err()
	case err != nil:
		log.Warn("a snapshot could not become the new mirror's file; starting from an empty mirror", "err", err)
		return nil, nil
	case !found:
		return nil, nil
	}
	return &info, nil
}
