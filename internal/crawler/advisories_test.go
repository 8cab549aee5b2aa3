package crawler_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// stepOf is the step kind syncd gives each kind of the platform's
// advisory events, written out here as the contract says it.
var stepOf = map[string]string{
	platformsim.EventDetection: "detected", platformsim.EventTruePositive: "true_positive",
	platformsim.EventFalsePositive: "false_positive", platformsim.EventPendingUpstreamFix: "pending_upstream_fix",
	platformsim.EventFixNotPlanned: "fix_not_planned", platformsim.EventAnalysisNotPlanned: "analysis_not_planned",
	platformsim.EventPatched: "patched", platformsim.EventFixed: "fixed",
}

// advisoryRig is a mirror of a protojson simulator's advisories whose
// events a relay publishes to an embedded JetStream, read back by a
// consumer of the advisory subjects.
type advisoryRig struct {
	sim     *platformsim.Sim
	store   *store.Store
	crawler *crawler.Crawler
	relay   *publish.Relay
	cons    jetstream.Consumer
}

func newAdvisoryRig(t *testing.T, sc platformsim.Scale) *advisoryRig {
	t.Helper()
	ctx := context.Background()
	sim, url := testutil.Sim(t, platformsim.Options{Seed: 11, Tokens: []string{token}, ProtoJSON: true}, sc)
	h := harnessOn(t, sim, url, func(c *crawler.Config) { c.Concurrency = 2 })
	cfg := publish.Config{DataDir: t.TempDir(), SubjectPrefix: "syncd", Stream: "SYNCD", DuplicateWindow: time.Minute,
		Source: "https://platform.test/org1", Logger: slog.New(slog.DiscardHandler)}
	conn, err := publish.Connect(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	cons, err := conn.JS.CreateOrUpdateConsumer(ctx, "SYNCD", jetstream.ConsumerConfig{Durable: "advisories",
		FilterSubject: "syncd.advisory.>", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverAllPolicy})
	if err != nil {
		t.Fatal(err)
	}
	return &advisoryRig{
		sim:     sim,
		store:   h.store,
		crawler: h.crawler,
		relay:   publish.NewRelay(conn.JS, h.store, cfg),
		cons:    cons,
	}
}

// message is one event as the consumer received it.
type message struct {
	natsSubject string
	event       publish.CloudEvent
}

// publishAndReceive publishes the outbox and returns the n messages it
// adds to the advisory subjects, failing if more arrive.
func (r *advisoryRig) publishAndReceive(t *testing.T, n int) []message {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := r.relay.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	var out []message
	for len(out) < n {
		if ctx.Err() != nil {
			t.Fatalf("received %d of %d messages", len(out), n)
		}
		batch, err := r.cons.Fetch(n-len(out), jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var ce publish.CloudEvent
			if err := json.Unmarshal(m.Data(), &ce); err != nil {
				t.Fatalf("message on %s: %v", m.Subject(), err)
			}
			out = append(out, message{m.Subject(), ce})
			if err := m.Ack(); err != nil {
				t.Fatal(err)
			}
		}
	}
	extra, err := r.cons.FetchNoWait(10)
	if err != nil {
		t.Fatal(err)
	}
	for m := range extra.Messages() {
		t.Errorf("unexpected message on %s: %s", m.Subject(), m.Data())
	}
	return out
}

// stepMsg is what a lifecycle step's message must say.
type stepMsg struct{ advisory, kind, eventUID string }

// TestAdvisories_EveryLifecycleStepOnJetStream moves advisories of a
// protojson simulator through every kind of lifecycle step, withdraws two
// (by deleteTime, and by deletion confirmed with a 404), and shows after
// each crawl the mirror equal to the ground truth, field by field, and
// exactly one message per step on a JetStream consumer, in each advisory's
// order, with the subject syncd.advisory.<kind>.<artifact>.
func TestAdvisories_EveryLifecycleStepOnJetStream(t *testing.T) {
	ctx := context.Background()
	r := newAdvisoryRig(t, platformsim.Scale{Repos: 1, TagsPerRepo: 1, HistoryPerTag: 1, Advisories: 10, PublicImages: -1})
	if _, err := r.crawler.Sync(ctx); err != nil { // the baseline: no events
		t.Fatal(err)
	}
	checkAdvisoryMirror(t, r.store, r.sim.Truth().Advisories, nil)
	if got := r.publishAndReceive(t, 0); len(got) != 0 {
		t.Fatalf("the baseline published %d advisory messages", len(got))
	}

	truth := r.sim.Truth().Advisories
	live := make([]string, 0, len(truth))
	for _, a := range truth {
		live = append(live, a.UID)
	}
	type move struct {
		uid, kind, review string
	}
	rounds := [][]move{
		{{live[0], platformsim.EventTruePositive, ""}, {live[0], platformsim.EventPendingUpstreamFix, ""},
			{live[1], platformsim.EventFalsePositive, ""}, {live[2], platformsim.EventAnalysisNotPlanned, ""},
			{live[3], platformsim.EventPatched, ""}, {live[4], platformsim.EventFixed, platformsim.ReviewPending}},
		{
			{live[0], platformsim.EventFixed, ""},
			{live[2], platformsim.EventFixNotPlanned, ""},
			{live[5], platformsim.EventDetection, ""},
			{live[4], "review", ""},
			{live[6], platformsim.EventFixed, ""},
			{live[6], "withdraw", ""},
			{"", "create", ""},
		},
		{{live[7], "delete", ""}},
	}
	kindsSeen := map[string]bool{}
	for i, round := range rounds {
		r.sim.Advance(time.Hour)
		var want []stepMsg
		var deleted string
		for _, m := range round {
			r.sim.Advance(time.Minute)
			var mut platformsim.Mutation
			switch m.kind {
			case "review":
				mut = platformsim.Mutation{Kind: platformsim.AdvisoryReviewed, UID: m.uid}
			case "withdraw":
				mut = platformsim.Mutation{Kind: platformsim.AdvisoryWithdrawn, UID: m.uid}
			case "delete":
				mut, deleted = platformsim.Mutation{Kind: platformsim.AdvisoryDeleted, UID: m.uid}, m.uid
			case "create":
				// A name that must be escaped in a subject.
				mut = platformsim.Mutation{Kind: platformsim.AdvisoryCreated, Name: "py.thon 3"}
			default:
				mut = platformsim.Mutation{Kind: platformsim.AdvisoryEventAdded, UID: m.uid, Event: m.kind, Review: m.review}
			}
			done, err := r.sim.Apply(mut)
			if err != nil {
				t.Fatal(err)
			}
			if done.Event != "" && mut.Kind != platformsim.AdvisoryReviewed {
				want = append(want, stepMsg{done.UID, stepOf[done.Event], done.EventUID})
				kindsSeen[done.Event] = true
			}
		}
		before := countAdvisoryEvents(t, r.store)
		var err error
		if deleted != "" {
			_, err = r.crawler.Sweep(ctx) // only a sweep confirms a deletion
		} else {
			_, err = r.crawler.SyncAdvisories(ctx)
		}
		if err != nil {
			t.Fatal(err)
		}
		truth := r.sim.Truth().Advisories
		checkAdvisoryMirror(t, r.store, truth, stringsOrNil(deleted))
		msgs := r.publishAndReceive(t, countAdvisoryEvents(t, r.store)-before)
		t.Logf("round %d: %d messages, %d steps", i+1, len(msgs), len(want))
		checkStepMessages(t, fmt.Sprintf("round %d", i+1), msgs, want, truth)
		if deleted != "" && !slices.ContainsFunc(msgs, func(m message) bool {
			return m.event.Type == "dev.syncd.advisory.withdrawn" && m.event.Subject == deleted
		}) {
			t.Fatalf("round %d: no advisory.withdrawn for the advisory deleted upstream", i+1)
		}
	}
	for _, k := range platformsim.EventKinds() {
		if !kindsSeen[k] {
			t.Errorf("no step of kind %s was taken", k)
		}
	}
}

func stringsOrNil(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}

func countAdvisoryEvents(t *testing.T, st *store.Store) int {
	t.Helper()
	var n int
	if err := st.Reader().QueryRow(`SELECT count(*) FROM event_log WHERE resource = 'advisory'`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// checkStepMessages checks that msgs hold exactly one message per wanted
// step, in each advisory's order, with the subject, type and data the
// contract gives, and that an advisory's created or updated message comes
// before its steps and a withdrawn one after.
func checkStepMessages(t *testing.T, round string, msgs []message, want []stepMsg, truth []platformsim.TruthAdvisory) {
	t.Helper()
	byUID := map[string]platformsim.TruthAdvisory{}
	for _, a := range truth {
		byUID[a.UID] = a
	}
	type got struct {
		actions []string // per advisory, in stream order
		steps   []stepMsg
	}
	per := map[string]*got{}
	for _, m := range msgs {
		ce := m.event
		action := strings.TrimPrefix(ce.Type, "dev.syncd.advisory.")
		g := per[ce.Subject]
		if g == nil {
			g = &got{}
			per[ce.Subject] = g
		}
		g.actions = append(g.actions, action)
		if action == "created" || action == "updated" || action == "withdrawn" {
			continue
		}
		var d struct {
			Advisory store.Advisory      `json:"advisory"`
			Event    store.AdvisoryEvent `json:"event"`
		}
		if err := json.Unmarshal(ce.Data, &d); err != nil {
			t.Fatalf("%s: data of %s: %v", round, ce.Type, err)
		}
		a := byUID[ce.Subject]
		if wantSubj := "syncd.advisory." + action + "." + publish.EscapeToken(a.ArtifactName); m.natsSubject != wantSubj {
			t.Errorf("%s: %s on subject %s, want %s", round, ce.Type, m.natsSubject, wantSubj)
		}
		if d.Event.Type != action || d.Advisory.UID != a.UID || d.Advisory.ArtifactName != a.ArtifactName ||
			!slices.Equal(d.Advisory.Aliases, a.Aliases) || len(d.Advisory.Events) != 0 {
			t.Errorf("%s: %s data %s", round, ce.Type, ce.Data)
		}
		for _, e := range a.Events {
			if e.UID == d.Event.UID && (e.FixedVersion != d.Event.FixedVersion || !e.CreateTime.Equal(mustTime(t, ce.Time))) {
				t.Errorf(
					"%s: %s of %s: fixed version %q at %s, truth %q at %s",
					round,
					ce.Type,
					e.UID,
					d.Event.FixedVersion,
					ce.Time,
					e.FixedVersion,
					e.CreateTime,
				)
			}
		}
		g.steps = append(g.steps, stepMsg{ce.Subject, action, d.Event.UID})
	}
	wantPer := map[string][]stepMsg{}
	for _, w := range want {
		wantPer[w.advisory] = append(wantPer[w.advisory], w)
	}
	for uid, g := range per {
		if !slices.Equal(g.steps, wantPer[uid]) {
			t.Errorf("%s: steps of %s: %v, want %v", round, uid, g.steps, wantPer[uid])
		}
		for i, action := range g.actions {
			if (action == "created" || action == "updated") && i != 0 || action == "withdrawn" && i != len(g.actions)-1 {
				t.Errorf("%s: messages of %s in the order %v", round, uid, g.actions)
			}
		}
	}
	for uid, w := range wantPer {
		if per[uid] == nil {
			t.Errorf("%s: no messages for %s, want %v", round, uid, w)
		}
	}
}

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// checkAdvisoryMirror checks that the mirror holds every advisory of the
// truth as the truth has it, every field, alias, severity and lifecycle
// step, and besides them only the advisories gone, as tombstones.
func checkAdvisoryMirror(t *testing.T, st *store.Store, truth []platformsim.TruthAdvisory, gone []string) {
	t.Helper()
	got, err := st.Advisories(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	byUID := map[string]store.Advisory{}
	for _, a := range got {
		byUID[a.UID] = a
	}
	for _, uid := range gone {
		if a, ok := byUID[uid]; !ok || a.DeleteTime.IsZero() {
			t.Errorf("advisory %s gone upstream is not a tombstone: %+v", uid, a)
		}
		delete(byUID, uid)
	}
	if len(byUID) != len(truth) {
		t.Fatalf("mirror has %d advisories, truth %d", len(byUID), len(truth))
	}
	for _, w := range truth {
		a, ok := byUID[w.UID]
		if !ok {
			t.Fatalf("advisory %s missing", w.UID)
		}
		if w.DeleteTime == nil && !a.DeleteTime.IsZero() || w.DeleteTime != nil && !a.DeleteTime.Equal(*w.DeleteTime) {
			t.Errorf("%s: deleteTime %v, truth %v", w.UID, a.DeleteTime, w.DeleteTime)
		}
		type scalars struct {
			ID, Artifact, Author, Type, Arch, Component, Location, CompType, Legacy string
			Created, Updated                                                        time.Time
		}
		gs := scalars{
			a.AdvisoryID,
			a.ArtifactName,
			a.Author,
			a.ArtifactType,
			a.ArtifactArchitecture,
			a.ComponentName,
			a.ComponentLocation,
			a.ComponentType,
			a.LegacyAdvisoryID,
			a.CreateTime.UTC(),
			a.UpdateTime.UTC(),
		}
		ws := scalars{
			w.AdvisoryID,
			w.ArtifactName,
			w.Author,
			w.ArtifactType,
			w.ArtifactArchitecture,
			w.ComponentName,
			w.ComponentLocation,
			w.ComponentType,
			w.LegacyAdvisoryID,
			w.CreateTime,
			w.UpdateTime,
		}
		if gs != ws {
			t.Errorf("%s: %+v, truth %+v", w.UID, gs, ws)
		}
		if !slices.Equal(a.Aliases, w.Aliases) {
			t.Errorf("%s: aliases %v, truth %v", w.UID, a.Aliases, w.Aliases)
		}
		if len(a.Severities) != len(w.Severities) {
			t.Errorf("%s: severities %v, truth %v", w.UID, a.Severities, w.Severities)
		}
		for i := range min(len(a.Severities), len(w.Severities)) {
			if a.Severities[i].Type != w.Severities[i].Type || a.Severities[i].Score != w.Severities[i].Score {
				t.Errorf("%s: severity %d %+v, truth %+v", w.UID, i, a.Severities[i], w.Severities[i])
			}
		}
		if len(a.Events) != len(w.Events) {
			t.Fatalf("%s: %d lifecycle steps, truth %d", w.UID, len(a.Events), len(w.Events))
		}
		for i, e := range a.Events {
			checkStep(t, w.UID, e, w.Events[i])
		}
	}
}

// checkStep compares one lifecycle step with the truth's.
func checkStep(t *testing.T, adv string, e store.AdvisoryEvent, w platformsim.TruthAdvisoryEvent) {
	t.Helper()
	type fields struct {
		UID, Type, Author, Reviewer, Review, Issue, Note, Fixed, FP, Detection, Findings string
		Created                                                                          time.Time
	}
	g := fields{
		e.UID,
		e.Type,
		e.Author,
		e.Reviewer,
		e.ReviewState,
		e.Issue,
		e.Note,
		e.FixedVersion,
		e.FalsePositiveType,
		e.DetectionType,
		e.Findings,
		e.CreateTime.UTC(),
	}
	x := fields{
		w.UID,
		stepOf[w.Kind],
		w.Author,
		w.Reviewer,
		w.ReviewState,
		w.Issue,
		w.Note,
		w.FixedVersion,
		w.FalsePositiveType,
		w.DetectionType,
		base64.StdEncoding.EncodeToString(w.Findings),
		w.CreateTime,
	}
	if g != x {
		t.Errorf("%s: step %+v, truth %+v", adv, g, x)
	}
	if !slices.Equal(e.PatchedVersions, w.PatchedVersions) {
		t.Errorf("%s: step %s patched %v, truth %v", adv, e.UID, e.PatchedVersions, w.PatchedVersions)
	}
	// The kind's own object holds what the step has no field for: a
	// detection's match.
	var details map[string]any
	if err := json.Unmarshal(e.Details, &details); err != nil {
		t.Fatalf("%s: step %s details %q: %v", adv, e.UID, e.Details, err)
	}
	if w.Kind == platformsim.EventDetection {
		match, _ := details[w.DetectionType].(map[string]any)
		if len(match) != len(w.Match) || len(details) != 1 {
			t.Errorf("%s: detection details %s, truth match %v", adv, e.Details, w.Match)
		}
		for k, v := range w.Match {
			if match[k] != v {
				t.Errorf("%s: detection %s=%v, truth %q", adv, k, match[k], v)
			}
		}
	} else if details["note"] != nilIfEmpty(w.Note) || details["fixedVersion"] != nilIfEmpty(w.FixedVersion) {
		t.Errorf("%s: %s details %s, truth %+v", adv, w.Kind, e.Details, w)
	}
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// v3Ratings are the ratings of the CVSS v3 vectors the simulator draws,
// from the specification's calculator.
var v3Ratings = map[string]string{
	"CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H": "critical", "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:H/A:H": "critical",
	"CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:H": "high", "CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H": "high",
	"CVSS:3.1/AV:N/AC:H/PR:N/UI:N/S:U/C:H/I:N/A:N": "medium", "CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:C/C:L/I:L/A:N": "medium",
	"CVSS:3.1/AV:L/AC:H/PR:L/UI:N/S:U/C:L/I:N/A:N": "low", "CVSS:3.1/AV:N/AC:L/PR:L/UI:N/S:U/C:N/I:N/A:L": "medium",
}

// truthState is an advisory's state as the platform's latest_event_type
// defines it: the kind of its latest approved event (latest by time, then
// by position), "" when none is approved.
func truthState(a platformsim.TruthAdvisory) (platformsim.TruthAdvisoryEvent, bool) {
	var best platformsim.TruthAdvisoryEvent
	found := false
	for _, e := range a.Events {
		if e.ReviewState == platformsim.ReviewApproved && (!found || !e.CreateTime.Before(best.CreateTime)) {
			best, found = e, true
		}
	}
	return best, found
}

// queryRows runs q on the mirror and returns its rows as strings joined
// by "|", sorted.
func queryRows(t *testing.T, st *store.Store, q string, args ...any) []string {
	t.Helper()
	rows, err := st.Reader().Query(q, args...)
	if err != nil {
		t.Fatalf("%s: %v", q, err)
	}
	defer rows.Close()
	cols, _ := rows.Columns()
	var out []string
	for rows.Next() {
		vals := make([]any, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			t.Fatal(err)
		}
		parts := make([]string, len(vals))
		for i, v := range vals {
			if v != nil {
				parts[i] = fmt.Sprint(v)
			}
		}
		out = append(out, strings.Join(parts, "|"))
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	slices.Sort(out)
	return out
}

func sortedRows(rows []string) []string {
	slices.Sort(rows)
	return rows
}

// TestAdvisories_AnalystViewsAgainstTheTruth builds a mirror from a strict
// simulator whose scenario engine moved advisories through their
// lifecycles, and checks each analyst view against answers computed from
// the ground truth: the state of each advisory, CVE to advisories, fixed
// versions per artifact and alias, open advisories by severity, and
// lifecycle steps over a time range.
func TestAdvisories_AnalystViewsAgainstTheTruth(t *testing.T) {
	ctx := context.Background()
	sim, url := testutil.Sim(t, platformsim.Options{Seed: 5, Tokens: []string{token}, ProtoJSON: true,
		Rates: platformsim.Rates{CreateAdvisory: 2, AdvanceAdvisory: 6, WithdrawAdvisory: 1}},
		platformsim.Scale{Repos: 1, TagsPerRepo: 1, HistoryPerTag: 1, Advisories: 90, PublicImages: -1})
	h := harnessOn(t, sim, url, nil)
	if _, err := h.crawler.Sync(ctx); err != nil {
		t.Fatal(err)
	}
	since := sim.Now()
	for range 3 {
		sim.Advance(time.Hour)
		sim.Step(10)
		if _, err := h.crawler.SyncAdvisories(ctx); err != nil {
			t.Fatal(err)
		}
	}
	truth := sim.Truth().Advisories
	checkAdvisoryMirror(t, h.store, truth, nil)

	var states, byAlias, fixed, open, ratings, recent []string
	ratingCount := map[string]int{}
	for _, a := range truth {
		st, ok := truthState(a)
		state, fixedVersion := "", ""
		if ok {
			state, fixedVersion = stepOf[st.Kind], st.FixedVersion
		}
		states = append(states, strings.Join([]string{a.UID, state, fixedVersion}, "|"))
		for _, al := range a.Aliases {
			byAlias = append(byAlias, al+"|"+a.UID+"|"+state)
			if state == "fixed" && a.DeleteTime == nil {
				fixed = append(fixed, a.ArtifactName+"|"+al+"|"+fixedVersion)
			}
		}
		if a.DeleteTime == nil && !slices.Contains([]string{"fixed", "patched", "false_positive"}, state) {
			open = append(open, a.UID)
			for _, s := range a.Severities {
				if s.Type == "TYPE_CVSS_V3" {
					ratings = append(ratings, a.UID+"|"+v3Ratings[s.Score])
					ratingCount[v3Ratings[s.Score]]++
				}
			}
		}
		for _, e := range a.Events {
			if !e.CreateTime.Before(since) {
				recent = append(recent, stepOf[e.Kind]+"|"+e.UID)
			}
		}
	}
	t.Logf(
		"%d advisories: %d fixed rows, %d open, %d recent steps, ratings %v",
		len(truth),
		len(fixed),
		len(open),
		len(recent),
		ratingCount,
	)
	if len(fixed) == 0 || len(open) == 0 || len(recent) < 10 || len(ratingCount) < 3 {
		t.Fatalf(
			"the scenario gave %d fixed rows, %d open advisories, %d recent steps, ratings %v: too few to test",
			len(fixed),
			len(open),
			len(recent),
			ratingCount,
		)
	}
	for _, c := range []struct {
		name string
		q    string
		want []string
	}{
		{"advisory_states", `SELECT uid, state, fixed_version FROM advisory_states`, states},
		{"advisories_by_alias", `SELECT alias, advisory_uid, state FROM advisories_by_alias`, byAlias},
		{"fixed_versions", `SELECT artifact_name, alias, fixed_version FROM fixed_versions`, fixed},
		{"open_advisories", `SELECT uid FROM open_advisories`, open},
		{"open_advisories ratings", `SELECT uid, rating FROM open_advisories`, ratings},
		{"advisory_lifecycle", `SELECT type, event_uid FROM advisory_lifecycle WHERE event_time >= ?`, recent},
	} {
		var args []any
		if strings.Contains(c.q, "?") {
			args = append(args, store.FormatTime(since))
		}
		if got, want := queryRows(t, h.store, c.q, args...), sortedRows(c.want); !slices.Equal(got, want) {
			t.Errorf("%s: %d rows, want %d\n got  %v\n want %v", c.name, len(got), len(want), got, want)
		}
	}
	// Open advisories by severity, as the example in docs/schema.md asks.
	for rating, n := range ratingCount {
		var got int
		if err := h.store.Reader().QueryRow(`SELECT COUNT(*) FROM open_advisories WHERE rating = ?`,
			rating).Scan(&got); err != nil ||
			got != n {
			t.Errorf("open %s advisories=%d (%v), want %d", rating, got, err, n)
		}
	}
	// The documented examples about advisories find rows in a mirror of
	// the simulator too, as in the demo, not only in the store's fixture.
	doc, err := os.ReadFile("../../docs/schema.md")
	if err != nil {
		t.Fatal(err)
	}
	examples := 0
	for _, m := range regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(string(doc), -1) {
		q := m[1]
		if !strings.Contains(q, "advisor") && !strings.Contains(q, "fixed_versions") {
			continue
		}
		examples++
		if rows := queryRows(t, h.store, q); len(rows) == 0 {
			t.Errorf("no rows from the documented example:\n%s", q)
		}
	}
	if examples < 10 {
		t.Errorf("found %d advisory examples in docs/schema.md", examples)
	}
}

// TestAdvisories_UnknownKindKept: a kind of lifecycle step the platform
// adds later is mirrored under its own name, in snake case, and announced
// as such, rather than dropped.
func TestAdvisories_UnknownKindKept(t *testing.T) {
	ctx := context.Background()
	const body = `{"advisories":[{"uid":"org1/a1","advisoryId":"CGA-1","artifactName":"curl","events":[
		{"uid":"org1/a1/e1","createTime":"2026-03-01T00:00:00Z","detection":{"manual":{}}},
		{"uid":"org1/a1/e2","createTime":"2026-03-02T00:00:00Z","riskAccepted":{"until":"2027-01-01"}}]}]}`
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	client, err := platform.New(
		platform.Config{BaseURL: srv.URL, RegistryURL: srv.URL, Token: platform.StaticToken(token)},
	)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := crawler.New(client, st, crawler.Config{Group: "org1"}).SyncAdvisories(ctx); err != nil {
		t.Fatal(err)
	}
	if got, want := queryRows(t, st, `SELECT type, details FROM advisory_events`), []string{`detected|{"manual":{}}`,
		`risk_accepted|{"until":"2027-01-01"}`}; !slices.Equal(
		got,
		want,
	) {
		t.Fatalf("advisory_events=%v, want %v", got, want)
	}
	if got, want := queryRows(t, st, `SELECT type FROM events`), []string{"advisory.created", "advisory.detected",
		"advisory.risk_accepted"}; !slices.Equal(
		got,
		want,
	) {
		t.Fatalf("events=%v, want %v", got, want)
	}
}

// TestSweep_AdvisoryListingRestartsUnderIt: between two pages of the
// advisory listing the page token expires (the listing restarts) and an
// advisory is created. The sweep lists again from the start: it fails
// nothing, withdraws nothing that is live, and the mirror's open
// advisories are the platform's.
func TestSweep_AdvisoryListingRestartsUnderIt(t *testing.T) {
	d := &listingDisturber{path: "/vulnerabilities/v2/advisories", disturb: func(sim *platformsim.Sim) {
		sim.Apply(platformsim.Mutation{Kind: platformsim.AdvisoryCreated})
	}}
	sim, url := testutil.Sim(t, platformsim.Options{Seed: 9, Tokens: []string{token}},
		platformsim.Scale{Repos: 2, TagsPerRepo: 1, HistoryPerTag: 1, Advisories: 450, PublicImages: -1}, d.wrap)
	d.sim = sim
	h := harnessOn(t, sim, url, nil)
	ctx := context.Background()
	if _, err := h.crawler.Sweep(ctx); err != nil {
		t.Fatal(err)
	}
	d.arm()
	sum, err := h.crawler.Sweep(ctx)
	if err != nil {
		t.Fatalf("sweep with the advisory listing restarted under it: %v", err)
	}
	if n := d.trips(); n != 1 {
		t.Fatalf("the listing was disturbed %d times, want once", n)
	}
	if sum.Failures != 0 {
		t.Errorf("sweep failures=%d, want 0", sum.Failures)
	}
	open := 0
	for _, a := range sim.Truth().Advisories {
		if a.DeleteTime == nil {
			open++
		}
	}
	if got := h.count(t, `SELECT count(*) FROM advisories WHERE deleted_time IS NULL`); got != open {
		t.Errorf("open advisories in the mirror=%d, want the platform's %d", got, open)
	}
	if n := h.count(t, `SELECT count(*) FROM events WHERE type = 'advisory.created'`); n != 1 {
		t.Errorf("advisory.created events=%d, want 1 (the one created mid-listing)", n)
	}
}
