package daemon_test

import (
	"context"
	"database/sql"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	dto "github.com/prometheus/client_model/go"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

const auditToken = "audit-secret-token-9d2e"

// auditWindow is the test stream's duplicate window: what a lost event
// waits before the audit publishes it again.
const auditWindow = 2 * time.Second

// auditConfig is a leader on the simulator at simURL and the NATS server at
// natsURL, announcing its baseline, with a duplicate window of auditWindow
// and a stream audit every hour: the test triggers the audits.
func auditConfig(t *testing.T, simURL, natsURL string) config.Config {
	cfg := config.Default()
	p := &cfg.Platform
	p.BaseURL, p.RegistryURL, p.Token = simURL, simURL, auditToken
	p.Group, p.Organization, p.Timeout = "org1", "acme", config.Duration{Duration: 2 * time.Second}
	c := &cfg.Crawl
	c.Schedule, c.SweepSchedule, c.AdvisoriesSchedule = "@every 1s", "@every 3s", "@every 2s"
	c.Jitter, c.RequestsPerSecond = config.Duration{}, 0
	cfg.NATS.URL, cfg.NATS.DuplicateWindow, cfg.NATS.MaxAge = natsURL, config.Duration{
		Duration: auditWindow,
	}, config.Duration{
		Duration: time.Hour,
	}
	cfg.Store.Path, cfg.Store.InitialEvents = filepath.Join(t.TempDir(), "leader.db"), "snapshot"
	cfg.Admin.Listen, cfg.KV.Enabled, cfg.Snapshot.Enabled = "", false, false
	cfg.Verify.AuditEvery = config.Duration{Duration: time.Hour}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// TestAudit_RepairsTheStreamBehindTheLeader: while the data changes
// upstream, messages are deleted from the stream behind the leader's back
// (a lost write); within an audit interval of their leaving the duplicate
// window the leader has published every one again, logged and counted
// each, and the stream holds every event of the leader's log once, each
// resource's in order. A follower started afterwards, from the stream
// alone into an empty mirror, then equals the leader.
func TestAudit_RepairsTheStreamBehindTheLeader(t *testing.T) {
	ctx := context.Background()
	app, sim, cfg, logs := startAuditedLeader(t, 28,
		platformsim.Rates{MoveTag: 80, Deprecate: 5, CreateTag: 5, UpdateRepo: 3, CreateAdvisory: 4, UpdateAdvisory: 3})

	// The data changes; messages go missing from the stream meanwhile.
	changeCtx, stopChanges := context.WithCancel(ctx)
	changing := make(chan struct{})
	go func() { defer close(changing); sim.Run(changeCtx, 20*time.Millisecond, 1) }()
	s, err := app.NATS.JS.Stream(ctx, cfg.NATS.Stream)
	if err != nil {
		t.Fatal(err)
	}
	var deleted []uint64
	for round := 0; round < 3; round++ {
		first := streamLast(t, s)
		testutil.WaitFor(t, 20*time.Second, "moves to reach the stream", func() bool { return streamLast(t, s) >= first+6 })
		// Every third message since the last round, while it is young:
		// the audit finds it on its own, where a message lost after the
		// audit checked it waits for a sweep (TestAudit_RefillsAStreamLostWhole).
		for seq := first + 1; seq <= streamLast(t, s); seq += 3 {
			m, err := s.GetMsg(ctx, seq)
			if err != nil {
				t.Fatalf("stream message %d: %v", seq, err)
			}
			if strings.HasSuffix(m.Subject, "."+publish.CheckpointToken) || time.Since(m.Time) > auditWindow/2 {
				continue // a checkpoint is no event, and an old message is past the audit
			}
			if err := s.DeleteMsg(ctx, seq); err != nil {
				t.Fatalf("delete stream message %d: %v", seq, err)
			}
			deleted = append(deleted, seq)
		}
		// An audit while the data changes and the relay publishes: it may
		// repair what is old enough, and must leave what is younger.
		audit(t, app)
	}
	if len(deleted) == 0 {
		t.Fatal("no message deleted: the machine was too slow to delete any while it was young")
	}
	stopChanges()
	<-changing
	caughtUp(t, app, sim)
	// Every event is marked published by now: once the window and its
	// margin (half of it) have passed, the next audit leaves the stream
	// whole. The audits before that find too young what they do not repair.
	// An audit that moves a resource's later events behind a repaired one
	// publishes them anew: a missing event of the same resource before
	// them waits for the window again.
	ready := time.Now().Add(auditWindow + auditWindow/2)
	audits := 0
	testutil.Eventually(t, 20*time.Second, func() error {
		started := time.Now()
		audit(t, app)
		audits++
		if rep := app.Auditor.Last(); rep != nil && rep.Reordered > 0 {
			ready = time.Now().Add(auditWindow + auditWindow/2)
		}
		err := streamHoldsTheLog(t, s, app.Store.Reader())
		if err != nil && started.After(ready) {
			t.Fatalf(
				"the first audit after every lost event left the duplicate window did not repair them all: %v; the audit's log:\n%s",
				err,
				grepLines(logs.String(), "part=audit"),
			)
		}
		return err
	})
	t.Logf("%d messages deleted; %d audits after the last change; %d repairs waited for their resource",
		len(deleted), audits, strings.Count(logs.String(), "publishing it again waits"))
	if got := counter(t, app, "syncd_stream_repaired_total"); got != float64(len(deleted)) {
		t.Errorf("syncd_stream_repaired_total = %v, want the %d messages deleted", got, len(deleted))
	}
	if n := strings.Count(logs.String(), "event missing from the stream published again"); n != len(deleted) {
		t.Errorf("%d warnings name a repaired event, want %d", n, len(deleted))
	}
	if !strings.Contains(
		logs.String(),
		"level=WARN msg=\"event missing from the stream published again\" part=audit id=",
	) {
		t.Errorf("the repair's warning does not name the event's id and type:\n%s", tail(logs.String(), 20))
	}

	// A follower that starts now builds its mirror from the stream alone.
	followerEqualsLeader(t, app, cfg)
}

// followerEqualsLeader starts a follower of app's stream into an empty
// mirror and waits until it equals the leader's.
func followerEqualsLeader(t *testing.T, app *daemon.App, cfg config.Config) {
	t.Helper()
	fst := followerStore(t)
	stop := runFollower(t, app.NATS.JS, fst, cfg, "audit-follower", nil)
	defer stop()
	testutil.Eventually(t, 20*time.Second, func() error { return testutil.SameMirror(fst.Reader(), app.Store.Reader()) })
}

// followerStore opens an empty mirror for a follower, closed when the
// test ends.
func followerStore(t *testing.T) *store.Store {
	t.Helper()
	fst, err := store.Open(context.Background(), filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { fst.Close() })
	return fst
}

// runFollower runs a follower of cfg's stream on js into fst, with the
// durable consumer named consumer, logging into logs (nil: nowhere), until
// stop is called, which fails the test if the follower failed.
func runFollower(
	t *testing.T,
	js jetstream.JetStream,
	fst *store.Store,
	cfg config.Config,
	consumer string,
	logs io.Writer,
) (stop func()) {
	t.Helper()
	fcfg := cluster.FollowerConfig{Stream: cfg.NATS.Stream, SubjectPrefix: cfg.NATS.SubjectPrefix,
		Consumer: consumer, MaxWait: 200 * time.Millisecond}
	if logs != nil {
		fcfg.Logger = slog.New(slog.NewTextHandler(logs, nil)).With("role", "follower")
	}
	f := cluster.NewFollower(js, fst, fcfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- f.Run(ctx) }()
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("follower: %v", err)
		}
	}
}

// streamEvent is an event as a stream message carries it.
type streamEvent struct {
	seq   uint64
	event store.StreamEvent
}

// streamEvents returns the events of s's messages from seq first to
// last: checkpoints passed over.
func streamEvents(t *testing.T, s jetstream.Stream, first, last uint64) []streamEvent {
	t.Helper()
	var out []streamEvent
	for seq := first; seq <= last; seq++ {
		m, err := s.GetMsg(context.Background(), seq)
		if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		if strings.HasSuffix(m.Subject, "."+publish.CheckpointToken) {
			continue
		}
		e, err := publish.Decode(m.Data)
		if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		out = append(out, streamEvent{seq, e})
	}
	return out
}

// startAuditedLeader starts a leader (auditConfig) on a simulator seeded
// with seed, whose data changes at rates once the test runs it, and
// waits until its first sync, the backfill of the histories included,
// is published: the audit is tested on what comes after.
func startAuditedLeader(
	t *testing.T,
	seed int64,
	rates platformsim.Rates,
) (*daemon.App, *platformsim.Sim, config.Config, *testutil.Buffer) {
	t.Helper()
	app, sim, cfg, logs, _ := startAuditedLeaderOn(t, testutil.NATS(t), seed, rates)
	return app, sim, cfg, logs
}

// startAuditedLeaderOn is startAuditedLeader on the NATS server ns, its
// configuration changed by mutate; stop stops the leader before the test
// ends.
func startAuditedLeaderOn(
	t *testing.T,
	ns *testutil.NATSServer,
	seed int64,
	rates platformsim.Rates,
	mutate ...func(*config.Config),
) (app *daemon.App, sim *platformsim.Sim, cfg config.Config, logs *testutil.Buffer, stop func()) {
	t.Helper()
	ctx := context.Background()
	sim, simURL := testutil.Sim(t, platformsim.Options{Seed: seed, Tokens: []string{auditToken}},
		platformsim.Scale{Repos: 3, TagsPerRepo: 4, HistoryPerTag: 3, Advisories: 3, PublicImages: -1})
	sim.SetRates(rates)
	cfg = auditConfig(t, simURL, ns.URL())
	for _, m := range mutate {
		m(&cfg)
	}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	logs = &testutil.Buffer{}
	app, stop = runLeader(t, cfg, logs)
	testutil.WaitFor(t, 30*time.Second, "the first sync to end and be published", func() bool {
		ready, _ := app.Store.HistoryReady(ctx)
		n, _, _ := app.Store.UnpublishedCount(ctx)
		return ready && n == 0
	})
	return app, sim, cfg, logs, stop
}

// runLeader opens a leader with cfg, logging into logs at debug, and
// runs it until stop is called or the test ends.
func runLeader(t *testing.T, cfg config.Config, logs *testutil.Buffer) (app *daemon.App, stop func()) {
	t.Helper()
	ctx := context.Background()
	log := slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	app, err := daemon.Open(ctx, cfg, log, daemon.Options{})
	if err != nil {
		t.Fatal(err)
	}
	role, err := app.Leadership(ctx, 5*time.Second)
	if err != nil {
		app.Close()
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- role.Run(runCtx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("leader: %v", err)
			}
			app.Close()
		})
	}
	t.Cleanup(stop)
	return app, stop
}

// caughtUp waits until the leader mirrors the simulator and published
// what it crawled.
func caughtUp(t *testing.T, app *daemon.App, sim *platformsim.Sim) {
	t.Helper()
	testutil.WaitFor(t, 30*time.Second, "the leader to publish what it crawled", func() bool {
		n, _, _ := app.Store.UnpublishedCount(context.Background())
		return n == 0 && sameAsTruth(app.Store.Reader(), sim.Truth()) == nil
	})
}

// audit has the leader audit the stream now and waits until it did.
func audit(t *testing.T, app *daemon.App) {
	t.Helper()
	before := app.Auditor.Last()
	app.Auditor.Trigger()
	testutil.WaitFor(t, 20*time.Second, "an audit", func() bool { return app.Auditor.Last() != before })
}

// streamLast is the stream's last sequence.
func streamLast(t *testing.T, s jetstream.Stream) uint64 {
	t.Helper()
	info, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return info.State.LastSeq
}

// streamHoldsTheLog checks that the stream holds every event of the
// leader's log once, and each resource's in the log's order.
func streamHoldsTheLog(t *testing.T, s jetstream.Stream, db *sql.DB) error {
	t.Helper()
	ctx := context.Background()
	type logged struct {
		seq     int64
		subject string
	}
	want := map[string]logged{}
	rows, err := db.Query(`SELECT seq, id, subject FROM event_log`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var e logged
		var id string
		if err := rows.Scan(&e.seq, &id, &e.subject); err != nil {
			rows.Close()
			return err
		}
		want[id] = e
	}
	rows.Close()
	info, err := s.Info(ctx)
	if err != nil {
		return err
	}
	if info.State.Msgs == 0 {
		return fmt.Errorf("the stream is empty")
	}
	prefix := strings.TrimSuffix(info.Config.Subjects[0], ".>") // syncd's stream: <prefix>.>
	cons, err := s.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{HeadersOnly: true})
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	last := map[string]int64{}
	for n := uint64(0); n < info.State.Msgs; {
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		got := 0
		for m := range batch.Messages() {
			got++
			id := m.Headers().Get(jetstream.MsgIDHeader)
			e, ok := want[id]
			switch {
			case publish.Reserved(prefix, m.Subject()):
				// The leader's checkpoints, term markers and snapshot
				// records: no events.
			case !ok:
				return fmt.Errorf("stream message %s is no event of the leader's log", id)
			case seen[id]:
				return fmt.Errorf("event %s (seq %d) is on the stream twice", id, e.seq)
			case last[e.subject] > e.seq:
				return fmt.Errorf("resource %s: event seq %d is on the stream after seq %d", e.subject, e.seq, last[e.subject])
			}
			seen[id], last[e.subject] = true, e.seq
		}
		if got == 0 {
			break
		}
		n += uint64(got)
	}
	var missing []int64
	for id, e := range want {
		if !seen[id] {
			missing = append(missing, e.seq)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf(
			"%d events of the log are not on the stream, seqs %v",
			len(missing),
			missing[:min(len(missing), 10)],
		)
	}
	return nil
}

// sameAsTruth checks the mirror's tags against the simulator's.
func sameAsTruth(db *sql.DB, truth platformsim.Truth) error {
	for _, tg := range truth.Tags {
		var digest string
		if err := db.QueryRow(`SELECT digest FROM tags WHERE uid = ?`, tg.UID).Scan(&digest); err != nil ||
			digest != tg.Digest {
			return fmt.Errorf("tag %s: mirror %q (%v), upstream %q", tg.UID, digest, err, tg.Digest)
		}
	}
	return nil
}

// counter is the value of a counter of app's metrics.
func counter(t *testing.T, app *daemon.App, name string) float64 {
	t.Helper()
	mfs, err := app.Metrics.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			var sum float64
			for _, m := range mf.GetMetric() {
				sum += counterValue(m)
			}
			return sum
		}
	}
	t.Fatalf("no metric %s", name)
	return 0
}

func counterValue(m *dto.Metric) float64 { return m.GetCounter().GetValue() }

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
