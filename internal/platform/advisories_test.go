package platform_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
)

// TestAdvisory_LifecycleAsTheGatewayRendersIt decodes an advisory whose
// events hold each kind of the proto's oneof, as protojson renders it (one
// member per event, empty messages as {}, zero values left out), and a kind
// added upstream that this client does not know.
func TestAdvisory_LifecycleAsTheGatewayRendersIt(t *testing.T) {
	const body = `{"uid":"org1/a1","advisoryId":"CGA-2x4h-9q7m-p3vw","createTime":"2026-03-02T09:30:00Z",
	"updateTime":"2026-03-04T17:05:00.123456Z",
	"author":"scanner@example.dev","artifactName":"openssl","artifactType":"apk","artifactArchitecture":"x86_64",
	"componentName":"libssl3","componentLocation":"/usr/lib/libssl.so.3","componentType":"apk",
	"aliases":["CVE-2026-0001","GHSA-aaaa-bbbb-cccc"],"legacyAdvisoryId":"CGA-old1",
	"severities":[{"type":"TYPE_CVSS_V3","score":"CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H"}],
	"events":[
	 {"uid":"org1/a1/e1","createTime":"2026-03-02T09:30:00Z","author":"scanner@example.dev","reviewState":"REVIEW_STATE_APPROVED","findings":"eyJhIjoxfQ==",
	  "detection":{"scanv1":{"scanner":"grype","componentVersion":"3.0.1-r0"}}},
	 {"uid":"org1/a1/e2","detection":{"manual":{}}},
	 {"uid":"org1/a1/e3","truePositiveDetermination":{"note":"reachable"}},
	 {"uid":"org1/a1/e4","pendingUpstreamFix":{}},
	 {"uid":"org1/a1/e5","fixNotPlanned":{"note":"eol"}},
	 {"uid":"org1/a1/e6","analysisNotPlanned":{"note":"later"}},
	 {"uid":"org1/a1/e7","falsePositiveDetermination":{"type":"TYPE_COMPONENT_VULNERABILITY_MISMATCH","note":"not ours"}},
	 {"uid":"org1/a1/e8","patched":{"patchedVersions":["3.0.1-r1","3.0.1-r2"]}},
	 {"uid":"org1/a1/e9","createTime":"2026-03-04T17:05:00.123456Z","reviewer":"lead@example.dev","reviewState":"REVIEW_STATE_PENDING","issue":"cve-dashboard#12",
	  "fixed":{"fixedVersion":"3.0.2-r0","note":"upstream release"}},
	 {"uid":"org1/a1/e10","reopened":{"reason":"regression","type":7},"simFutureField":"x"}
	]}`
	var a platform.Advisory
	if err := json.Unmarshal([]byte(body), &a); err != nil {
		t.Fatal(err)
	}
	if a.ArtifactType != "apk" || a.ComponentLocation != "/usr/lib/libssl.so.3" || a.LegacyAdvisoryID != "CGA-old1" ||
		len(a.Aliases) != 2 || len(a.Severities) != 1 || a.Severities[0].Type != "TYPE_CVSS_V3" {
		t.Fatalf("scalar fields misread: %+v", a)
	}
	type want struct{ kind, note, fixed, fpType, detection string }
	wants := []want{
		{kind: platform.KindDetection, detection: "scanv1"},
		{kind: platform.KindDetection, detection: "manual"},
		{kind: platform.KindTruePositiveDetermination, note: "reachable"},
		{kind: platform.KindPendingUpstreamFix},
		{kind: platform.KindFixNotPlanned, note: "eol"},
		{kind: platform.KindAnalysisNotPlanned, note: "later"},
		{kind: platform.KindFalsePositiveDetermination, note: "not ours", fpType: "TYPE_COMPONENT_VULNERABILITY_MISMATCH"},
		{kind: platform.KindPatched},
		{kind: platform.KindFixed, note: "upstream release", fixed: "3.0.2-r0"},
		{kind: "reopened"},
	}
	if len(a.Events) != len(wants) {
		t.Fatalf("%d events, want %d", len(a.Events), len(wants))
	}
	for i, w := range wants {
		e := a.Events[i]
		got := want{e.Kind, e.Note, e.FixedVersion, e.FalsePositiveType, e.DetectionType}
		if got != w {
			t.Errorf("event %s: %+v, want %+v", e.UID, got, w)
		}
		if len(e.Details) == 0 || e.Details[0] != '{' {
			t.Errorf("event %s: details %q, want the member's object", e.UID, e.Details)
		}
	}
	first, fixed := a.Events[0], a.Events[8]
	if first.Findings != "eyJhIjoxfQ==" || first.ReviewState != "REVIEW_STATE_APPROVED" ||
		!first.CreateTime.Equal(time.Date(2026, 3, 2, 9, 30, 0, 0, time.UTC)) {
		t.Errorf("detection common fields: %+v", first)
	}
	if fixed.Reviewer != "lead@example.dev" || fixed.Issue != "cve-dashboard#12" ||
		fixed.CreateTime.Nanosecond() != 123456000 {
		t.Errorf("fixed common fields: %+v", fixed)
	}
	if got := a.Events[7].PatchedVersions; !slices.Equal(got, []string{"3.0.1-r1", "3.0.1-r2"}) {
		t.Errorf("patched versions %v", got)
	}
	if string(a.Events[9].Details) != `{"reason":"regression","type":7}` {
		t.Errorf("unknown kind's details %s", a.Events[9].Details)
	}

	t.Run("KnownKindOfWrongShapeFails", func(t *testing.T) {
		var e platform.AdvisoryEvent
		if err := json.Unmarshal([]byte(`{"uid":"e","fixed":{"fixedVersion":3}}`), &e); err == nil {
			t.Fatal("a fixed version that is a number decoded")
		}
	})
	t.Run("NoKind", func(t *testing.T) {
		var e platform.AdvisoryEvent
		if err := json.Unmarshal([]byte(`{"uid":"e","fixed":null,"author":"a"}`), &e); err != nil || e.Kind != "" ||
			e.Details != nil ||
			e.Author != "a" {
			t.Fatalf("event %+v, %v: want no kind", e, err)
		}
	})
}

func TestAdvisoryFilter_OnTheWire(t *testing.T) {
	srv, queries := gateway(t, map[string]string{"/vulnerabilities/v2/advisories": `{}`})
	c := plainClient(t, srv, nil)
	f := platform.AdvisoryFilter{ArtifactNames: []string{"openssl", "curl"}, Aliases: []string{"CVE-2026-0001"},
		EventTypes: []string{"EVENT_TYPE_FILTER_FIXED"}, LatestEventType: "EVENT_TYPE_FILTER_DETECTION"}
	if _, err := c.Advisories(f.Query(platform.ListQuery{PageSize: 10})).Collect(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	q := queries()[0]
	if !slices.Equal(q["artifact_names"], []string{"openssl", "curl"}) || q.Get("aliases") != "CVE-2026-0001" ||
		q.Get("event_types") != "EVENT_TYPE_FILTER_FIXED" || q.Get("latest_event_type") != "EVENT_TYPE_FILTER_DETECTION" ||
		q.Get("page_size") != "10" || q.Has("advisory_ids") {
		t.Fatalf("query %v", q)
	}
}
