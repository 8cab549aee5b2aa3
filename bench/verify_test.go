package bench

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// verifyResult is what the replicas' verification costs (#28): the
// checkpoints and the stream audit cost the relay, the replica digest's
// triggers the writer. Each is measured against the same work without it,
// in the same run, the two sides taking turns step by step so that the
// machine's other load slows both alike.
type verifyResult struct {
	// Events is how many events each relay side published, PassEvents how
	// many a pass (a page of repo creations written, then Relay.Flush).
	Events     int `json:"events"`
	PassEvents int `json:"pass_events"`
	// RelayPerSec is the relay's rate with neither checkpoints nor audit.
	RelayPerSec float64 `json:"relay_per_s"`
	// CheckpointPerSec is the rate with a checkpoint due every
	// verifyCheckpointEvery of the side's relaying, published after the
	// pass in which it fell due (Relay.PublishCheckpoint, what Relay.Run
	// does once one is due and the outbox is drained): Checkpoints of
	// them, CheckpointMs each on average (the publish and its
	// acknowledgement, and reading the state and recording the stream
	// position in the mirror). CheckpointRatio is CheckpointPerSec /
	// RelayPerSec.
	CheckpointPerSec float64 `json:"checkpoints_relay_per_s"`
	CheckpointRatio  float64 `json:"checkpoints_ratio"`
	Checkpoints      int     `json:"checkpoints"`
	CheckpointMs     float64 `json:"checkpoint_mean_ms"`
	// AuditPerSec is the rate with an audit (Auditor.Audit) started beside
	// every verifyAuditPasses-th pass, and the next pass waiting for it:
	// Audits of them, which checked AuditChecked events in all (each event
	// once) in AuditSeconds. AuditRatio is AuditPerSec / RelayPerSec: the
	// audit's cost at its default proportions (see verifyAuditSlack).
	AuditPerSec  float64 `json:"audit_relay_per_s"`
	AuditRatio   float64 `json:"audit_ratio"`
	Audits       int     `json:"audits"`
	AuditChecked int     `json:"audit_checked"`
	AuditSeconds float64 `json:"audit_s"`
	// WholeAuditSeconds is one audit of all the audit side's events at the
	// end, from the start of its log and alone (nothing else running): the
	// audit's own pace, WholeAuditPerSec events a second.
	WholeAuditSeconds float64 `json:"whole_audit_s"`
	WholeAuditPerSec  float64 `json:"whole_audit_per_s"`
	// Writer is the replica digest's cost to the writer.
	Writer digestWriterResult `json:"writer"`
}

// digestWriterResult is the writer's time with the replica digest's
// triggers and without them (dropped from a second store): a baseline of
// Tags tags (ApplyRepos, ApplyTags, ApplyHistories of HistoryRows records),
// then Moves moves (ApplyTags, ApplyHistories). tag_history's inserts add
// their hashes to the digest in Go, not through a trigger (store/digest.go):
// that part is paid on both sides and is not in the ratio.
type digestWriterResult struct {
	Tags           int     `json:"tags"`
	HistoryRows    int     `json:"history_rows"`
	Moves          int     `json:"moves"`
	WithSeconds    float64 `json:"with_triggers_s"`
	WithoutSeconds float64 `json:"without_triggers_s"`
	// Ratio is WithSeconds / WithoutSeconds: 1.05 is 5% more time.
	Ratio float64 `json:"ratio"`
}

// verifyPass is how many events a relay pass of measureVerifyRelay
// publishes: a crawl commits a page of 200 resources at a time, and a
// relay keeping up with it publishes a few pages a pass.
const verifyPass = 500

// verifyCheckpointEvery is the checkpoint_every of measureVerifyRelay's
// checkpoint side: 600 times as often as the default (a minute).
const verifyCheckpointEvery = 100 * time.Millisecond

// verifyRecent is how long ago an event must have been published for the
// audits of measureVerifyRelay to check it: events marked published while
// an audit begins are left to the next.
const verifyRecent = 100 * time.Millisecond

// verifyAuditPasses is how many of its passes the audit side relays per
// audit, and verifyAuditSlack how far before the first event it checks an
// audit reads the stream back. By default an audit runs every 5 minutes
// and reads back a minute more: a fifth of what it checks. Here an audit
// checks 8 passes (4,000 events, some 0.5 s of relaying with the other
// sides' turns between) and reads a fifth of a second more, so that it
// reads about as much of the stream per event checked as by default, and
// pays its start (stream info, a consumer) over fewer events: the cost of
// audits at the default audit_every, at the relay's full rate.
const (
	verifyAuditPasses = 8
	verifyAuditSlack  = 200 * time.Millisecond
)

// verifyGivesWay is the longest the audits wait for a relay pass under way
// before each of their reads, as the daemon's do (daemon.auditGivesWay).
const verifyGivesWay = 50 * time.Millisecond

// BenchmarkVerify is the verification rows of BenchmarkSyncd alone, on an
// embedded server of its own:
//
//	BENCH_SCALE=0.1 go test -run '^$' -bench '^BenchmarkVerify$' -benchtime 1x ./bench/
func BenchmarkVerify(b *testing.B) {
	p, dir := setUp(b)
	ctx := context.Background()
	pcfg := publishConfig(filepath.Join(dir, "nats"), "https://platform.bench/org1")
	conn, err := publish.Connect(ctx, pcfg)
	if err != nil {
		b.Fatal(err)
	}
	defer conn.Close()
	for range b.N {
		v, err := measureVerify(ctx, conn, filepath.Join(dir, fmt.Sprintf("verify-%d", time.Now().UnixNano())), p.Scale)
		if err != nil {
			b.Fatal(err)
		}
		fmt.Fprintf(
			os.Stderr,
			"relay %.0f events/s (%d events, passes of %d); with checkpoints %.0f (%.3f; %d, %.2f ms each); "+
				"with an audit every %d passes %.0f (%.3f; %d audits, %d checked in %.2f s; a whole audit %.0f events/s); writer %.2f s with the digest's triggers, %.2f s without (%.3f)\n",
			v.RelayPerSec,
			v.Events,
			v.PassEvents,
			v.CheckpointPerSec,
			v.CheckpointRatio,
			v.Checkpoints,
			v.CheckpointMs,
			verifyAuditPasses,
			v.AuditPerSec,
			v.AuditRatio,
			v.Audits,
			v.AuditChecked,
			v.AuditSeconds,
			v.WholeAuditPerSec,
			v.Writer.WithSeconds,
			v.Writer.WithoutSeconds,
			v.Writer.Ratio,
		)
		b.ReportMetric(v.CheckpointRatio, "checkpoints/plain")
		b.ReportMetric(v.AuditRatio, "audit/plain")
		b.ReportMetric(v.Writer.Ratio, "writer-with/without")
	}
}

// measureVerify measures the three costs of verifyResult at scale (the
// issue's organization is 1), under dir, on conn's server.
func measureVerify(ctx context.Context, conn *publish.Conn, dir string, scale float64) (verifyResult, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return verifyResult{}, err
	}
	v, err := measureVerifyRelay(ctx, conn, dir, verifyPass*max(40, int(80*scale)))
	if err != nil {
		return v, err
	}
	v.Writer, err = measureDigestWriter(ctx, dir, max(2000, int(20000*scale)))
	return v, err
}

// verifySide is one relay of measureVerifyRelay: its own mirror and stream.
type verifySide struct {
	name    string
	st      *store.Store
	relay   *publish.Relay
	auditor *publish.Auditor // the audit side's
	cp      bool             // the checkpoint side
	sinceCp time.Duration    // its relaying since its last checkpoint
	written int
	timed   time.Duration
}

// measureVerifyRelay has three relays publish events repo creations each,
// a page of verifyPass written to each mirror and flushed at a time, the
// three taking turns: one plain, one publishing a checkpoint after the
// pass in which one fell due (every verifyCheckpointEvery of its own
// relaying), one with an audit started beside every verifyAuditPasses-th
// pass. Only the relay's passes (and the checkpoints) are timed, not the
// writes.
//
// The audit's clock is set a duplicate window ahead, so that it audits
// the events published until a moment before it began rather than none (it
// leaves those younger than the window, whose loss JetStream would hide),
// and its slack is verifyAuditSlack: each audit reads the stream from a
// little before the events it checks, as one at audit_every does.
func measureVerifyRelay(ctx context.Context, conn *publish.Conn, dir string, events int) (verifyResult, error) {
	events = max(2, events/verifyPass/2*2) * verifyPass // whole turns of order
	res := verifyResult{Events: events, PassEvents: verifyPass}
	var sides []*verifySide
	defer func() {
		for _, s := range sides {
			s.st.Close()
		}
	}()
	for _, name := range []string{"plain", "checkpoints", "audit"} {
		st, err := store.Open(ctx, filepath.Join(dir, name+".db"), store.Options{})
		if err != nil {
			return res, err
		}
		s := &verifySide{name: name, st: st}
		sides = append(sides, s)
		if err := st.EndBaseline(ctx); err != nil {
			return res, err
		}
		pcfg := publishConfig("", "https://platform.bench/org1")
		pcfg.Stream, pcfg.SubjectPrefix = "VERIFY_"+strings.ToUpper(name), "verify"+name
		if err := publish.EnsureStream(ctx, conn.JS, pcfg); err != nil {
			return res, err
		}
		defer conn.JS.DeleteStream(context.WithoutCancel(ctx), pcfg.Stream)
		var opts []publish.RelayOption
		if name == "checkpoints" {
			s.cp = true
			opts = append(opts, publish.WithCheckpoints(st, time.Minute, "bench"))
		}
		s.relay = publish.NewRelay(conn.JS, st, pcfg, opts...)
		if name == "audit" {
			const margin = time.Second
			s.auditor = publish.NewAuditor(conn.JS, st, s.relay.Message, publish.AuditConfig{
				Stream: pcfg.Stream, SubjectPrefix: pcfg.SubjectPrefix, Every: time.Hour, Margin: margin,
				Slack: verifyAuditSlack,
				Now:   func() time.Time { return time.Now().Add(pcfg.DuplicateWindow + margin - verifyRecent) },
				// As the daemon's audit gives way to its relay, this one
				// gives way to the three: the machine's relaying.
				Yield: func(ctx context.Context) error {
					for _, s := range sides {
						if err := s.relay.Idle(ctx, verifyGivesWay); err != nil {
							return err
						}
					}
					return nil
				},
			})
		}
	}
	// The sides take turns in an order in which each follows each other
	// side as often: what a pass leaves behind (the audit's garbage, say)
	// falls on the other two alike.
	order := []int{0, 1, 2, 0, 2, 1}
	var cpTime, auditTime time.Duration
	for step := range len(sides) * events / verifyPass {
		s := sides[order[step%len(order)]]
		if err := writeRepoPage(ctx, s, verifyPass); err != nil {
			return res, err
		}
		var audit chan auditResult
		if s.auditor != nil && s.written%(verifyAuditPasses*verifyPass) == 0 {
			audit = make(chan auditResult, 1)
			go func() {
				start := time.Now()
				rep, err := s.auditor.Audit(ctx)
				audit <- auditResult{rep, time.Since(start), err}
			}()
		}
		start := time.Now()
		err := s.relay.Flush(ctx)
		if s.cp {
			s.sinceCp += time.Since(start)
		}
		if err == nil && s.cp && s.sinceCp >= verifyCheckpointEvery {
			cpStart := time.Now()
			var why string
			if _, why, err = s.relay.PublishCheckpoint(ctx); err == nil && why != "" {
				err = errors.New("no checkpoint: " + why)
			}
			cpTime += time.Since(cpStart)
			res.Checkpoints++
			s.sinceCp = 0
		}
		s.timed += time.Since(start)
		if audit != nil {
			a := <-audit
			if err := a.check(); err != nil {
				return res, err
			}
			res.Audits++
			res.AuditChecked += a.rep.Checked
			auditTime += a.took
		}
		if err != nil {
			return res, fmt.Errorf("relay %s: %w", s.name, err)
		}
	}
	for _, s := range sides {
		if n, _, err := s.st.UnpublishedCount(ctx); err != nil || n != 0 {
			return res, fmt.Errorf("relay %s left %d events unpublished (%v)", s.name, n, err)
		}
	}
	// The whole audit: from the start of the log, once the last events are
	// old enough for the audit's clock.
	au := sides[2]
	time.Sleep(2 * verifyRecent)
	if err := au.st.SetAuditPosition(ctx, 0, 0, nil); err != nil {
		return res, err
	}
	start := time.Now()
	rep, err := au.auditor.Audit(ctx)
	whole := auditResult{rep, time.Since(start), err}
	if err := whole.check(); err != nil {
		return res, err
	}
	if rep.Checked != au.written {
		return res, fmt.Errorf("the whole audit checked %d events of %d", rep.Checked, au.written)
	}
	res.WholeAuditSeconds = whole.took.Seconds()
	res.WholeAuditPerSec = float64(rep.Checked) / res.WholeAuditSeconds
	rate := func(s *verifySide) float64 { return float64(s.written) / s.timed.Seconds() }
	res.RelayPerSec, res.CheckpointPerSec, res.AuditPerSec = rate(sides[0]), rate(sides[1]), rate(sides[2])
	res.CheckpointRatio, res.AuditRatio = res.CheckpointPerSec/res.RelayPerSec, res.AuditPerSec/res.RelayPerSec
	if res.Checkpoints > 0 {
		res.CheckpointMs = float64(cpTime.Microseconds()) / 1000 / float64(res.Checkpoints)
	}
	res.AuditSeconds = auditTime.Seconds()
	return res, nil
}

// auditResult is what an audit of measureVerifyRelay reported, and its time.
type auditResult struct {
	rep  publish.AuditReport
	took time.Duration
	err  error
}

// check fails an audit that failed, or that found events missing: nothing
// deleted any from the stream.
func (a auditResult) check() error {
	if a.err != nil {
		return fmt.Errorf("audit: %w", a.err)
	}
	if n := a.rep.Repaired + a.rep.Deferred + a.rep.Duplicates; n > 0 {
		return fmt.Errorf("audit: %d events missing from a stream nothing deleted from (%+v)", n, a.rep)
	}
	return nil
}

// writeRepoPage records n repo creations in s's mirror, one transaction.
func writeRepoPage(ctx context.Context, s *verifySide, n int) error {
	now := time.Now().UTC()
	repos := make([]store.Repo, n)
	for i := range repos {
		id := s.written + i
		repos[i] = store.Repo{
			UID:        fmt.Sprintf("org1/%s%08d", s.name, id),
			Name:       fmt.Sprintf("%s-%08d", s.name, id),
			CreateTime: now,
			UpdateTime: now,
		}
	}
	events, err := s.st.ApplyRepos(ctx, repos)
	if err != nil {
		return err
	}
	if events != n {
		return fmt.Errorf("%s: %d repos created recorded %d events", s.name, n, events)
	}
	s.written += n
	return nil
}

// Shape of the writer's organization: a repo's tags, a tag's history in
// the baseline, the tags of a repo that move once after it, and tags per
// ApplyHistories (the crawler's group commit joins the reads that finish
// together).
const (
	writerTagsPerRepo    = 50
	writerRecordsPerTag  = 20
	writerMovesPerRepo   = 10
	writerHistoriesBatch = 16
)

// measureDigestWriter writes the same organization of tags tags into two
// new mirrors, one of them without the replica digest's triggers, taking
// turns call by call (which goes first alternating), and returns the time
// each spent in the store's calls.
func measureDigestWriter(ctx context.Context, dir string, tags int) (digestWriterResult, error) {
	repos := max(1, tags/writerTagsPerRepo)
	res := digestWriterResult{
		Tags:        repos * writerTagsPerRepo,
		HistoryRows: repos * writerTagsPerRepo * writerRecordsPerTag,
		Moves:       repos * writerMovesPerRepo,
	}
	var sts [2]*store.Store // with the triggers, without
	for i, name := range []string{"digest-with.db", "digest-without.db"} {
		st, err := store.Open(ctx, filepath.Join(dir, name), store.Options{})
		if err != nil {
			return res, err
		}
		defer st.Close()
		sts[i] = st
	}
	dropped, err := dropDigestTriggers(ctx, filepath.Join(dir, "digest-without.db"))
	if err != nil {
		return res, err
	}
	if dropped == 0 {
		return res, errors.New("the mirror has no replica digest triggers to drop")
	}
	var took [2]time.Duration
	turn := 0
	// both runs fn on each mirror, timed, in the turn's order.
	both := func(fn func(side int, st *store.Store) error) error {
		turn++
		for k := range 2 {
			side := (turn + k) % 2
			start := time.Now()
			err := fn(side, sts[side])
			took[side] += time.Since(start)
			if err != nil {
				return err
			}
		}
		return nil
	}

	base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	repoOf := func(r int) store.Repo {
		return store.Repo{
			UID:        fmt.Sprintf("org1/%016x", hash64("wrepo", r)),
			Name:       fmt.Sprintf("writer-%05d", r),
			CreateTime: base,
			UpdateTime: base,
		}
	}
	// history is tag t's records, oldest first, the last moves after it.
	history := func(t, moves int) []store.HistoryRecord {
		recs := make([]store.HistoryRecord, writerRecordsPerTag+moves)
		for i := range recs {
			recs[i] = store.HistoryRecord{Time: base.Add(time.Duration(t)*time.Second + time.Duration(i)*time.Hour),
				Digest: fmt.Sprintf("sha256:%016x%048x", hash64("wtag", t), i)}
		}
		return recs
	}
	tagsOf := func(r, moves int) []store.Tag {
		out := make([]store.Tag, writerTagsPerRepo)
		for j := range out {
			t := r*writerTagsPerRepo + j
			m := 0
			if j < writerMovesPerRepo {
				m = moves
			}
			h := history(t, m)
			last := h[len(h)-1]
			out[j] = store.Tag{UID: fmt.Sprintf("%s/%016x", repoOf(r).UID, hash64("wtag", t)), Name: fmt.Sprintf("v%d", j),
				Digest: last.Digest, CreateTime: h[0].Time, UpdateTime: last.Time}
		}
		return out
	}
	// histories applies the history of need, read from each tag's bookmark.
	histories := func(st *store.Store, r int, need []store.TagRef, moves int) (int, error) {
		events := 0
		for len(need) > 0 {
			k := min(writerHistoriesBatch, len(need))
			ups := make([]store.HistoryUpdate, k)
			for i, ref := range need[:k] {
				j := tagIndex(ref.Name)
				m := 0
				if j < writerMovesPerRepo {
					m = moves
				}
				recs := history(r*writerTagsPerRepo+j, m)
				from := 0
				for from < len(recs) && recs[from].Time.Before(ref.Bookmark.LastTime) {
					from++
				}
				ups[i] = store.HistoryUpdate{Ref: ref, Records: recs[from:], Complete: true}
			}
			n, err := st.ApplyHistories(ctx, ups)
			if err != nil {
				return events, err
			}
			events += n
			need = need[k:]
		}
		return events, nil
	}

	// The baseline: repos a page at a time, then each repo's tags and their
	// histories.
	for start := 0; start < repos; start += 200 {
		page := make([]store.Repo, 0, 200)
		for r := start; r < min(start+200, repos); r++ {
			page = append(page, repoOf(r))
		}
		if err := both(func(_ int, st *store.Store) error { _, err := st.ApplyRepos(ctx, page); return err }); err != nil {
			return res, err
		}
	}
	for r := range repos {
		var need [2][]store.TagRef
		err := both(func(side int, st *store.Store) error {
			var err error
			need[side], _, err = st.ApplyTags(ctx, repoOf(r), tagsOf(r, 0))
			return err
		})
		if err != nil {
			return res, err
		}
		if err := both(func(side int, st *store.Store) error {
			_, err := histories(st, r, need[side],
				0)
			return err
		}); err != nil {
			return res, err
		}
	}
	for _, st := range sts {
		if err := st.EndBaseline(ctx); err != nil {
			return res, err
		}
	}
	// Then some of every repo's tags move once: the listing shows it, the
	// history read records the move.
	var moved [2]int
	for r := range repos {
		var need [2][]store.TagRef
		err := both(func(side int, st *store.Store) error {
			var err error
			need[side], _, err = st.ApplyTags(ctx, repoOf(r), tagsOf(r, 1))
			return err
		})
		if err != nil {
			return res, err
		}
		err = both(func(side int, st *store.Store) error {
			n, err := histories(st, r, need[side], 1)
			moved[side] += n
			return err
		})
		if err != nil {
			return res, err
		}
	}
	if moved[0] != res.Moves || moved[1] != res.Moves {
		return res, fmt.Errorf("the moves recorded %d and %d events, want %d", moved[0], moved[1], res.Moves)
	}
	// The triggers were off where they were dropped, and on in the other.
	var tagDigest [2]int64
	for i, st := range sts {
		d, err := st.ReplicaDigest(ctx)
		if err != nil {
			return res, err
		}
		for _, t := range d {
			if t.Table == "tags" {
				tagDigest[i] = t.Rows
			}
		}
	}
	if tagDigest[0] != int64(res.Tags) || tagDigest[1] != 0 {
		return res, fmt.Errorf(
			"the replica digest counts %d tags with the triggers (want %d) and %d without (want 0)",
			tagDigest[0],
			res.Tags,
			tagDigest[1],
		)
	}
	res.WithSeconds, res.WithoutSeconds = took[0].Seconds(), took[1].Seconds()
	res.Ratio = res.WithSeconds / res.WithoutSeconds
	return res, nil
}

// tagIndex is the index in its repo of a tag of tagsOf, from its name.
func tagIndex(name string) int {
	j, _ := strconv.Atoi(strings.TrimPrefix(name, "v"))
	return j
}

// dropDigestTriggers drops the replica digest's triggers from the mirror
// at path, through a connection of its own (the store keeps them on every
// mirror it opens, and has no switch for them), and returns how many.
func dropDigestTriggers(ctx context.Context, path string) (int, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(10000)")
	if err != nil {
		return 0, err
	}
	defer db.Close()
	rows, err := db.QueryContext(
		ctx,
		`SELECT name FROM sqlite_schema WHERE type = 'trigger' AND name LIKE 'replica_digest_%'`,
	)
	if err != nil {
		return 0, err
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return 0, err
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return 0, err
	}
	for _, n := range names {
		if _, err := db.ExecContext(ctx, `DROP TRIGGER `+n); err != nil {
			return 0, fmt.Errorf("drop trigger %s: %w", n, err)
		}
	}
	return len(names), nil
}
