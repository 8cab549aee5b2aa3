package admin

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/events"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// The series and checks here read the other parts at scrape time, through
// the small interfaces below: the parts know nothing of Prometheus.

// UnpublishedCounter is what the outbox series read: the store.
type UnpublishedCounter interface {
	UnpublishedCount(ctx context.Context) (int, time.Time, error)
}

// FailureLister lists the repos and tags whose reads failed.
type FailureLister interface {
	// FailureCounts counts the recorded failures by kind.
	FailureCounts(ctx context.Context) (map[string]int, error)
}

// WatchOutbox exports the outbox's backlog: how many events wait for
// JetStream, and how old the oldest is.
func (m *Metrics) WatchOutbox(o UnpublishedCounter) {
	m.GaugeFunc(
		"syncd_outbox_unpublished_events",
		"Events committed but not yet acknowledged by JetStream.",
		func() float64 {
			n, _, err := o.UnpublishedCount(context.Background())
			if err != nil {
				return -1
			}
			return float64(n)
		},
	)
	m.GaugeFunc(
		"syncd_outbox_oldest_unpublished_age_seconds",
		"Age of the oldest event waiting for JetStream (0: none).",
		func() float64 {
			_, oldest, err := o.UnpublishedCount(context.Background())
			if err != nil || oldest.IsZero() {
				return 0
			}
			return time.Since(oldest).Seconds()
		},
	)
}

// WatchFailures exports how many repos and tags are failing, by kind.
func (m *Metrics) WatchFailures(f FailureLister) {
	for _, kind := range []string{"repo", "tag"} {
		m.GaugeFuncWith(
			"syncd_crawl_failures",
			"Repos and tags whose reads failed and are retried with backoff (syncd status lists them).",
			prometheus.Labels{"kind": kind},
			func() float64 {
				counts, err := f.FailureCounts(context.Background())
				if err != nil {
					return -1
				}
				return float64(counts[kind])
			},
		)
	}
}

// NATSStatus is a NATS connection's state, read without waiting on the
// connection (publish.Conn.Status).
type NATSStatus interface{ Status() nats.Status }

// WatchNATS exports whether the NATS connection is up.
func (m *Metrics) WatchNATS(c NATSStatus) {
	m.GaugeFunc(
		"syncd_nats_connected",
		"1 while the NATS connection is up.",
		func() float64 { return boolGauge(c.Status() == nats.CONNECTED) },
	)
}

// WatchReceiver exports the webhook receiver's counts.
func (m *Metrics) WatchReceiver(s *events.Stats) {
	for outcome, v := range map[string]*atomic.Int64{
		"accepted":  &s.Accepted,
		"duplicate": &s.Duplicate,
		"ignored":   &s.Ignored,
		"unknown":   &s.Unknown,
	} {
		m.CounterFunc(
			"syncd_webhooks_received_total",
			"Verified pushed events by outcome.",
			prometheus.Labels{"outcome": outcome},
			func() float64 { return float64(v.Load()) },
		)
	}
	for _, reason := range events.RejectReasons() {
		m.CounterFunc(
			"syncd_webhooks_rejected_total",
			"Pushed events rejected, by reason.",
			prometheus.Labels{"reason": reason},
			func() float64 { return float64(s.RejectedCount(reason)) },
		)
	}
}

// RoleSource is what the cluster series read of a replica in cluster mode
// (a cluster.Replica).
type RoleSource interface {
	Role() string
	IsLeader() bool
}

// WatchReplica exports the replica's role among roles, and whether it
// holds the leader lease.
func (m *Metrics) WatchReplica(r RoleSource, roles ...string) {
	for _, role := range roles {
		m.GaugeFuncWith("syncd_cluster_role", "1 for the replica's current role.", prometheus.Labels{"role": role},
			func() float64 { return boolGauge(r.Role() == role) })
	}
	m.GaugeFunc(
		"syncd_cluster_leader",
		"1 while this replica holds the leader lease.",
		func() float64 { return boolGauge(r.IsLeader()) },
	)
}

// WatchLag exports how far a follower is behind the stream.
func (m *Metrics) WatchLag(lag func() uint64) {
	m.GaugeFunc(
		"syncd_follower_lag_events",
		"Messages the follower's consumer has pending.",
		func() float64 { return float64(lag()) },
	)
}

// VerifiedReplica is a replica that compares its mirror with the leader's
// checkpoints.
type VerifiedReplica interface {
	Diverged() bool
	Repairs() uint64
}

// WatchVerification exports whether r's mirror differs from the leader's
// at the last checkpoint compared, and how many repairs it started.
func (m *Metrics) WatchVerification(r VerifiedReplica) {
	m.GaugeFunc("syncd_replica_diverged", "1 while the mirror differs from the leader's last checkpoint compared.",
		func() float64 { return boolGauge(r.Diverged()) })
	m.CounterFunc("syncd_replica_repairs_total", "Repairs of a mirror that differed from the leader's checkpoint.", nil,
		func() float64 { return float64(r.Repairs()) })
}

func boolGauge(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// NATSCheck is the readiness check of the NATS connection.
func NATSCheck(c NATSStatus) ReadinessCheck {
	return ReadinessCheck{Name: "nats", Run: func(context.Context) error {
		if s := c.Status(); s != nats.CONNECTED {
			return fmt.Errorf("not connected to NATS (%s)", s)
		}
		return nil
	}}
}

// FreshnessCheck is the readiness check that no job is overdue. It checks
// only while active says so (nil: always): in cluster mode only the leader
// crawls, so only the leader can be stale.
func FreshnessCheck(f *Freshness, active func() bool) ReadinessCheck {
	return ReadinessCheck{Name: "freshness", Run: func(context.Context) error {
		if active != nil && !active() {
			return nil
		}
		stale := f.Stale()
		if len(stale) == 0 {
			return nil
		}
		var parts []string
		for job, age := range stale {
			parts = append(parts, fmt.Sprintf("%s last succeeded %s ago", job, age.Round(time.Second)))
		}
		sort.Strings(parts)
		return errors.New(strings.Join(parts, "; "))
	}}
}

// Observe records a finished run of job: a completed one (ok, or partial,
// whose failed scopes are retried on their own) makes the job fresh.
func (f *Freshness) Observe(job, outcome string, finished time.Time) {
	if store.RunCompleted(outcome) {
		f.Succeeded(job, finished)
	}
}

// Baseliner says whether the mirror's first complete crawl is still to end.
type Baseliner interface {
	InBaseline(ctx context.Context) (bool, error)
}

// BaselineCheck is not ready until the first complete listing (the
// baseline) has ended: before it, the mirror holds part of the
// organization. It is the readiness of the current state.
func BaselineCheck(b Baseliner, active func() bool) ReadinessCheck {
	return ReadinessCheck{Name: "baseline", Phase: PhaseCurrent, Run: func(ctx context.Context) error {
		if active != nil && !active() {
			return nil
		}
		in, err := b.InBaseline(ctx)
		if err != nil {
			return err
		}
		if in {
			return errors.New("the first complete listing (the baseline) has not ended yet; syncd status shows its progress")
		}
		return nil
	}}
}

// Readiness phases, as /readyz, the syncd_ready gauge and syncd status
// name them.
const (
	PhaseCurrent = "current" // every repo, tag and advisory as listed
	PhaseHistory = "history" // and every tag's history
)

// Backfiller says how far the backfill of the tags' histories is.
type Backfiller interface {
	Baseliner
	HistoryReady(ctx context.Context) (bool, error)
	BackfillRemaining(ctx context.Context) (int64, error)
}

// HistoryCheck is not ready while the backfill has tags' histories left to
// read, and says how many and how long at rate requests a second (0:
// unlimited). It is deferred: /readyz answers 503 for it only when asked
// for ?phase=history, since the current state is served meanwhile.
func HistoryCheck(b Backfiller, rate float64, active func() bool) ReadinessCheck {
	return ReadinessCheck{Name: "history", Phase: PhaseHistory, Deferred: true, Run: func(ctx context.Context) error {
		if active != nil && !active() {
			return nil
		}
		ready, err := b.HistoryReady(ctx)
		if err != nil || ready {
			return err
		}
		left, err := b.BackfillRemaining(ctx)
		if err != nil {
			return err
		}
		msg := fmt.Sprintf("the backfill has %d tags' histories left to read", left)
		if eta := crawler.BackfillETA(left, rate); eta > 0 {
			msg += fmt.Sprintf(", about %s at %g requests/s", eta, rate)
		}
		return errors.New(msg)
	}}
}

// WatchBackfill exports the readiness of each phase (syncd_ready, 1 when
// ready) and the backfill's tags left and time left at rate requests a
// second (0: unlimited, no estimate).
func (m *Metrics) WatchBackfill(b Backfiller, rate float64) {
	ctx := context.Background()
	m.GaugeFuncWith(
		"syncd_ready",
		"1 when the phase is ready: current (every repo, tag and advisory listed), history (every tag's history read).",
		prometheus.Labels{"phase": PhaseCurrent},
		func() float64 {
			in, err := b.InBaseline(ctx)
			return boolGauge(err == nil && !in)
		},
	)
	m.GaugeFuncWith(
		"syncd_ready",
		"1 when the phase is ready: current (every repo, tag and advisory listed), history (every tag's history read).",
		prometheus.Labels{"phase": PhaseHistory},
		func() float64 {
			ready, err := b.HistoryReady(ctx)
			return boolGauge(err == nil && ready)
		},
	)
	m.GaugeFunc("syncd_backfill_remaining_tags", "Tags whose history the backfill has yet to read.", func() float64 {
		n, _ := b.BackfillRemaining(ctx)
		return float64(n)
	})
	m.GaugeFunc(
		"syncd_backfill_eta_seconds",
		"Time the backfill needs for the tags left at the request rate limit (0: done, or no limit).",
		func() float64 {
			n, _ := b.BackfillRemaining(ctx)
			if rate <= 0 {
				return 0
			}
			return float64(n) / rate
		},
	)
}

// Refuser reports the credentials the platform or the registry refuse now.
type Refuser interface {
	Refusals() map[string]*platform.AuthError
}

// CredentialsCheck is not ready while the platform or the registry refuses
// syncd's credential, and says which and what to do.
func CredentialsCheck(r Refuser, active func() bool) ReadinessCheck {
	return ReadinessCheck{Name: "credentials", Run: func(context.Context) error {
		if active != nil && !active() {
			return nil
		}
		refused := r.Refusals()
		var errs []string
		for _, e := range refused {
			errs = append(errs, e.Error())
		}
		if len(errs) == 0 {
			return nil
		}
		sort.Strings(errs)
		return errors.New(strings.Join(errs, "; "))
	}}
}

// Erring reports why a part is not doing its work now; nil while it is.
type Erring interface{ Err() error }

// RoleCheck is the readiness check name of a part that works only while
// active says so (nil: always): the relay while this replica leads
// (publishing), the follower while it stands by (following the stream).
func RoleCheck(name string, e Erring, active func() bool) ReadinessCheck {
	return ReadinessCheck{Name: name, Run: func(context.Context) error {
		if active != nil && !active() {
			return nil
		}
		return e.Err()
	}}
}

// WatchSnapshots exports the newest snapshot of the mirror: its age and
// compressed size. last returns the time it was written, zero when there
// is none yet, and its size.
func (m *Metrics) WatchSnapshots(last func() (time.Time, int64)) {
	m.GaugeFunc(
		"syncd_snapshot_age_seconds",
		"Age of the newest snapshot of the mirror in the Object Store bucket (-1: none known).",
		func() float64 {
			t, _ := last()
			if t.IsZero() {
				return -1
			}
			return time.Since(t).Seconds()
		},
	)
	m.GaugeFunc(
		"syncd_snapshot_bytes",
		"Compressed size of the newest snapshot of the mirror (0: none known).",
		func() float64 {
			_, n := last()
			return float64(n)
		},
	)
}
