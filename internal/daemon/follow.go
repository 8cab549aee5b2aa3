package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/store"
)

// FollowerApp is a mirror kept from a leader's event stream, without any
// request to the platform: its parts, opened by OpenFollower.
type FollowerApp struct {
	Config   config.Config
	Log      *slog.Logger
	Store    *store.Store
	NATS     *publish.Conn
	Follower *cluster.Follower
	// Position is the stream sequence the mirror has applied, for the
	// query service.
	Position *query.Position
	// Metrics is what AdminHandler serves; the follower counts in it
	// what it sets aside.
	Metrics *admin.Metrics
	// Trust is whose signatures the follower accepts.
	Trust *Trust
	// Adopted is the snapshot whose file the mirror was made, if it was
	// (AdoptSnapshot); Run checks it.
	Adopted
}

// OpenFollower opens the mirror and the connection to the leader's NATS
// server, and checks the stream. A follower never changes the stream: the
// leader manages it. A follower may well start before its leader has
// created it, so a missing stream is waited for (the follower's Run
// retries); one that exists and does not carry the events is a mistake to
// fix.
func OpenFollower(
	ctx context.Context,
	cfg config.Config,
	restore cluster.RestoreMode,
	version string,
	log *slog.Logger,
) (*FollowerApp, error) {
	f := &FollowerApp{Config: cfg, Log: log, Position: query.NewPosition(), Metrics: admin.NewMetrics(version)}
	var err error
	if f.Trust, err = LoadTrust(cfg, log); err != nil {
		return nil, err
	}
	f.Trust.countTo(f.Metrics)
	// A new follower's mirror may be the newest snapshot's file: NATS
	// first, then. Otherwise the mirror first, so that a mirror syncd
	// cannot open is reported whether NATS answers or not.
	early := adoptionWanted(cfg, restore, f.Trust, log)
	if !early {
		if f.Store, err = OpenStore(ctx, cfg, log, store.Options{}); err != nil {
			return nil, err
		}
	}
	pcfg := NATSConfig(cfg, log)
	if f.NATS, err = publish.Dial(ctx, pcfg); err != nil {
		f.Close()
		return nil, err
	}
	err = f.NATS.WaitAnswered(ctx, "look up the stream", func(ctx context.Context) error {
		return publish.CheckStream(ctx, f.NATS.JS, pcfg)
	})
	switch {
	case errors.Is(err, publish.ErrStreamNotFound):
		log.Warn("the stream does not exist yet; following starts when a syncd leader creates it", "stream", cfg.NATS.Stream)
	case err != nil:
		f.Close()
		return nil, err
	case early:
		if f.Snapshot, err = AdoptSnapshot(ctx, f.NATS.JS, cfg, restore, f.Trust, f.Metrics, log); err != nil {
			f.Close()
			return nil, err
		}
	}
	if early {
		if f.Store, err = OpenStore(ctx, cfg, log, store.Options{}); err != nil {
			f.Close()
			return nil, err
		}
	}
	if err := cluster.RecordRole(ctx, f.Store, cluster.RoleFollower, ""); err != nil {
		f.Close()
		return nil, err
	}
	f.Follower = NewClusterFollower(f.NATS, f.Store, cfg, restore, f.Snapshot, f.Position, f.Metrics, f.Trust, log)
	return f, nil
}

// AdminHandler serves the follower's metrics (lag, NATS) and readiness
// (the mirror, the stream, NATS).
func (f *FollowerApp) AdminHandler() http.Handler {
	m := f.Metrics
	m.WatchLag(f.Follower.Lag)
	m.WatchVerification(f.Follower)
	m.WatchNATS(f.NATS)
	checks := []admin.ReadinessCheck{{Name: "database", Run: f.Store.Writable}, f.Adopted.ReadinessCheck(),
		{Name: "stream", Run: func(context.Context) error { return f.Follower.Err() }}, admin.NATSCheck(f.NATS)}
	return admin.Handler(m, checks)
}

// Adopted is the snapshot whose file a mirror was made when it did not
// exist (AdoptSnapshot), and what checking the file found.
type Adopted struct {
	// Snapshot is the snapshot; nil when the mirror was not made from one
	// in this process.
	Snapshot *cluster.SnapshotInfo
	// damaged is what the check found wrong with the file's pages, once
	// it did (store.AdoptedDamage).
	damaged atomic.Pointer[string]
}

// check runs the mirror's check (store.CheckAdopted) when it is due: the
// mirror was made from a snapshot's file, in this process or in one that
// ended before the check did. It logs what it found.
func (a *Adopted) check(ctx context.Context, st *store.Store, log *slog.Logger) {
	if d, err := st.AdoptedDamage(ctx); err == nil && d != "" {
		a.damaged.Store(&d)
	}
	due, err := st.AdoptedCheckDue(ctx)
	if err != nil || !due {
		return
	}
	start := time.Now()
	err = st.CheckAdopted(ctx)
	switch {
	case err == nil:
		log.Info("the adopted snapshot passed its checks: quick_check, and its replica digest against its rows",
			"took", time.Since(start).Round(time.Millisecond).String())
	case ctx.Err() != nil:
	case errors.Is(err, store.ErrAdoptedUnsound):
		if d, derr := st.AdoptedDamage(ctx); derr == nil && d != "" {
			a.damaged.Store(&d)
		}
		log.Error("the mirror made from a snapshot's file is unsound; a digest that was not its rows' is now "+
			"theirs, so that the next checkpoint finds a divergence and repairs it; a file that failed quick_check "+
			"is damaged: stop syncd, remove the mirror, and start it again", "err", err)
	default:
		log.Warn("checking the adopted snapshot failed; it is checked again at the next start", "err", err)
	}
}

// ReadinessCheck fails while the mirror's file is damaged, as the check
// of a mirror made from a snapshot's file found.
func (a *Adopted) ReadinessCheck() admin.ReadinessCheck {
	return admin.ReadinessCheck{Name: "snapshot", Run: func(context.Context) error {
		if d := a.damaged.Load(); d != nil {
			return fmt.Errorf("the mirror's file, made from a snapshot's, is damaged (%s): stop syncd, remove the "+
				"mirror, and start it again", *d)
		}
		return nil
	}}
}

// Run follows the stream, and prunes the mirror's old events, until ctx
// is done.
func (f *FollowerApp) Run(ctx context.Context) error {
	g, gctx := errgroup.WithContext(ctx)
	g.Go(func() error { return f.Follower.Run(gctx) })
	g.Go(func() error { return Prune(gctx, f.Store, f.Config, f.Log) })
	g.Go(func() error { f.Adopted.check(gctx, f.Store, f.Log); return nil })
	err := g.Wait()
	f.Log.Info("stopped following", "lag", f.Follower.Lag())
	return err
}

// Close closes what OpenFollower opened, in reverse order.
func (f *FollowerApp) Close() error {
	if f.NATS != nil {
		f.NATS.Close()
	}
	if f.Store == nil {
		return nil
	}
	return CloseStore(f.Store, f.Log)
}

// Prune runs the prune job on st until ctx is done: published events
// older than [store] event_retention, and old delivery ids, go.
func Prune(ctx context.Context, st *store.Store, cfg config.Config, log *slog.Logger) error {
	return crawler.Scheduler{Logger: log}.Run(ctx, crawler.PruneJob(st, cfg.Store.EventRetention.Duration, log))
}
