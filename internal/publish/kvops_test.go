package publish

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// Events' data as BenchmarkSyncd's organization has them.
const (
	sampleAdvisoryData = `{"before":null,"after":{"uid":"001e52175e0efd461a27f0e769db2357","advisoryId":"CGA-cwrj-pf87-3892","artifactName":"mariadb","createTime":"2026-02-04T15:51:48.983Z","updateTime":"2026-11-03T02:18:11.66Z","author":"advisories@chainguard.dev","artifactType":"apk","artifactArchitecture":"aarch64","componentName":"zlib","componentLocation":"/usr/lib/libz.so.1","componentType":"apk","aliases":["CVE-2022-11620","GHSA-6vgr-mfv6-24g3"],"severities":[{"type":"TYPE_CVSS_V3","score":"CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:C/C:L/I:L/A:N"}],"events":[{"uid":"001e52175e0efd461a27f0e769db2357/a71f6972d1696178","type":"detected","createTime":"2026-02-04T15:51:48.983Z","author":"scanner@chainguard.dev","reviewState":"REVIEW_STATE_APPROVED","detectionType":"scanv1","findings":"eyJtYXRjaGVyIjoiYXBrLW1hdGNoZXIiLCJwYWNrYWdlIjoiemxpYiIsInZ1bG5lcmFiaWxpdHkiOiJDVkUtMjAyMi0xMTYyMCJ9","details":{"scanv1":{"artifactVersion":"3.7.6-r3","component":"zlib","componentId":"884fffaca5eef241","componentLocation":"/usr/lib/libz.so.1","componentType":"apk","componentVersion":"0.15.13","grypeDbBuilt":"2026-02-04T00:00:00Z","grypeDbChecksum":"sha256:0fc1db14eb4ac6b7","scanner":"grype","scannerVersion":"0.87.0","subpackage":"mariadb"}}}]}}`
	sampleTagData      = `{"before":null,"after":{"uid":"org1/00c13eb4a8ee24f1/002cfa7ff2778348","repoUid":"org1/00c13eb4a8ee24f1","repo":"mongodb","path":"mongodb","name":"1.2.0-dev","digest":"sha256:d3340c62bc85851f18d7e422cd9e546e512b2632fe5fc43097b9ac2d3e18737c","deprecated":false,"createTime":"2026-11-22T02:08:35.189Z","updateTime":"2026-11-26T07:49:42.743Z"}}`
	sampleRepoData     = `{"before":null,"after":{"uid":"org1/00c13eb4a8ee24f1","name":"mongodb","path":"mongodb","description":"Minimal image for mongodb","catalogTier":"FIPS","activeTags":["latest","latest-dev","1.0.0","1.0.0-dev","1.0.1"],"createTime":"2026-10-24T16:09:20.73Z","updateTime":"2026-11-20T21:18:00.913Z"}}`
)

func sampleEvents() []store.Event {
	return []store.Event{
		{ID: "a1", Type: "advisory.created", Resource: "advisory", Action: "created", Scope: "mariadb",
			Subject: "001e52175e0efd461a27f0e769db2357", Data: []byte(sampleAdvisoryData)},
		{ID: "t1", Type: "tag.created", Resource: "tag", Action: "created", Scope: "mongodb",
			Subject: "org1/00c13eb4a8ee24f1/002cfa7ff2778348", Data: []byte(sampleTagData)},
		{ID: "r1", Type: "repo.created", Resource: "repo", Action: "created", Scope: "x",
			Subject: "r", Data: []byte(sampleRepoData)},
	}
}

// BenchmarkOpsOf is the KV writer's decoding of an event into its writes.
func BenchmarkOpsOf(b *testing.B) {
	for _, e := range sampleEvents() {
		b.Run(e.Resource, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if _, err := opsOf(e); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// TestOpsOf_NarrowDecodingWritesWhatTheFullStateDoes: the writer decodes
// only the fields a value is made of; for states with every field set
// (and the samples of BenchmarkSyncd's organization) its writes are those
// of the full decoding, byte for byte.
func TestOpsOf_NarrowDecodingWritesWhatTheFullStateDoes(t *testing.T) {
	at := func(hours int) time.Time {
		return time.Date(2026, 11, 2, 3, 4, 5, 6e6, time.UTC).Add(time.Duration(hours) * time.Hour)
	}
	tag := store.Tag{UID: "org/r/t", RepoUID: "org/r", Repo: "nginx", Path: "charts/nginx", Name: "1.27",
		Digest: "sha256:aa", Deprecated: true, Bundles: []string{"b"}, CreateTime: at(0), UpdateTime: at(1)}
	adv := store.Advisory{UID: "u", AdvisoryID: "CGA-1", ArtifactName: "nginx", CreateTime: at(0),
		UpdateTime: at(2), Author: "a", ArtifactType: "apk", ArtifactArchitecture: "x86_64", ComponentName: "zlib",
		ComponentLocation: "/lib", ComponentType: "apk", LegacyAdvisoryID: "L", Aliases: []string{"CVE-1", "GHSA-1"},
		Severities: []store.AdvisorySeverity{{Type: "TYPE_CVSS_V3", Score: "9.8"}},
		Events: []store.AdvisoryEvent{
			{UID: "e1", Type: "detected", CreateTime: at(0), Author: "s", ReviewState: "REVIEW_STATE_APPROVED",
				DetectionType: "scanv1", Findings: "eyJ9", Details: json.RawMessage(`{"scanv1":{"a":1}}`)},
			{UID: "e2", Type: "fixed", CreateTime: at(3), ReviewState: "REVIEW_STATE_APPROVED", FixedVersion: "1.2.3",
				Note: "n", Issue: "i", Reviewer: "r"},
			{UID: "e3", Type: "false_positive", CreateTime: at(4), ReviewState: "REVIEW_STATE_PENDING"},
		}}
	moved := tag
	moved.Name, moved.Path = "1.28", "other"
	var evs []store.Event
	for _, c := range []struct {
		resource, action string
		before, after    any
	}{
		{"tag", "created", nil, tag},
		{"tag", "renamed", tag, moved},
		{"tag", "deleted", tag, nil},
		{"advisory", "created", nil, adv},
		{"advisory", "withdrawn", adv, nil},
	} {
		data, err := json.Marshal(map[string]any{"before": c.before, "after": c.after})
		if err != nil {
			t.Fatal(err)
		}
		evs = append(evs, store.Event{ID: c.resource + c.action, Type: c.resource + "." + c.action,
			Resource: c.resource, Action: c.action, Scope: "charts/nginx", Subject: "s", Data: data})
	}
	evs = append(evs, sampleEvents()...)
	for _, e := range evs {
		got, err := opsOf(e)
		if err != nil {
			t.Fatalf("%s: %v", e.Type, err)
		}
		want, err := opsOfFullState(e)
		if err != nil {
			t.Fatalf("%s, full state: %v", e.Type, err)
		}
		if !reflect.DeepEqual(got, want) {
			t.Errorf("%s: writes %+v, the full state's %+v", e.Type, got, want)
		}
		if len(got) == 0 {
			t.Errorf("%s: no writes", e.Type)
		}
	}
}

// opsOfFullState is opsOf decoding the whole state, as it did before it
// decoded only what a value is made of.
func opsOfFullState(e store.Event) ([]kvOp, error) {
	var before, after store.PublishedResource
	switch e.Resource {
	case "tag":
		var d struct{ Before, After *store.Tag }
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return nil, err
		}
		before.Tag, after.Tag = d.Before, d.After
	case "advisory":
		var d struct{ Before, After *store.Advisory }
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return nil, err
		}
		before.Advisory, after.Advisory = d.Before, d.After
	default:
		return opsOf(e)
	}
	return writesOf(e, before, after)
}
