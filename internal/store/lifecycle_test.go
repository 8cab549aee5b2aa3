package store_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// openssl is an advisory detected by a scan, as the crawler maps it.
func openssl() store.Advisory {
	return store.Advisory{
		UID:                  "g1/a1",
		AdvisoryID:           "CGA-2x4h-9q7m-p3vw",
		ArtifactName:         "openssl",
		CreateTime:           ts("2026-01-03T00:00:00Z"),
		UpdateTime:           ts("2026-01-03T00:00:00Z"),
		Author:               "advisories@example.dev",
		ArtifactType:         "apk",
		ArtifactArchitecture: "x86_64",
		ComponentName:        "libssl3",
		ComponentLocation:    "/usr/lib/libssl.so.3",
		ComponentType:        "apk",
		Aliases:              []string{"CVE-2026-0001"},
		Severities: []store.AdvisorySeverity{
			{Type: "TYPE_CVSS_V3", Score: "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"},
		},
		Events: []store.AdvisoryEvent{
			{
				UID:           "g1/a1/e1",
				Type:          store.StepDetected,
				CreateTime:    ts("2026-01-03T00:00:00.123456Z"),
				Author:        "scanner@example.dev",
				ReviewState:   "REVIEW_STATE_APPROVED",
				DetectionType: "scanv1",
				Findings:      "eyJhIjoxfQ==",
				Details:       json.RawMessage(`{ "scanv1": {"scanner": "grype", "componentVersion": "3.0.1"} }`),
			},
		},
		Raw: json.RawMessage(`{"uid": "g1/a1"}`),
	}
}

// step is a lifecycle step of openssl's.
func step(uid, kind, at string) store.AdvisoryEvent {
	e := store.AdvisoryEvent{UID: "g1/a1/" + uid, Type: kind, CreateTime: ts(at), Author: "analyst@example.dev",
		ReviewState: "REVIEW_STATE_APPROVED", Details: json.RawMessage(`{}`)}
	if kind == store.StepFixed {
		e.FixedVersion, e.Note = "3.0.2-r0", "fixed upstream"
		e.Details = json.RawMessage(`{"fixedVersion":"3.0.2-r0","note":"fixed upstream"}`)
	}
	return e
}

// stepEvent is the data of a lifecycle step's event.
type stepEvent struct {
	Advisory map[string]any      `json:"advisory"`
	Event    store.AdvisoryEvent `json:"event"`
}

func decodeStep(t *testing.T, e store.Event) stepEvent {
	t.Helper()
	var d stepEvent
	if err := json.Unmarshal(e.Data, &d); err != nil {
		t.Fatalf("decode %s data %s: %v", e.Type, e.Data, err)
	}
	return d
}

// mustAdvisories reads the mirror's advisories.
func mustAdvisories(t *testing.T, st *store.Store) []store.Advisory {
	t.Helper()
	advs, err := st.Advisories(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return advs
}

func TestApplyAdvisories_Lifecycle(t *testing.T) {
	ctx := context.Background()
	apply := func(t *testing.T, st *store.Store, a ...store.Advisory) int {
		t.Helper()
		n, err := st.ApplyAdvisories(ctx, a)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	t.Run("OneEventPerStepInOrder", func(t *testing.T) {
		clk := newClock()
		st, _ := openTemp(t, clk, false, store.Options{})
		a := openssl()
		if got := apply(t, st, a); got != 2 {
			t.Fatalf("events for a new advisory=%d, want created and detected", got)
		}
		evs := allEvents(t, st)
		if got, want := types(evs), []string{store.AdvisoryCreated, "advisory.detected"}; !slices.Equal(got, want) {
			t.Fatalf("types=%v, want %v", got, want)
		}
		_, after := payload[store.Advisory](t, evs[0])
		if len(after.Events) != 1 || after.Events[0].DetectionType != "scanv1" || after.Aliases[0] != "CVE-2026-0001" ||
			after.ComponentName != "libssl3" {
			t.Fatalf("created after=%+v", after)
		}
		det := decodeStep(t, evs[1])
		if det.Event.UID != "g1/a1/e1" ||
			det.Advisory["artifactName"] != "openssl" ||
			det.Advisory["componentName"] != "libssl3" ||
			!evs[1].Time.Equal(a.Events[0].CreateTime.Truncate(time.Millisecond)) || evs[1].Scope != "openssl" ||
			evs[1].Subject != a.UID {
			t.Fatalf("detected event %+v data %s", evs[1], evs[1].Data)
		}
		if _, ok := det.Advisory["events"]; ok {
			t.Fatalf("a step's advisory carries the lifecycle: %s", evs[1].Data)
		}

		// Three steps at once, an alias more: updated, then each step.
		clk.Advance(time.Hour)
		a.UpdateTime = ts("2026-01-05T00:00:00Z")
		a.Aliases = append(a.Aliases, "GHSA-aaaa-bbbb-cccc")
		a.Events = append(
			a.Events,
			step("e2", store.StepTruePositive, "2026-01-04T00:00:00Z"),
			step(
				"e3",
				store.StepPendingUpstreamFix,
				"2026-01-04T12:00:00Z",
			),
			step("e4", store.StepFixed, "2026-01-05T00:00:00Z"),
		)
		if got := apply(t, st, a); got != 4 {
			t.Fatalf("events=%d, want updated and three steps", got)
		}
		evs = allEvents(t, st)[2:]
		want := []string{
			store.AdvisoryUpdated,
			"advisory.true_positive",
			"advisory.pending_upstream_fix",
			store.StepEventType(store.StepFixed),
		}
		if got := types(evs); !slices.Equal(got, want) {
			t.Fatalf("types=%v, want %v", got, want)
		}
		fixed := decodeStep(t, evs[3])
		if fixed.Event.FixedVersion != "3.0.2-r0" || len(fixed.Advisory["aliases"].([]any)) != 2 {
			t.Fatalf("fixed event data %s", evs[3].Data)
		}

		// The same listing again: nothing, not even a write.
		w := watchCommits(t, st)
		if got := apply(t, st, a); got != 0 || w.wrote() {
			t.Fatalf("events for the same advisory=%d (wrote %v), want none", got, w.wrote())
		}
		// Only the mirror's precision: the same.
		b := a
		b.Events = slices.Clone(a.Events)
		b.Events[0].Details = json.RawMessage(`{"scanv1":{"scanner":"grype","componentVersion":"3.0.1"}}`)
		if got := apply(t, st, b); got != 0 {
			t.Fatalf("events for re-encoded details=%d, want 0", got)
		}
		// A review changes the advisory (and so the JSON the platform
		// sends), and is no step.
		b.Events[3].ReviewState, b.Events[3].Reviewer = "REVIEW_STATE_REJECTED", "lead@example.dev"
		b.Raw = json.RawMessage(`{"uid": "g1/a1", "reviewed": true}`)
		if got := apply(t, st, b); got != 1 || lastEvent(t, st).Type != store.AdvisoryUpdated {
			t.Fatalf("events for a review=%d, want advisory.updated alone", got)
		}

		// The mirror holds the advisory as applied.
		got := mustAdvisories(t, st)
		if len(got) != 1 ||
			len(got[0].Events) != 4 ||
			got[0].Events[3].Reviewer != "lead@example.dev" ||
			got[0].Events[0].Findings != "eyJhIjoxfQ==" ||
			string(got[0].Events[0].Details) != `{"scanv1":{"scanner":"grype","componentVersion":"3.0.1"}}` ||
			!slices.Equal(got[0].Aliases, a.Aliases) || got[0].Severities[0] != a.Severities[0] {
			t.Fatalf("mirror holds %+v", got)
		}
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT group_concat(type || '@' || seq, ' ') FROM (SELECT * FROM advisory_events ORDER BY seq)`,
		),
			"detected@0 true_positive@1 pending_upstream_fix@2 fixed@3"; got != want {
			t.Fatalf("advisory_events=%q, want %q", got, want)
		}
		// The rejected fix does not count: the state is the pending fix.
		if got, want := queryString(
			t,
			st.Reader(),
			`SELECT state || '/' || latest_event || '/' || latest_review_state FROM advisory_states`,
		),
			"pending_upstream_fix/fixed/REVIEW_STATE_REJECTED"; got != want {
			t.Fatalf("state=%q, want %q", got, want)
		}
	})
	t.Run("IDsAreDeterministic", func(t *testing.T) {
		ids := func() []string {
			st, _ := openTemp(t, newClock(), false, store.Options{})
			a := openssl()
			apply(t, st, a)
			a.Events = append(a.Events, step("e2", store.StepFixed, "2026-01-05T00:00:00Z"))
			a.UpdateTime = ts("2026-01-05T00:00:00Z")
			apply(t, st, a)
			var out []string
			for _, e := range allEvents(t, st) {
				out = append(out, e.ID)
			}
			return out
		}
		if a, b := ids(), ids(); !slices.Equal(a, b) || len(a) != 4 {
			t.Fatalf("ids %v and %v", a, b)
		}
	})
	t.Run("NoStepsInTheBaseline", func(t *testing.T) {
		for _, initial := range []string{"none", "snapshot"} {
			st, _ := openTemp(t, newClock(), true, store.Options{InitialEvents: initial})
			apply(t, st, openssl())
			want := []string{}
			if initial == "snapshot" {
				want = []string{store.AdvisoryCreated}
			}
			if got := types(allEvents(t, st)); !slices.Equal(got, want) && len(got)+len(want) > 0 {
				t.Fatalf("%s: types=%v, want %v", initial, got, want)
			}
		}
	})
	t.Run("StepsBeforeTheWithdrawal", func(t *testing.T) {
		clk := newClock()
		leader, _ := openTemp(t, clk, false, store.Options{})
		a := openssl()
		apply(t, leader, a)
		// Found fixed, then withdrawn, between two listings.
		a.Events = append(a.Events, step("e2", store.StepFixed, "2026-01-05T00:00:00Z"))
		a.UpdateTime, a.DeleteTime = ts("2026-01-06T00:00:00Z"), ts("2026-01-06T00:00:00Z")
		if got := apply(t, leader, a); got != 2 {
			t.Fatalf("events=%d, want the step and the withdrawal", got)
		}
		evs := allEvents(t, leader)
		if got, want := types(evs[2:]), []string{"advisory.fixed", store.AdvisoryWithdrawn}; !slices.Equal(got, want) {
			t.Fatalf("types=%v, want %v", got, want)
		}
		// Listed again withdrawn, with one more step: a tombstone's steps
		// are no news.
		a.Events = append(a.Events, step("e3", store.StepFalsePositive, "2026-01-07T00:00:00Z"))
		if got := apply(t, leader, a); got != 0 {
			t.Fatalf("events for a withdrawn advisory's step=%d, want 0", got)
		}
		// A follower of the stream holds the same advisory.
		follower, _ := openTemp(t, clk, false, store.Options{})
		if _, err := follower.ApplyStreamEvents(ctx, stream(t, leader)); err != nil {
			t.Fatal(err)
		}
		l, f := mustAdvisories(t, leader), mustAdvisories(t, follower)
		if len(f) != 1 || len(f[0].Events) != 2 || !f[0].DeleteTime.Equal(a.DeleteTime) ||
			!slices.Equal(f[0].Aliases, l[0].Aliases) {
			t.Fatalf("follower holds %+v", f)
		}
		// A withdrawal carries the last standing state: its updateTime is
		// the one before the withdrawal.
		f[0].UpdateTime = l[0].UpdateTime
		if lj, fj := advisoryJSON(t, l[0], 2), advisoryJSON(t, f[0], 2); lj != fj {
			t.Fatalf("leader  %s\nfollower %s", lj, fj)
		}
	})
	t.Run("ConfirmedGoneCarriesTheWholeAdvisory", func(t *testing.T) {
		st, _ := openTemp(t, newClock(), false, store.Options{})
		apply(t, st, openssl())
		if n, err := st.MarkAdvisoriesWithdrawn(ctx, []string{"g1/a1"}); err != nil || n != 1 {
			t.Fatalf("MarkAdvisoriesWithdrawn=%d, %v", n, err)
		}
		before, _ := payload[store.Advisory](t, lastEvent(t, st))
		if len(before.Events) != 1 || len(before.Aliases) != 1 || before.Severities[0].Score == "" {
			t.Fatalf("withdrawn before=%+v", before)
		}
	})
}

// advisoryJSON encodes a with only its first n steps, for comparing two
// mirrors' states.
func advisoryJSON(t *testing.T, a store.Advisory, n int) string {
	t.Helper()
	a.Events = a.Events[:min(n, len(a.Events))]
	b, err := json.Marshal(a)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestApplyStreamEvents_AdvisoryLifecycle: a follower of a leader's events
// holds every advisory with its aliases, severities and lifecycle.
func TestApplyStreamEvents_AdvisoryLifecycle(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	a, b := openssl(), openssl()
	b.UID, b.ArtifactName, b.Events = "g1/a2", "curl", []store.AdvisoryEvent{{UID: "g1/a2/e1", Type: store.StepDetected}}
	for _, advs := range [][]store.Advisory{{a, b}, nil} {
		if advs == nil {
			a.Events = append(a.Events, step("e2", store.StepFixed, "2026-01-05T00:00:00Z"))
			a.UpdateTime = ts("2026-01-05T00:00:00Z")
			advs = []store.Advisory{a}
		}
		if _, err := leader.ApplyAdvisories(ctx, advs); err != nil {
			t.Fatal(err)
		}
	}
	follower, _ := openTemp(t, clk, false, store.Options{})
	if _, err := follower.ApplyStreamEvents(ctx, stream(t, leader)); err != nil {
		t.Fatal(err)
	}
	l, f := mustAdvisories(t, leader), mustAdvisories(t, follower)
	if len(l) != 2 || len(f) != 2 {
		t.Fatalf("leader %d advisories, follower %d", len(l), len(f))
	}
	for i := range l {
		if lj, fj := advisoryJSON(t, l[i], 99), advisoryJSON(t, f[i], 99); lj != fj {
			t.Errorf("leader  %s\nfollower %s", lj, fj)
		}
	}
	for _, q := range []string{`SELECT group_concat(uid || ':' || complete, ' ') FROM advisories`,
		`SELECT group_concat(advisory_uid || ':' || base_score || ':' || rating, ' ') FROM advisory_severities`} {
		if lq, fq := queryString(t, leader.Reader(), q), queryString(t, follower.Reader(), q); lq != fq {
			t.Errorf("%s: leader %s, follower %s", q, lq, fq)
		}
	}
}

// TestMigrate_AdvisoriesFilledByTheNextListing: the advisories of a mirror
// from before schema version 7 lack everything but their first fields; the
// next listing fills them in though their updateTime did not change,
// announcing nothing of what it finds, and the listing after that
// announces the steps taken since.
func TestMigrate_AdvisoriesFilledByTheNextListing(t *testing.T) {
	ctx := context.Background()
	files := migrationFiles(t)
	path := filepath.Join(t.TempDir(), "mirror.db")
	createAtVersion(t, path, files, 6)
	st := mustOpen(t, path, store.Options{Now: newClock().Now})
	db := st.Reader()
	if got := queryInt(t, db, `SELECT complete FROM advisories WHERE uid = 'g1/a1'`); got != 0 {
		t.Fatalf("complete=%d for a row of version 6", got)
	}
	// The old row: g1/a1, CGA-1, openssl, updated 2025-01-01, no createTime.
	a := openssl()
	a.AdvisoryID, a.CreateTime, a.UpdateTime = "CGA-1", time.Time{}, ts("2025-01-01T00:00:00Z")
	a.Events = append(a.Events, step("e2", store.StepFixed, "2026-01-04T00:00:00Z"))
	if n, err := st.ApplyAdvisories(ctx, []store.Advisory{a}); err != nil || n != 0 {
		t.Fatalf("first listing after the upgrade: events=%d err=%v, want 0", n, err)
	}
	if got, want := queryString(
		t,
		db,
		`SELECT complete || '/' || component_name || '/' || (SELECT count(*) FROM advisory_events) FROM advisories`,
	), "1/libssl3/2"; got != want {
		t.Fatalf("row after the listing=%q, want %q", got, want)
	}
	if got, want := queryString(
		t,
		db,
		`SELECT artifact_name || ' ' || alias || ' ' || fixed_version FROM fixed_versions`,
	), "openssl CVE-2026-0001 3.0.2-r0"; got != want {
		t.Fatalf("fixed_versions=%q, want %q", got, want)
	}
	a.Events = append(a.Events, step("e3", store.StepDetected, "2026-01-05T00:00:00Z"))
	a.UpdateTime = ts("2025-01-02T00:00:00Z")
	if n, err := st.ApplyAdvisories(ctx, []store.Advisory{a}); err != nil || n != 2 {
		t.Fatalf("the next listing: events=%d err=%v, want updated and detected", n, err)
	}
}

func TestCVSS_KnownVectors(t *testing.T) {
	for _, c := range []struct {
		typ, score string
		base       float64
		rating     string
	}{
		{"TYPE_CVSS_V3", "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H", 9.8, "critical"},
		{"TYPE_CVSS_V3", "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:H/A:H", 10, "critical"},
		{"TYPE_CVSS_V3", "CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:H", 7.5, "high"},
		{"TYPE_CVSS_V3", "CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H", 7.8, "high"},
		{"TYPE_CVSS_V3", "CVSS:3.1/AV:N/AC:H/PR:N/UI:N/S:U/C:H/I:N/A:N", 5.9, "medium"},
		{"TYPE_CVSS_V3", "CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:C/C:L/I:L/A:N", 6.1, "medium"},
		{"TYPE_CVSS_V3", "CVSS:3.1/AV:N/AC:L/PR:L/UI:N/S:U/C:N/I:N/A:L", 4.3, "medium"},
		{"TYPE_CVSS_V3", "CVSS:3.1/AV:L/AC:H/PR:L/UI:N/S:U/C:L/I:N/A:N", 2.5, "low"},
		{"TYPE_CVSS_V3", "CVSS:3.0/AV:N/AC:L/PR:H/UI:N/S:C/C:N/I:N/A:N", 0, "none"},
		{"TYPE_CVSS_V2", "AV:N/AC:L/Au:N/C:P/I:P/A:P", 7.5, "high"},
		{"TYPE_CVSS_V2", "AV:N/AC:M/Au:N/C:N/I:P/A:N", 4.3, "medium"},
		{"TYPE_CVSS_V2", "AV:L/AC:L/Au:N/C:C/I:C/A:C", 7.2, "high"},
		{"TYPE_CVSS_V4", "9.3", 9.3, "critical"},
	} {
		base, rating, ok := store.CVSS(c.typ, c.score)
		if !ok || base != c.base || rating != c.rating {
			t.Errorf("%s %s = %v %s %v, want %v %s", c.typ, c.score, base, rating, ok, c.base, c.rating)
		}
	}
	for _, score := range []string{
		"CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N",
		"CVSS:3.1/AV:N",
		"",
		"11",
	} {
		if b, r, ok := store.CVSS("TYPE_CVSS_V3", score); ok {
			t.Errorf("%q scored %v %s", score, b, r)
		}
	}
}
