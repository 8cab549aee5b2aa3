package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// maturedTest is a mirror with one tag whose history the test writes,
// a record at a time, at the clock's time.
type maturedTest struct {
	t       *testing.T
	st      *store.Store
	clk     *clock
	ref     store.TagRef
	records []store.HistoryRecord
	ages    []time.Duration
}

func newMaturedTest(t *testing.T, ages ...time.Duration) *maturedTest {
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	repo := nginx()
	mustApplyRepos(t, st, repo)
	need := mustApplyTags(t, st, repo, tag("g1/r1/t1", "1.27", 1))
	return &maturedTest{t: t, st: st, clk: clk, ref: need[0], ages: ages}
}

// move records that the tag moved to digest(d) at at (default: now).
func (m *maturedTest) move(d int, at ...time.Time) {
	m.t.Helper()
	when := m.clk.Now()
	if len(at) > 0 {
		when = at[0]
	}
	m.records = append(m.records, store.HistoryRecord{Time: when, Digest: digest(d)})
	if _, err := m.st.ApplyHistory(context.Background(), m.ref, m.records, true); err != nil {
		m.t.Fatal(err)
	}
}

// mature runs Mature at the clock's time and returns the tag.matured
// events it recorded and the next instant.
func (m *maturedTest) mature() ([]store.MaturedTag, time.Time) {
	m.t.Helper()
	before := len(maturedEvents(m.t, m.st))
	res, err := m.st.Mature(context.Background(), m.ages)
	if err != nil {
		m.t.Fatal(err)
	}
	all := maturedEvents(m.t, m.st)
	if got := len(all) - before; got != res.Events {
		m.t.Fatalf("Mature reported %d events, recorded %d", res.Events, got)
	}
	return all[before:], res.Next
}

// at advances the clock to t0+d.
func (m *maturedTest) at(t0 time.Time, d time.Duration) {
	m.clk.Advance(t0.Add(d).Sub(m.clk.Now()))
}

func maturedEvents(tb testing.TB, st *store.Store) []store.MaturedTag {
	tb.Helper()
	var out []store.MaturedTag
	for _, e := range eventRows(tb, st, `type = 'tag.matured'`) {
		var d store.MaturedTag
		if err := json.Unmarshal(e.Data, &d); err != nil {
			tb.Fatal(err)
		}
		if e.Resource != "tag" || e.Action != "matured" || e.Subject != d.UID || e.Scope != "nginx" ||
			!e.Time.Equal(d.MaturedTime) {
			tb.Fatalf("tag.matured event %+v does not match its data %+v", e, d)
		}
		d.EventID = e.ID
		out = append(out, d)
	}
	return out
}

// TestMature_AtTheirAge moves a tag through several digests under an age
// of 10s and checks each tag.matured at its instant, once: the matured
// digest is the one the tag pointed to 10s ago, so a digest replaced
// within the age matures too, for as long as it was the tag's, and a tag
// that went X→Y→X announces Y and then X again.
func TestMature_AtTheirAge(t *testing.T) {
	const age = 10 * time.Second
	m := newMaturedTest(t, age)
	t0 := m.clk.Now()
	m.move(1) // X at t0

	evs, next := m.mature()
	if len(evs) != 0 || !next.Equal(t0.Add(age)) {
		t.Fatalf("at t0: events %+v, next %v; want none, next t0+10s", evs, next)
	}
	m.at(t0, age-time.Millisecond)
	if evs, _ := m.mature(); len(evs) != 0 {
		t.Fatalf("a millisecond early: %+v", evs)
	}
	m.at(t0, age)
	evs, next = m.mature()
	if len(evs) != 1 ||
		evs[0].Digest != digest(1) ||
		evs[0].Previous != nil ||
		evs[0].Age != "10s" ||
		evs[0].Tag != "1.27" ||
		evs[0].Repo != "nginx" ||
		!evs[0].Since.Equal(t0) ||
		!next.IsZero() {
		t.Fatalf("at t0+10s: events %+v, next %v; want X matured, nothing next", evs, next)
	}

	m.at(t0, 12*time.Second)
	m.move(2) // Y at t0+12s, replaced 3s later
	m.at(t0, 15*time.Second)
	m.move(3) // Z at t0+15s
	if evs, next := m.mature(); len(evs) != 0 || !next.Equal(t0.Add(22*time.Second)) {
		t.Fatalf("at t0+15s: events %+v, next %v; want none, next t0+22s (Y's age)", evs, next)
	}
	m.at(t0, 22*time.Second)
	evs, next = m.mature()
	if len(evs) != 1 || evs[0].Digest != digest(2) || evs[0].Previous == nil || evs[0].Previous.Digest != digest(1) ||
		!next.Equal(t0.Add(25*time.Second)) {
		t.Fatalf("at t0+22s: events %+v, next %v; want Y matured after X (the tag's digest 10s ago), next t0+25s", evs, next)
	}
	m.at(t0, 25*time.Second)
	evs, _ = m.mature()
	if len(evs) != 1 || evs[0].Digest != digest(3) || evs[0].Previous == nil || evs[0].Previous.Digest != digest(2) ||
		!evs[0].MaturedTime.Equal(t0.Add(25*time.Second)) {
		t.Fatalf("at t0+25s: events %+v, want Z matured after Y", evs)
	}

	// Z → W → Z: W at its age, then Z again at its second record's.
	m.at(t0, 30*time.Second)
	m.move(4)
	m.at(t0, 33*time.Second)
	m.move(3)
	want := map[time.Duration]string{40: digest(4), 43: digest(3), 60: ""}
	var again store.MaturedTag
	for _, d := range []time.Duration{40, 43, 60} {
		m.at(t0, d*time.Second)
		evs, _ := m.mature()
		switch {
		case want[d] == "" && len(evs) != 0:
			t.Fatalf("at t0+%ds: events %+v, want none", d, evs)
		case want[d] != "" && (len(evs) != 1 || evs[0].Digest != want[d]):
			t.Fatalf("at t0+%ds: events %+v, want %s matured", d, evs, want[d])
		case want[d] == digest(3):
			again = evs[0]
		}
	}
	if got := queryInt(
		t,
		m.st.Reader(),
		`SELECT seq FROM tag_matured WHERE tag_uid = 'g1/r1/t1' AND age = '10s'`,
	); got != again.Seq {
		t.Errorf("tag_matured seq = %d, want Z's second record %d: the row is the last event's", got, again.Seq)
	}
	// Every change once, in order.
	var got []string
	for _, e := range maturedEvents(t, m.st) {
		got = append(got, e.Digest)
	}
	if w := []string{digest(1), digest(2), digest(3), digest(4), digest(3)}; !slices.Equal(got, w) {
		t.Fatalf("all tag.matured: %v, want %v", got, w)
	}
}

// TestMature_LateHistoryAndRerun: history discovered after its records
// were already older than the age matures at the next run, with the time
// it matured at; running again, or recomputing from scratch as a new
// leader does, records nothing twice.
func TestMature_LateHistoryAndRerun(t *testing.T) {
	const age = time.Minute
	m := newMaturedTest(t, age)
	t0 := m.clk.Now()
	m.move(1)
	m.at(t0, time.Hour)
	if evs, _ := m.mature(); len(evs) != 1 || evs[0].Digest != digest(1) {
		t.Fatalf("first run after an hour: %+v, want X matured (every tag announced once)", evs)
	}
	// A crawl that lagged finds moves of 40 and 30 minutes ago.
	m.move(2, t0.Add(20*time.Minute))
	m.move(3, t0.Add(30*time.Minute))
	evs, next := m.mature()
	if len(evs) != 1 || evs[0].Digest != digest(3) || !evs[0].MaturedTime.Equal(t0.Add(31*time.Minute)) || !next.IsZero() {
		t.Fatalf("late history: %+v, next %v; want Z matured at t0+31m, nothing next", evs, next)
	}
	if evs, _ := m.mature(); len(evs) != 0 {
		t.Fatalf("second run: %+v", evs)
	}
	// A new leader has no run state: it recomputes every tag, and what the
	// rows hold already is not announced again.
	if err := m.st.SetMeta(context.Background(), "matured_run/1m", ""); err != nil {
		t.Fatal(err)
	}
	if evs, _ := m.mature(); len(evs) != 0 {
		t.Fatalf("recomputing every tag: %+v, want nothing new", evs)
	}
}

// TestMature_NotDuringTheBaseline: the histories are not all known yet.
func TestMature_NotDuringTheBaseline(t *testing.T) {
	clk := newClock()
	st, _ := openTemp(t, clk, true, store.Options{})
	repo := nginx()
	mustApplyRepos(t, st, repo)
	tg := tag("g1/r1/t1", "1.27", 1)
	tg.UpdateTime = clk.Now().Add(-time.Hour) // as the listing shows its one record
	need := mustApplyTags(t, st, repo, tg)
	if _, err := st.ApplyHistory(
		context.Background(),
		need[0],
		[]store.HistoryRecord{{Time: tg.UpdateTime, Digest: digest(1)}},
		true,
	); err != nil {
		t.Fatal(err)
	}
	res, err := st.Mature(context.Background(), []time.Duration{time.Second})
	if err != nil || res.Events != 0 || !res.Next.IsZero() {
		t.Fatalf("Mature in the baseline = %+v, %v; want nothing", res, err)
	}
	if err := st.EndBaseline(context.Background()); err != nil {
		t.Fatal(err)
	}
	select {
	case <-st.HistoryWritten():
	default:
		t.Fatal("the end of the baseline did not signal HistoryWritten")
	}
	if res, err := st.Mature(context.Background(), []time.Duration{time.Second}); err != nil || res.Events != 1 {
		t.Fatalf("Mature after the baseline = %+v, %v; want the tag's matured digest announced", res, err)
	}
}

// TestMature_FollowerHoldsTheSameRows: a follower applying the stream
// holds the leader's tag_matured rows, its replica digest matches, and as
// a new leader it announces nothing the old one did.
func TestMature_FollowerHoldsTheSameRows(t *testing.T) {
	ctx := context.Background()
	ages := []time.Duration{10 * time.Second, time.Minute}
	m := newMaturedTest(t, ages...)
	t0 := m.clk.Now()
	m.move(1)
	m.at(t0, 5*time.Second)
	m.move(2)
	m.at(t0, 2*time.Minute)
	evs, _ := m.mature()
	if len(evs) != 2 {
		t.Fatalf("events %+v, want digest 2 matured for both ages", evs)
	}

	follower, _ := openTemp(t, m.clk, true, store.Options{})
	if _, err := follower.ApplyStreamEvents(ctx, stream(t, m.st)); err != nil {
		t.Fatal(err)
	}
	rows := func(st *store.Store) string {
		return queryString(
			t,
			st.Reader(),
			`SELECT group_concat(tag_uid||'/'||age||'/'||seq||'/'||update_time||'/'||digest||'/'||event_id, ' ') FROM (SELECT * FROM tag_matured ORDER BY tag_uid, age)`,
		)
	}
	if got, want := rows(follower), rows(m.st); got != want || want == "" {
		t.Fatalf("follower tag_matured %q, leader %q", got, want)
	}
	ld, err := m.st.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fd, err := follower.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range ld {
		if d.Table == "tag_matured" && d.Rows != 2 {
			t.Errorf("leader's digest of tag_matured: %+v, want 2 rows", d)
		}
	}
	// The follower's history came from the stream in part (a snapshot
	// carries the rest): compare tag_matured alone.
	for i := range ld {
		if ld[i].Table == "tag_matured" && ld[i] != fd[i] {
			t.Errorf("replica digest of tag_matured: leader %v, follower %v", ld[i], fd[i])
		}
	}
	computed, err := follower.ComputeReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if d := computed.Diff(fd); d != "" {
		t.Errorf("the follower's maintained digest differs from its rows at %s", d)
	}
	// Malformed tag.matured data is refused, naming the event.
	bad := store.StreamEvent{
		ID:      "bad1",
		Type:    store.TagMatured,
		Subject: "g1/r1/t1",
		Time:    t0,
		Data:    json.RawMessage(`{"uid":"g1/r1/t9","age":"10s"}`),
	}
	if _, err := follower.ApplyStreamEvents(ctx, []store.StreamEvent{bad}); err == nil {
		t.Error("a tag.matured naming another tag was applied")
	}
}

// TestMature_RunCutShort: a first run commits its tags a chunk at a time;
// one cut short after its first chunk is done again whole, and announces
// only the tags the first chunk did not.
func TestMature_RunCutShort(t *testing.T) {
	ctx := context.Background()
	store.SetMatureChunk(t, 2)
	clk := newClock()
	var failAt, commits atomic.Int64
	crash := errors.New("crash")
	st, _ := openTemp(t, clk, false, store.Options{BeforeCommit: func(context.Context) error {
		if n := commits.Add(1); n == failAt.Load() {
			return crash
		}
		return nil
	}})
	repo := nginx()
	mustApplyRepos(t, st, repo)
	var tags []store.Tag
	for i := range 5 {
		tags = append(tags, tag(fmt.Sprintf("g1/r1/t%d", i), fmt.Sprintf("v%d", i), i))
	}
	for _, ref := range mustApplyTags(t, st, repo, tags...) {
		if _, err := st.ApplyHistory(
			ctx,
			ref,
			[]store.HistoryRecord{{Time: clk.Now(), Digest: digest(7)}},
			true,
		); err != nil {
			t.Fatal(err)
		}
	}
	clk.Advance(time.Hour)
	ages := []time.Duration{time.Minute}
	// The first chunk commits, the second's commit fails.
	failAt.Store(commits.Load() + 2)
	if _, err := st.Mature(ctx, ages); !errors.Is(err, crash) {
		t.Fatalf("Mature = %v, want the crash", err)
	}
	if got := len(maturedEvents(t, st)); got != 2 {
		t.Fatalf("after the cut: %d tag.matured, want the first chunk's 2", got)
	}
	res, err := st.Mature(ctx, ages)
	if err != nil || res.Events != 3 {
		t.Fatalf("again: %+v, %v; want the 3 others", res, err)
	}
	seen := map[string]bool{}
	for _, e := range maturedEvents(t, st) {
		if seen[e.UID] {
			t.Fatalf("tag %s announced twice", e.UID)
		}
		seen[e.UID] = true
	}
	if len(seen) != 5 {
		t.Fatalf("announced %d tags, want 5", len(seen))
	}
}

// TestMaturedDigests_AsPublished: what the matured bucket must hold is
// the state of the published tag.matured events: a change still in the
// outbox shows as the digest it replaces, and a deleted tag has none.
func TestMaturedDigests_AsPublished(t *testing.T) {
	ctx := context.Background()
	const age = 10 * time.Second
	m := newMaturedTest(t, age)
	t0 := m.clk.Now()
	m.move(1)
	m.at(t0, 20*time.Second)
	m.move(2)
	m.mature() // 1 matured
	publishAll := func() {
		evs, err := m.st.Unpublished(ctx, 0, 1000)
		if err != nil {
			t.Fatal(err)
		}
		seqs := make([]int64, len(evs))
		for i, e := range evs {
			seqs[i] = e.Seq
		}
		if err := m.st.MarkPublished(ctx, seqs); err != nil {
			t.Fatal(err)
		}
	}
	publishAll()
	m.at(t0, 30*time.Second)
	if evs, _ := m.mature(); len(evs) != 1 || evs[0].Digest != digest(2) {
		t.Fatalf("events %+v, want 2 matured", evs)
	}
	digests := func() []store.MaturedTag {
		var out []store.MaturedTag
		if err := m.st.MaturedDigests(ctx, func(d store.MaturedTag) error { out = append(out, d); return nil }); err != nil {
			t.Fatal(err)
		}
		return out
	}
	if got := digests(); len(got) != 1 || got[0].Digest != digest(1) || got[0].Tag != "1.27" || got[0].Repo != "nginx" ||
		!got[0].MaturedTime.Equal(t0.Add(age)) {
		t.Fatalf("with 2's tag.matured unpublished: %+v, want 1 as published", got)
	}
	publishAll()
	if got := digests(); len(got) != 1 || got[0].Digest != digest(2) || got[0].EventID == "" {
		t.Fatalf("published: %+v, want 2 with its event id", got)
	}
	if _, err := m.st.MarkTagsDeleted(ctx, []string{"g1/r1/t1"}); err != nil {
		t.Fatal(err)
	}
	if got := digests(); len(got) != 0 {
		t.Fatalf("deleted tag: %+v, want none", got)
	}
}
