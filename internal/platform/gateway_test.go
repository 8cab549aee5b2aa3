package platform_test

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
)

// gateway answers each path with a fixed body, as the vendor's gateway
// would write it, and records the queries it was sent.
func gateway(t *testing.T, bodies map[string]string) (*httptest.Server, func() []url.Values) {
	var mu sync.Mutex
	var queries []url.Values
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		queries = append(queries, r.URL.Query())
		mu.Unlock()
		body, ok := bodies[r.URL.Path]
		if !ok {
			w.WriteHeader(http.StatusNotFound)
			fmt.Fprint(w, `{"code":5,"message":"not found"}`)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, func() []url.Values {
		mu.Lock()
		defer mu.Unlock()
		return append([]url.Values(nil), queries...)
	}
}

func TestListQuery_TagFamiliesAndFiltersOnTheWire(t *testing.T) {
	srv, queries := gateway(t, map[string]string{"/registry/v2/tags": `{}`})
	c := plainClient(t, srv, nil)
	since := time.Date(2025, 3, 1, 13, 4, 5, 120000000, time.FixedZone("CET", 3600))
	for _, q := range []platform.ListQuery{
		{ChildrenOf: "org1/repo1"},
		{ChildrenOf: "org1/repo1", IncludeReferrers: true, IncludeDates: true, IncludeEpochs: true,
			UpdatedSince: since, Digest: digest(7)},
		{ChildrenOf: "org1/repo1", IncludeDates: true},
	} {
		if _, err := c.Tags(q).Collect(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
	got := queries()
	if len(got) != 3 {
		t.Fatalf("%d requests, want 3", len(got))
	}
	for _, k := range []string{"include_referrers", "include_dates", "include_epochs", "updated_since", "digest"} {
		if got[0].Has(k) {
			t.Errorf("plain listing sent %s=%q; zero values are left out", k, got[0].Get(k))
		}
	}
	want := map[string]string{"include_referrers": "true", "include_dates": "true", "include_epochs": "true",
		"updated_since": "2025-03-01T12:04:05.12Z", "digest": digest(7), "uidp.children_of": "org1/repo1"}
	for k, v := range want {
		if got[1].Get(k) != v {
			t.Errorf("%s = %q, want %q", k, got[1].Get(k), v)
		}
	}
	if got[2].Get("include_dates") != "true" || got[2].Has("include_epochs") || got[2].Has("include_referrers") {
		t.Errorf("one family asked: %v", got[2])
	}
}

func TestDecode_GatewayTolerance(t *testing.T) {
	// Timestamps with 0, 3, 6 and 9 fractional digits; zero values left
	// out; unknown fields; totalCount as a string.
	tags := []string{
		`{"uid":"org1/r1/t0","name":"latest","digest":"sha256:aa","updateTime":"2025-03-01T12:00:01Z","futureField":{"a":[1,2]}}`,
		`{"uid":"org1/r1/t3","name":"1.2-20250301","digest":"sha256:bb","updateTime":"2025-03-01T12:00:01.123Z","deprecated":true}`,
		`{"uid":"org1/r1/t6","name":"1.2-r3","digest":"sha256:cc","updateTime":"2025-03-01T12:00:01.123456Z","bundles":["fips"]}`,
		`{"uid":"org1/r1/t9", "name":"sha256-dd.sig","updateTime":"2025-03-01T12:00:01.123456789Z"}`,
	}
	wantTimes := []time.Time{
		time.Date(2025, 3, 1, 12, 0, 1, 0, time.UTC),
		time.Date(2025, 3, 1, 12, 0, 1, 123000000, time.UTC),
		time.Date(2025, 3, 1, 12, 0, 1, 123456000, time.UTC),
		time.Date(2025, 3, 1, 12, 0, 1, 123456789, time.UTC),
	}
	repo := `{"uid":"org1/r1","name":"cert-manager","catalogTier":"APPLICATION","sync_config":{"source":"org0/r9","uniqueTags":true},"customOverlay":{},"createTime":"2024-01-02T03:04:05.6Z"}`
	advisories := []string{
		`{"uid":"org1/a1","advisoryId":"CGA-1234","artifactName":"nginx","updateTime":"2025-03-01T12:00:00Z","aliases":["CVE-2024-1","GHSA-x"],"severities":[{"type":"TYPE_CVSS_V3","score":"7.5"}],"events":[{"uid":"e1","fixed":{"fixedVersion":"1.2"}}]}`,
		`{"uid":"org1/a2","advisoryId":"CGA-5678","artifactName":"curl","deleteTime":"2025-03-02T00:00:00.5Z","componentName":"libcurl"}`,
	}
	srv, _ := gateway(t, map[string]string{
		"/registry/v2/tags": `{"tags":[` + strings.Join(
			tags,
			",\n  ",
		) + `],"totalCount":"4","skipped":0,"unknown":true}`,
		"/registry/v2/tags/org1/r1/t3":           tags[1],
		"/registry/v2/repos":                     `{"repos":[` + repo + `]}`,
		"/registry/v2/repos/org1/r1":             repo,
		"/vulnerabilities/v2/advisories":         `{"advisories":[` + strings.Join(advisories, ",") + `],"nextPageToken":""}`,
		"/vulnerabilities/v2/advisories/org1/a2": advisories[1],
	})
	c := plainClient(t, srv, nil)
	ctx := ctxT(t)

	l := c.Tags(platform.ListQuery{ChildrenOf: "org1/r1"})
	got, err := l.Collect(ctx)
	if err != nil {
		t.Fatalf("list tags: %v", err)
	}
	if len(got) != 4 || l.Total() != 4 {
		t.Fatalf("%d tags, total %d; want 4 and 4", len(got), l.Total())
	}
	for i, tg := range got {
		if !tg.UpdateTime.Equal(wantTimes[i]) {
			t.Errorf(
				"tag %s updateTime = %s, want %s",
				tg.UID,
				tg.UpdateTime.Format(time.RFC3339Nano),
				wantTimes[i].Format(time.RFC3339Nano),
			)
		}
		if string(tg.Raw) != tags[i] {
			t.Errorf("tag %s Raw = %s, want %s", tg.UID, tg.Raw, tags[i])
		}
	}
	if !got[1].Deprecated || got[0].Deprecated || got[3].Digest != "" || len(got[2].Bundles) != 1 {
		t.Errorf("absent zero values or fields misread: %+v", got)
	}
	tg, err := c.GetTag(ctx, "org1/r1/t3")
	if err != nil || string(tg.Raw) != tags[1] || tg.Name != "1.2-20250301" {
		t.Errorf("GetTag = %+v (raw %s), %v", tg, tg.Raw, err)
	}

	repos, err := c.Repos(platform.ListQuery{}).Collect(ctx)
	if err != nil || len(repos) != 1 || string(repos[0].Raw) != repo || repos[0].CatalogTier != "APPLICATION" {
		t.Errorf("list repos = %+v, %v", repos, err)
	}
	r, err := c.GetRepo(ctx, "org1/r1")
	if err != nil || string(r.Raw) != repo || !r.CreateTime.Equal(time.Date(2024, 1, 2, 3, 4, 5, 600000000, time.UTC)) {
		t.Errorf("GetRepo = %+v (raw %s), %v", r, r.Raw, err)
	}

	advs, err := c.Advisories(platform.ListQuery{}).Collect(ctx)
	if err != nil || len(advs) != 2 {
		t.Fatalf("list advisories = %+v, %v", advs, err)
	}
	if a := advs[0]; a.Withdrawn() || len(a.Aliases) != 2 || len(a.Severities) != 1 || a.Severities[0].Score != "7.5" ||
		string(a.Raw) != advisories[0] {
		t.Errorf("advisory 0 = %+v", a)
	}
	if a := advs[1]; !a.Withdrawn() || !a.DeleteTime.Equal(time.Date(2025, 3, 2, 0, 0, 0, 500000000, time.UTC)) ||
		a.ComponentName != "libcurl" {
		t.Errorf("advisory 1 = %+v, want it withdrawn", a)
	}
	a, err := c.GetAdvisory(ctx, "org1/a2")
	if err != nil || !a.Withdrawn() || string(a.Raw) != advisories[1] {
		t.Errorf("GetAdvisory = %+v, %v", a, err)
	}
	// Raw is the item's own: appending to it does not touch the next one.
	before := string(got[1].Raw)
	_ = append(got[0].Raw, 'x')
	if string(got[1].Raw) != before {
		t.Error("appending to one item's Raw overwrote the next")
	}
}

func TestGroups_ListAndGet(t *testing.T) {
	group := `{"uid":"org1/g1","name":"charts","description":"Helm charts","resourceLimits":{"repos":10},"createTime":"2024-05-06T07:08:09.123456Z","kind":"ORG_KIND_CUSTOMER"}`
	srv, queries := gateway(t, map[string]string{
		"/iam/v2/groups":         `{"groups":[` + group + `,{"uid":"org1/g2","name":"team"}],"totalCount":"2"}`,
		"/iam/v2/groups/org1/g1": group,
	})
	c := plainClient(t, srv, nil)
	gs, err := c.Groups(platform.ListQuery{DescendantsOf: "org1"}).Collect(ctxT(t))
	if err != nil || len(gs) != 2 || gs[0].Name != "charts" || gs[1].Name != "team" || gs[0].Description != "Helm charts" {
		t.Fatalf("Groups = %+v, %v", gs, err)
	}
	if q := queries()[0]; q.Get("uidp.descendants_of") != "org1" {
		t.Errorf("query %v", q)
	}
	g, err := c.GetGroup(ctxT(t), "org1/g1")
	if err != nil || g.UID != "org1/g1" || !g.CreateTime.Equal(time.Date(2024, 5, 6, 7, 8, 9, 123456000, time.UTC)) {
		t.Errorf("GetGroup = %+v, %v", g, err)
	}
	if _, err := c.GetGroup(ctxT(t), "org1/none"); !platform.IsNotFound(err) {
		t.Errorf("GetGroup of a missing group: %v", err)
	}
}
