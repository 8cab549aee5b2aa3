package platformsim_test

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
)

// The conformance cases of advisories as advisories.proto has them: the
// whole resource, the lifecycle's oneof as the gateway renders it, the
// list's own filters, and the scenario engine's lifecycles.

// wantKeys fails unless m has each key.
func wantKeys(t *testing.T, what string, m map[string]any, keys ...string) {
	t.Helper()
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			t.Fatalf("%s lacks %s: %v", what, k, m)
		}
	}
}

// onlyMember returns the one member of event e that is not a common
// field: the oneof's.
func onlyMember(t *testing.T, e map[string]any) (string, map[string]any) {
	t.Helper()
	var kinds []string
	for k := range e {
		switch k {
		case "uid", "createTime", "findings", "author", "reviewer", "reviewState", "issue":
		default:
			kinds = append(kinds, k)
		}
	}
	if len(kinds) != 1 {
		t.Fatalf("event %v has oneof members %v, want exactly one", e, kinds)
	}
	m, ok := e[kinds[0]].(map[string]any)
	if !ok {
		t.Fatalf("oneof member %s of %v is not an object", kinds[0], e)
	}
	return kinds[0], m
}

func TestAdvisoryResource(t *testing.T) {
	runCases(t, []testCase{
		{name: "Advisory_WholeResourceAsTheTruthHasIt", run: func(t *testing.T, e *env) {
			for _, a := range e.sim.Truth().Advisories {
				r := e.get("/vulnerabilities/v2/advisories/" + a.UID)
				e.mustStatus(r, http.StatusOK)
				m := r.body
				// Without ProtoJSON, every field is rendered, as a gateway
				// emitting unpopulated fields does.
				wantKeys(t, a.UID, m, "author", "artifactType", "artifactArchitecture", "componentName",
					"componentLocation", "componentType", "aliases", "severities", "events")
				if str(m, "componentName") != a.ComponentName || str(m, "artifactArchitecture") != a.ArtifactArchitecture ||
					str(
						m,
						"legacyAdvisoryId",
					) != a.LegacyAdvisoryID || str(m, "createTime") != a.CreateTime.Format("2006-01-02T15:04:05.000Z") {
					t.Fatalf("advisory %s = %v, truth %+v", a.UID, m, a)
				}
				evs := m["events"].([]any)
				if len(evs) != len(a.Events) || len(a.Events) == 0 {
					t.Fatalf("advisory %s has %d events, truth %d", a.UID, len(evs), len(a.Events))
				}
				for i, x := range evs {
					ev, te := x.(map[string]any), a.Events[i]
					kind, member := onlyMember(t, ev)
					if kind != te.Kind || str(ev, "uid") != te.UID || !strings.HasPrefix(te.UID, a.UID+"/") ||
						str(ev, "reviewState") != te.ReviewState {
						t.Fatalf("event %d of %s = %v, truth %+v", i, a.UID, ev, te)
					}
					if te.Kind == platformsim.EventFixed && str(member, "fixedVersion") != te.FixedVersion {
						t.Fatalf("fixed member %v, truth %+v", member, te)
					}
					if te.Kind == platformsim.EventDetection {
						if _, ok := member[te.DetectionType].(map[string]any); !ok || len(member) != 1 {
							t.Fatalf("detection member %v, want one member %s", member, te.DetectionType)
						}
					}
					if f := str(ev, "findings"); f != base64.StdEncoding.EncodeToString(te.Findings) {
						t.Fatalf("findings %q, truth %q", f, te.Findings)
					}
				}
			}
		}},
		{name: "Advisory_ProtoJSONKeepsTheOneofMember", opts: strict, run: func(t *testing.T, e *env) {
			a := e.sim.Truth().Advisories[0]
			e.sim.Advance(time.Hour)
			m, err := e.sim.Apply(
				platformsim.Mutation{Kind: platformsim.AdvisoryEventAdded, UID: a.UID, Event: platformsim.EventAnalysisNotPlanned},
			)
			if err != nil {
				t.Fatal(err)
			}
			r := e.get("/vulnerabilities/v2/advisories/" + a.UID)
			e.mustStatus(r, http.StatusOK)
			evs := r.body["events"].([]any)
			last := evs[len(evs)-1].(map[string]any)
			if str(last, "uid") != m.EventUID {
				t.Fatalf("last event %v, want %s", last, m.EventUID)
			}
			kind, member := onlyMember(t, last)
			if kind != platformsim.EventAnalysisNotPlanned || len(member) != 0 {
				t.Fatalf("member %s = %v, want analysisNotPlanned as {}", kind, member)
			}
			for _, k := range []string{"reviewer", "findings", "issue"} {
				if _, ok := last[k]; ok {
					t.Fatalf("zero field %s present: %v", k, last)
				}
			}
			if !fractionRE.MatchString(str(last, "createTime")) || str(last, "reviewState") != platformsim.ReviewApproved {
				t.Fatalf("event %v", last)
			}
			if _, ok := r.body[platformsim.FutureField]; !ok {
				t.Fatalf("no unknown field on the advisory: %s", r.raw)
			}
		}},
	})
}

func TestAdvisoryFilters(t *testing.T) {
	runCases(t, []testCase{
		{name: "Advisory_FiltersOfTheProto", run: func(t *testing.T, e *env) {
			truth := e.sim.Truth().Advisories
			list := func(q url.Values) []string {
				var uids []string
				for _, x := range e.listAll("/vulnerabilities/v2/advisories", q, "advisories") {
					uids = append(uids, str(x, "uid"))
				}
				return uids
			}
			want := func(keep func(platformsim.TruthAdvisory) bool) []string {
				var uids []string
				for _, a := range truth {
					if keep(a) {
						uids = append(uids, a.UID)
					}
				}
				return uids
			}
			a := truth[0]
			latest := func(x platformsim.TruthAdvisory) string {
				for i := len(x.Events) - 1; i >= 0; i-- {
					if x.Events[i].ReviewState == platformsim.ReviewApproved {
						return x.Events[i].Kind
					}
				}
				return ""
			}
			hasKind := func(x platformsim.TruthAdvisory, k string) bool {
				return slices.ContainsFunc(x.Events, func(e platformsim.TruthAdvisoryEvent) bool { return e.Kind == k })
			}
			cases := []struct {
				q    url.Values
				keep func(platformsim.TruthAdvisory) bool
			}{
				{
					url.Values{"aliases": {a.Aliases[0]}},
					func(x platformsim.TruthAdvisory) bool { return slices.Contains(x.Aliases, a.Aliases[0]) },
				},
				{
					url.Values{"component_names": {a.ComponentName}},
					func(x platformsim.TruthAdvisory) bool { return x.ComponentName == a.ComponentName },
				},
				{
					url.Values{"artifactTypes": {"image"}},
					func(x platformsim.TruthAdvisory) bool { return x.ArtifactType == "image" },
				},
				{
					url.Values{"event_types": {"EVENT_TYPE_FILTER_FIXED"}},
					func(x platformsim.TruthAdvisory) bool { return hasKind(x, platformsim.EventFixed) },
				},
				{
					url.Values{"eventTypes": {"4"}},
					func(x platformsim.TruthAdvisory) bool { return hasKind(x, platformsim.EventFalsePositive) },
				},
				{
					url.Values{"latest_event_type": {"EVENT_TYPE_FILTER_DETECTION"}},
					func(x platformsim.TruthAdvisory) bool { return latest(x) == platformsim.EventDetection },
				},
				{url.Values{"query": {strings.ToUpper(a.ComponentName[:4])}}, func(x platformsim.TruthAdvisory) bool {
					return strings.Contains(x.ComponentName, a.ComponentName[:4]) ||
						strings.Contains(x.ArtifactName, a.ComponentName[:4]) ||
						slices.ContainsFunc(
							x.Aliases,
							func(s string) bool { return strings.Contains(s, strings.ToUpper(a.ComponentName[:4])) },
						)
				}},
			}
			for _, c := range cases {
				got, w := list(c.q), want(c.keep)
				if len(w) == 0 || len(w) == len(truth) && c.q.Has("latest_event_type") {
					t.Fatalf("%v: the population has %d matches of %d; the case tests nothing", c.q, len(w), len(truth))
				}
				if !slices.Equal(got, w) {
					t.Fatalf("%v: listed %v, want %v", c.q, got, w)
				}
			}
			r := e.get("/vulnerabilities/v2/advisories?event_types=EVENT_TYPE_FILTER_NOPE")
			e.mustStatus(r, http.StatusBadRequest)
		}},
	})
}

func TestAdvisoryLifecycle(t *testing.T) {
	runCases(t, []testCase{
		{name: "Advisory_EveryKindOfStep", run: func(t *testing.T, e *env) {
			a := e.sim.Truth().Advisories[1]
			before := len(a.Events)
			for i, kind := range platformsim.EventKinds() {
				e.sim.Advance(time.Minute)
				m, err := e.sim.Apply(
					platformsim.Mutation{
						Kind:    platformsim.AdvisoryEventAdded,
						UID:     a.UID,
						Event:   kind,
						Version: "9.9." + string(rune('0'+i)),
					},
				)
				if err != nil {
					t.Fatal(err)
				}
				if m.EventUID == "" || m.Name != a.ArtifactName {
					t.Fatalf("mutation %+v", m)
				}
			}
			got := e.sim.Truth().Advisories[1]
			if len(got.Events) != before+len(platformsim.EventKinds()) {
				t.Fatalf("events %d, want %d", len(got.Events), before+len(platformsim.EventKinds()))
			}
			for i, kind := range platformsim.EventKinds() {
				ev := got.Events[before+i]
				if ev.Kind != kind || ev.ReviewState != platformsim.ReviewApproved ||
					!got.UpdateTime.Equal(got.Events[len(got.Events)-1].CreateTime) {
					t.Fatalf("event %d: %+v", i, ev)
				}
				switch kind {
				case platformsim.EventFixed:
					if ev.FixedVersion != "9.9.1" {
						t.Fatalf("fixed at %q", ev.FixedVersion)
					}
				case platformsim.EventPatched:
					if !slices.Equal(ev.PatchedVersions, []string{"9.9.7"}) {
						t.Fatalf("patched %v", ev.PatchedVersions)
					}
				case platformsim.EventFalsePositive:
					if !strings.HasPrefix(ev.FalsePositiveType, "TYPE_") {
						t.Fatalf("false positive type %q", ev.FalsePositiveType)
					}
				}
			}
			if _, err := e.sim.Apply(
				platformsim.Mutation{Kind: platformsim.AdvisoryEventAdded, UID: a.UID, Event: "reopened"},
			); err == nil {
				t.Fatal("an unknown kind was added")
			}
		}},
		{name: "Advisory_ReviewThenApproval", run: func(t *testing.T, e *env) {
			a := e.sim.Truth().Advisories[2]
			if _, err := e.sim.Apply(
				platformsim.Mutation{Kind: platformsim.AdvisoryEventAdded, UID: a.UID, Event: platformsim.EventFixed,
					Review: platformsim.ReviewPending},
			); err != nil {
				t.Fatal(err)
			}
			q := url.Values{"eventReviewStates": {platformsim.ReviewPending}, "aliases": a.Aliases[:1]}
			if got := e.listAll("/vulnerabilities/v2/advisories", q, "advisories"); !slices.ContainsFunc(
				got,
				func(x map[string]any) bool { return str(x, "uid") == a.UID },
			) {
				t.Fatalf("the pending advisory is not listed by its review state")
			}
			if _, err := e.sim.Apply(platformsim.Mutation{Kind: platformsim.AdvisoryReviewed, UID: a.UID}); err != nil {
				t.Fatal(err)
			}
			last := e.sim.Truth().Advisories[2].Events
			if ev := last[len(last)-1]; ev.ReviewState != platformsim.ReviewApproved || ev.Reviewer == "" ||
				ev.Kind != platformsim.EventFixed {
				t.Fatalf("after review: %+v", ev)
			}
			if _, err := e.sim.Apply(platformsim.Mutation{Kind: platformsim.AdvisoryReviewed, UID: a.UID}); err == nil {
				t.Fatal("approved an approved event")
			}
		}},
		{name: "Advisory_WithdrawnTakesNoSteps", run: func(t *testing.T, e *env) {
			a := e.sim.Truth().Advisories[3]
			e.mustStatus(
				e.do(http.MethodPost, "/_sim/mutations", "", map[string]any{"kind": "advisory.withdrawn", "uid": a.UID}),
				http.StatusOK,
			)
			if _, err := e.sim.Apply(
				platformsim.Mutation{Kind: platformsim.AdvisoryEventAdded, UID: a.UID, Event: platformsim.EventFixed},
			); err == nil {
				t.Fatal("a withdrawn advisory took a step")
			}
		}},
		{name: "Advisory_ScenarioMovesLifecycles", opts: strict, run: func(t *testing.T, e *env) {
			e.sim.SetRates(platformsim.Rates{CreateAdvisory: 1, AdvanceAdvisory: 6, WithdrawAdvisory: 1})
			kinds, steps := map[platformsim.MutationKind]int{}, map[string]int{}
			for range 20 {
				e.sim.Advance(time.Minute)
				for _, m := range e.sim.Step(10) {
					kinds[m.Kind]++
					if m.Kind == platformsim.AdvisoryEventAdded {
						steps[m.Event]++
					}
				}
			}
			if kinds[platformsim.AdvisoryEventAdded] < 50 || kinds[platformsim.AdvisoryCreated] == 0 ||
				kinds[platformsim.AdvisoryWithdrawn] == 0 ||
				steps[platformsim.EventFixed] == 0 ||
				steps[platformsim.EventFalsePositive] == 0 {
				t.Fatalf("mutations %v, steps %v", kinds, steps)
			}
			// Every lifecycle in the truth is ordered and begins with its detection.
			for _, a := range e.sim.Truth().Advisories {
				if a.Events[0].Kind != platformsim.EventDetection {
					t.Fatalf("advisory %s begins with %s", a.UID, a.Events[0].Kind)
				}
				for i := 1; i < len(a.Events); i++ {
					if a.Events[i].CreateTime.Before(a.Events[i-1].CreateTime) {
						t.Fatalf("advisory %s: events out of order", a.UID)
					}
				}
			}
		}},
	})
}
