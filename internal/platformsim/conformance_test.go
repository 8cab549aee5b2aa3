package platformsim_test

import (
	"crypto"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
)

// The conformance suite: one case per numbered rule and per error case of
// platform-api-v2.md (and the upstream facts it defers to), each run over
// real HTTP against its own simulator.

func TestListRules(t *testing.T) {
	runCases(t, []testCase{
		{name: "ListRule1_AbsentTokenMeansLastPage", run: func(t *testing.T, e *env) {
			truth := e.sim.Truth()
			got := e.listAll("/registry/v2/repos", url.Values{"page_size": {"5"}}, "repos")
			if len(got) != len(truth.Repos) {
				t.Fatalf("listed %d repos, want %d", len(got), len(truth.Repos))
			}
			// An exact multiple of the page size ends without a token.
			r := e.get("/registry/v2/repos?page_size=" + strconv.Itoa(len(truth.Repos)))
			if _, ok := r.body["nextPageToken"]; ok {
				t.Fatalf("nextPageToken present on the last page: %s", r.raw)
			}
		}},
		{name: "ListRule2_SortOrderKeptAcrossPages", run: func(t *testing.T, e *env) {
			for _, c := range []struct {
				order, key string
				desc       bool
			}{
				{"name", "name", false}, {"name desc", "name", true}, {"uid", "uid", false},
				{"created_at desc", "createTime", true}, {"create_time", "createTime", false},
				{"update_time", "updateTime", false},
			} {
				got := e.listAll("/registry/v2/repos", url.Values{"page_size": {"4"}, "order_by": {c.order}}, "repos")
				for i := 1; i < len(got); i++ {
					a, b := str(got[i-1], c.key), str(got[i], c.key)
					if (!c.desc && a > b) || (c.desc && a < b) {
						t.Fatalf("order %q broken at %d: %q then %q", c.order, i, a, b)
					}
				}
			}
		}},
		{name: "ListRule2_KeysetSurvivesInsertsAndDeletes", run: func(t *testing.T, e *env) {
			first := e.get("/registry/v2/repos?page_size=4&order_by=name")
			seen := map[string]bool{}
			for _, r := range items(first, "repos") {
				seen[str(r, "uid")] = true
			}
			// Delete a repo already returned and create one sorting first:
			// an offset cursor would now skip an item.
			e.mustStatus(
				e.do(http.MethodDelete, "/registry/v2/repos/"+str(items(first, "repos")[0], "uid"), testToken, nil),
				http.StatusOK,
			)
			e.mustStatus(
				e.do(http.MethodPost, "/registry/v2/repos/org1", testToken, map[string]any{"name": "aaa-new"}),
				http.StatusOK,
			)
			q := url.Values{"page_size": {"4"}, "order_by": {"name"}, "page_token": {str(first.body, "nextPageToken")}}
			rest := e.listAll("/registry/v2/repos", q, "repos")
			truth := e.sim.Truth()
			want := 0
			for _, r := range truth.Repos {
				if !seen[r.UID] && r.Name != "aaa-new" {
					want++
				}
			}
			if len(rest) != want {
				t.Fatalf("continued listing returned %d repos, want %d", len(rest), want)
			}
		}},
		{name: "ListRule2_AChangeBetweenPagesIsSeen", run: func(t *testing.T, e *env) {
			// The listing's ranking is kept between pages while nothing
			// changes: a tag moved after the first page sorts after the
			// cursor by update time, and the pages after it show it.
			q := url.Values{"page_size": {"3"}, "order_by": {"update_time"}}
			first := e.get("/registry/v2/tags?" + q.Encode())
			e.mustStatus(first, http.StatusOK)
			moved := str(items(first, "tags")[0], "uid")
			e.sim.Advance(time.Second)
			if err := e.sim.MoveTag(moved, "sha256:"+strings.Repeat("ab", 32)); err != nil {
				t.Fatal(err)
			}
			q.Set("page_token", str(first.body, "nextPageToken"))
			rest := e.listAll("/registry/v2/tags", q, "tags")
			if len(rest) == 0 || str(rest[len(rest)-1], "uid") != moved {
				t.Fatalf("the pages after the move do not end with the moved tag %s", moved)
			}
		}},
		{name: "ListRule3_SkippedEchoesSkip", run: func(t *testing.T, e *env) {
			all := e.listAll("/registry/v2/repos", url.Values{}, "repos")
			r := e.get("/registry/v2/repos?skip=3&page_size=2")
			e.mustStatus(r, http.StatusOK)
			if got, want := r.body["skipped"], float64(3); got != want {
				t.Fatalf("skipped=%v, want %v", got, want)
			}
			if a, b := str(items(r, "repos")[0], "uid"), str(all[3], "uid"); a != b {
				t.Fatalf("skip=3 started at %s, want %s", a, b)
			}
		}},
		{name: "ListRule4_ExpiredTokenRestarts", run: func(t *testing.T, e *env) {
			first := e.get("/registry/v2/repos?page_size=3")
			tok := str(first.body, "nextPageToken")
			e.sim.Advance(72*time.Hour + time.Minute)
			r := e.get("/registry/v2/repos?page_size=3&page_token=" + url.QueryEscape(tok))
			e.mustStatus(r, http.StatusOK)
			if a, b := str(items(r, "repos")[0], "uid"), str(items(first, "repos")[0], "uid"); a != b {
				t.Fatalf("expired token continued at %s, want restart at %s", a, b)
			}
		}},
		{name: "ListRule4_TokenValidWithinThreeDays", run: func(t *testing.T, e *env) {
			first := e.get("/registry/v2/repos?page_size=3")
			e.sim.Advance(72*time.Hour - time.Minute)
			r := e.get("/registry/v2/repos?page_size=3&page_token=" + url.QueryEscape(str(first.body, "nextPageToken")))
			e.mustStatus(r, http.StatusOK)
			if a, b := str(items(r, "repos")[0], "uid"), str(items(first, "repos")[0], "uid"); a == b {
				t.Fatalf("token younger than 3 days restarted the listing")
			}
		}},
		{name: "ListRule5_DefaultOrderUIDAscending", run: func(t *testing.T, e *env) {
			got := e.listAll("/registry/v2/tags", url.Values{"page_size": {"7"}}, "tags")
			uids := make([]string, len(got))
			for i, g := range got {
				uids[i] = str(g, "uid")
			}
			if !slices.IsSorted(uids) {
				t.Fatalf("default order is not uid asc")
			}
		}},
		{
			name:  "ListParam_PageSizeDefault50",
			scale: &platformsim.Scale{Repos: 60, TagsPerRepo: 1, HistoryPerTag: 1},
			run: func(t *testing.T, e *env) {
				if got := len(items(e.get("/registry/v2/repos"), "repos")); got != 50 {
					t.Fatalf("default page=%d items, want 50", got)
				}
			},
		},
		{
			name:  "ListParam_PageSizeAbove200Coerced",
			scale: &platformsim.Scale{Repos: 30, TagsPerRepo: 10, HistoryPerTag: 1},
			run: func(t *testing.T, e *env) {
				r := e.get("/registry/v2/tags?page_size=500")
				e.mustStatus(r, http.StatusOK)
				if got := len(items(r, "tags")); got != 200 {
					t.Fatalf("page_size=500 gave %d items, want 200", got)
				}
			},
		},
		{name: "ListParam_PageSizeNegativeRejected", run: func(t *testing.T, e *env) {
			r := e.get("/registry/v2/repos?page_size=-1")
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "page_size")
		}},
		{name: "ListParam_OrderByUnknownRejected", run: func(t *testing.T, e *env) {
			r := e.get("/registry/v2/repos?order_by=" + url.QueryEscape("color desc"))
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "order_by")
		}},
		{name: "ListParam_TotalCountIsString", run: func(t *testing.T, e *env) {
			r := e.get("/registry/v2/repos?page_size=2")
			if got, ok := r.body["totalCount"].(string); !ok || got != strconv.Itoa(len(e.sim.Truth().Repos)) {
				t.Fatalf("totalCount=%#v, want the string %d", r.body["totalCount"], len(e.sim.Truth().Repos))
			}
		}},
		{name: "ListParam_ChildrenOfAndDescendantsOf", run: func(t *testing.T, e *env) {
			tg, _ := e.someTag("")
			tags := e.listAll("/registry/v2/tags", url.Values{"uidp.children_of": {tg.RepoUID}}, "tags")
			if len(tags) != smallScale().TagsPerRepo {
				t.Fatalf("children_of repo gave %d tags, want %d", len(tags), smallScale().TagsPerRepo)
			}
			repos := e.listAll("/registry/v2/repos", url.Values{"uidp.descendants_of": {"org1"}}, "repos")
			if len(repos) != smallScale().Repos {
				t.Fatalf("descendants_of org1 gave %d repos", len(repos))
			}
			all := e.listAll("/registry/v2/tags", url.Values{"uidp.descendants_of": {"org1"}}, "tags")
			if len(all) != smallScale().Repos*smallScale().TagsPerRepo {
				t.Fatalf("descendants_of org1 gave %d tags", len(all))
			}
			if got := len(e.listAll("/registry/v2/tags", url.Values{"uidp.children_of": {"org1"}}, "tags")); got != 0 {
				t.Fatalf("tags are not children of the group, got %d", got)
			}
		}},
		{name: "ListParam_CamelCaseSpellings", run: func(t *testing.T, e *env) {
			tg, _ := e.someTag("")
			snake := e.get("/registry/v2/tags?uidp.children_of=" + tg.RepoUID + "&page_size=2&order_by=name")
			camel := e.get("/registry/v2/tags?uidp.childrenOf=" + tg.RepoUID + "&pageSize=2&orderBy=name")
			if string(snake.raw) != string(camel.raw) {
				t.Fatalf("camelCase answer differs:\n%s\n%s", snake.raw, camel.raw)
			}
		}},
		{name: "ListParam_NameExactMatch", run: func(t *testing.T, e *env) {
			_, repoName := e.someTag("")
			got := items(e.get("/registry/v2/repos?name="+url.QueryEscape(repoName)), "repos")
			if len(got) != 1 || str(got[0], "name") != repoName {
				t.Fatalf("name=%s matched %v", repoName, got)
			}
			if got := items(e.get("/registry/v2/repos?name="+url.QueryEscape(repoName[:2])), "repos"); len(got) != 0 {
				t.Fatalf("prefix matched %d repos", len(got))
			}
		}},
		{name: "ListParam_TagFilters", run: func(t *testing.T, e *env) {
			tg, _ := e.someTag("")
			got := items(e.get("/registry/v2/tags?digest="+url.QueryEscape(tg.Digest)), "tags")
			if len(got) != 1 || str(got[0], "uid") != tg.UID {
				t.Fatalf("digest filter gave %v", got)
			}
			e.sim.Advance(time.Hour)
			since := e.sim.Now().UTC().Format(time.RFC3339Nano)
			if err := e.sim.MoveTag(tg.UID, "sha256:"+strings.Repeat("ab", 32)); err != nil {
				t.Fatal(err)
			}
			got = items(e.get("/registry/v2/tags?updatedSince="+url.QueryEscape(since)), "tags")
			if len(got) != 1 || str(got[0], "uid") != tg.UID {
				t.Fatalf("updated_since gave %d tags, want the moved one", len(got))
			}
		}},
		{name: "ListParam_AdvisoryFilters", run: func(t *testing.T, e *env) {
			truth := e.sim.Truth()
			a, b := truth.Advisories[0], truth.Advisories[1]
			got := items(e.get("/vulnerabilities/v2/advisories?advisoryIds="+a.AdvisoryID+","+b.AdvisoryID), "advisories")
			if len(got) != 2 {
				t.Fatalf("advisoryIds comma list gave %d", len(got))
			}
			got = items(
				e.get("/vulnerabilities/v2/advisories?advisoryIds="+a.AdvisoryID+"&advisoryIds="+b.AdvisoryID),
				"advisories",
			)
			if len(got) != 2 {
				t.Fatalf("advisoryIds repeated gave %d", len(got))
			}
			want := 0
			for _, x := range truth.Advisories {
				if x.ArtifactName == a.ArtifactName {
					want++
				}
			}
			all := e.listAll("/vulnerabilities/v2/advisories", url.Values{"artifactNames": {a.ArtifactName}}, "advisories")
			if len(all) != want {
				t.Fatalf("artifactNames gave %d, want %d", len(all), want)
			}
		}},
		{name: "ListParam_PageTokenGarbageRejected", run: func(t *testing.T, e *env) {
			r := e.get("/registry/v2/repos?page_token=not-a-token")
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "page_token")
		}},
	})
}

// assertBadRequest checks an AIP-193 INVALID_ARGUMENT body naming field.
func assertBadRequest(t *testing.T, r resp, field string) {
	t.Helper()
	if got := r.body["code"]; got != float64(3) {
		t.Fatalf("code=%v, want 3; %s", got, r.raw)
	}
	if ei := detail(r, "ErrorInfo"); ei == nil || str(ei, "reason") != "INVALID_ARGUMENT" || str(ei, "domain") == "" {
		t.Fatalf("ErrorInfo missing or wrong: %s", r.raw)
	}
	br := detail(r, "BadRequest")
	if br == nil {
		t.Fatalf("no BadRequest detail: %s", r.raw)
	}
	vs, _ := br["fieldViolations"].([]any)
	if len(vs) == 0 || str(vs[0].(map[string]any), "field") != field {
		t.Fatalf("fieldViolations=%v, want field %s", vs, field)
	}
	if !strings.HasPrefix(str(r.body, "message"), "Invalid argument: "+field+": ") {
		t.Fatalf("message=%q", str(r.body, "message"))
	}
}

func TestUpdateRules(t *testing.T) {
	patch := func(e *env, uid, mask string, body map[string]any) resp {
		p := "/registry/v2/repos/" + uid
		if mask != "" {
			p += "?updateMask=" + url.QueryEscape(mask)
		}
		return e.do(http.MethodPatch, p, testToken, body)
	}
	runCases(t, []testCase{
		{name: "UpdateRule1_OnlySentFieldsChange", run: func(t *testing.T, e *env) {
			rp := e.sim.Truth().Repos[0]
			before := e.get("/registry/v2/repos/" + rp.UID)
			r := patch(e, rp.UID, "", map[string]any{"description": "new text"})
			e.mustStatus(r, http.StatusOK)
			if str(r.body, "description") != "new text" || str(r.body, "name") != rp.Name ||
				str(r.body, "catalogTier") != str(before.body, "catalogTier") {
				t.Fatalf("patch changed more than description: %s", r.raw)
			}
		}},
		{name: "UpdateRule2_NoMaskUpdatesPresentFields", run: func(t *testing.T, e *env) {
			rp := e.sim.Truth().Repos[0]
			r := patch(e, rp.UID, "", map[string]any{"description": "d2", "name": "renamed"})
			e.mustStatus(r, http.StatusOK)
			if str(r.body, "description") != "d2" || str(r.body, "name") != "renamed" {
				t.Fatalf("fields in body not updated: %s", r.raw)
			}
		}},
		{name: "UpdateRule3_MaskIgnoresOtherBodyFields", run: func(t *testing.T, e *env) {
			rp := e.sim.Truth().Repos[0]
			r := patch(e, rp.UID, "description", map[string]any{"description": "d3", "name": "ignored"})
			e.mustStatus(r, http.StatusOK)
			if str(r.body, "description") != "d3" || str(r.body, "name") != rp.Name {
				t.Fatalf("mask not honoured: %s", r.raw)
			}
		}},
		{name: "UpdateRule4_WildcardReplacesFully", run: func(t *testing.T, e *env) {
			rp := e.sim.Truth().Repos[0]
			r := patch(e, rp.UID, "*", map[string]any{"name": rp.Name, "description": "only"})
			e.mustStatus(r, http.StatusOK)
			if str(r.body, "description") != "only" || str(r.body, "catalogTier") != "" ||
				len(r.body["activeTags"].([]any)) != 0 {
				t.Fatalf("* did not clear absent fields: %s", r.raw)
			}
		}},
		{name: "UpdateRule5_PatternAppliesToIdentities", run: func(t *testing.T, e *env) {
			id := e.do(
				http.MethodPost,
				"/iam/v2/identities/org1",
				testToken,
				map[string]any{"name": "ci bot", "description": "before"},
			)
			e.mustStatus(id, http.StatusOK)
			r := e.do(http.MethodPatch, "/iam/v2/identities/"+str(id.body, "uid")+"?updateMask=description", testToken,
				map[string]any{"description": "after", "name": "ignored"})
			e.mustStatus(r, http.StatusOK)
			if str(r.body, "description") != "after" || str(r.body, "name") != "ci bot" {
				t.Fatalf("identity mask not honoured: %s", r.raw)
			}
		}},
		{name: "UpdateRule_UnknownMaskFieldRejected", run: func(t *testing.T, e *env) {
			rp := e.sim.Truth().Repos[0]
			r := patch(e, rp.UID, "colour", map[string]any{})
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "updateMask")
		}},
	})
}

func TestTagHistoryRules(t *testing.T) {
	heavy := platformsim.Scale{Repos: 2, TagsPerRepo: 3, HistoryPerTag: 3, HeavyTags: 1, HeavyHistory: 2500}
	// movedThrice gives a tag records at three known times, a minute apart.
	movedThrice := func(t *testing.T, e *env) (string, string, []time.Time) {
		tg, repoName := e.someTag("latest")
		var times []time.Time
		for i := range 3 {
			e.sim.Advance(time.Minute)
			times = append(times, e.sim.Now().UTC().Truncate(time.Millisecond))
			if err := e.sim.MoveTag(tg.UID, fmt.Sprintf("sha256:%064x", i+1)); err != nil {
				t.Fatal(err)
			}
		}
		return "acme/" + repoName, tg.Name, times
	}
	window := func(t *testing.T, e *env, inclusive bool) {
		image, tag, times := movedThrice(t, e)
		tok := e.registryToken(image, testToken)
		q := url.Values{"start": {times[0].Format(time.RFC3339Nano)}, "end": {times[2].Format(time.RFC3339Nano)}}
		h := historyOf(e.history(image, tag, tok, q.Encode()))
		want := 1 // only the middle record
		if inclusive {
			want = 3
		}
		if len(h) != want {
			t.Fatalf("window [t0,t2] inclusive=%v gave %d records, want %d", inclusive, len(h), want)
		}
	}
	runCases(t, []testCase{
		{name: "HistoryRule1_PrivateImageUnderOrg", run: func(t *testing.T, e *env) {
			tg, repoName := e.someTag("")
			tok := e.registryToken("acme/"+repoName, testToken)
			r := e.history("acme/"+repoName, tg.Name, tok, "")
			e.mustStatus(r, http.StatusOK)
			h := historyOf(r)
			if len(h) != smallScale().HistoryPerTag || str(h[len(h)-1], "digest") != tg.Digest {
				t.Fatalf("history=%v, want %d records ending at %s", h, smallScale().HistoryPerTag, tg.Digest)
			}
		}},
		{name: "HistoryRule1_ARenamedRepoAtItsNewPathOnly", run: func(t *testing.T, e *env) {
			tg, repoName := e.someTag("")
			tok := e.registryToken("acme/"+repoName, testToken)
			e.mustStatus(e.history("acme/"+repoName, tg.Name, tok, ""), http.StatusOK)
			rename := e.do(http.MethodPatch, "/registry/v2/repos/"+tg.RepoUID+"?updateMask=name", testToken,
				map[string]any{"name": "renamed"})
			e.mustStatus(rename, http.StatusOK)
			if r := e.history("acme/"+repoName, tg.Name, tok, ""); r.status != http.StatusNotFound {
				t.Fatalf("history at the old path after the rename: %d %s, want 404", r.status, r.raw)
			}
			tok = e.registryToken("acme/renamed", testToken)
			r := e.history("acme/renamed", tg.Name, tok, "")
			e.mustStatus(r, http.StatusOK)
			if h := historyOf(r); len(h) == 0 || str(h[len(h)-1], "digest") != tg.Digest {
				t.Fatalf("history at the new path = %v, want it to end at %s", h, tg.Digest)
			}
		}},
		{name: "HistoryRule1_PublicImageUnderPublicOrg", run: func(t *testing.T, e *env) {
			pub := e.sim.Truth().PublicTags[0]
			tok := e.registryToken("chainguard/"+pub.Image, "")
			r := e.history("chainguard/"+pub.Image, "latest", tok, "")
			e.mustStatus(r, http.StatusOK)
			if len(historyOf(r)) == 0 {
				t.Fatal("empty public history")
			}
		}},
		{
			name: "HistoryRule2_StartAndEndBound",
			opts: func(o *platformsim.Options) { o.StartInclusive, o.EndInclusive = true, false },
			run: func(t *testing.T, e *env) {
				image, tag, times := movedThrice(t, e)
				tok := e.registryToken(image, testToken)
				h := historyOf(e.history(image, tag, tok, "start="+url.QueryEscape(times[1].Format(time.RFC3339Nano))))
				if len(h) != 2 {
					t.Fatalf("start=t1 gave %d records, want 2", len(h))
				}
				h = historyOf(e.history(image, tag, tok, "end="+url.QueryEscape(times[1].Format(time.RFC3339Nano))))
				if last := h[len(h)-1]; str(last, "updateTimestamp") >= times[1].Format("2006-01-02T15:04:05.000Z") {
					t.Fatalf("end=t1 returned a record at %s", str(last, "updateTimestamp"))
				}
			},
		},
		{name: "HistoryRule3_AtMost1000OldestFirst", scale: &heavy, run: func(t *testing.T, e *env) {
			var uid string
			for k, h := range e.sim.Truth().History {
				if len(h) == 2500 {
					uid = k
				}
			}
			truthHist, _ := e.sim.History(uid)
			var tg platformsim.TruthTag
			for _, x := range e.sim.Truth().Tags {
				if x.UID == uid {
					tg = x
				}
			}
			name := str(e.get("/registry/v2/repos/"+tg.RepoUID).body, "name")
			tok := e.registryToken("acme/"+name, testToken)
			h := historyOf(e.history("acme/"+name, tg.Name, tok, ""))
			if len(h) != 1000 {
				t.Fatalf("got %d records, want 1000", len(h))
			}
			if str(h[0], "digest") != truthHist[0].Digest || str(h[999], "digest") != truthHist[999].Digest {
				t.Fatal("not the oldest 1000 records, oldest first")
			}
			if !truthHist[999].UpdateTime.Equal(truthHist[1000].UpdateTime) {
				t.Fatal("scale data lacks a shared timestamp across the 1000-record boundary")
			}
		}},
		{
			name: "HistoryRule4_InclusiveBounds",
			opts: func(o *platformsim.Options) { o.StartInclusive, o.EndInclusive = true, true },
			run: func(t *testing.T, e *env) {
				window(t, e, true)
			},
		},
		{name: "HistoryRule4_ExclusiveBounds", run: func(t *testing.T, e *env) {
			window(t, e, false)
		}},
		{
			name:  "HistoryRule_EndNewestOption",
			scale: &heavy,
			opts:  func(o *platformsim.Options) { o.HistoryEndNewest = true },
			run: func(t *testing.T, e *env) {
				var uid string
				for k, h := range e.sim.Truth().History {
					if len(h) == 2500 {
						uid = k
					}
				}
				truthHist, _ := e.sim.History(uid)
				var tg platformsim.TruthTag
				for _, x := range e.sim.Truth().Tags {
					if x.UID == uid {
						tg = x
					}
				}
				name := str(e.get("/registry/v2/repos/"+tg.RepoUID).body, "name")
				tok := e.registryToken("acme/"+name, testToken)
				end := e.sim.Now().Add(time.Hour).UTC().Format(time.RFC3339Nano)
				h := historyOf(e.history("acme/"+name, tg.Name, tok, "end="+url.QueryEscape(end)))
				if len(h) != 1000 || str(h[999], "digest") != truthHist[2499].Digest {
					t.Fatalf("end-only request did not return the newest 1000 records")
				}
			},
		},
	})
}

func TestAuthenticationRules(t *testing.T) {
	runCases(t, []testCase{
		{name: "AuthRule1_BearerRequired", run: func(t *testing.T, e *env) {
			r := e.do(http.MethodGet, "/registry/v2/repos", "", nil)
			e.mustStatus(r, http.StatusUnauthorized)
			if r.body["code"] != float64(16) {
				t.Fatalf("code=%v, want 16", r.body["code"])
			}
			e.mustStatus(e.do(http.MethodGet, "/registry/v2/repos", "wrong", nil), http.StatusUnauthorized)
		}},
		{name: "AuthRule1_MintedTokenAccepted", run: func(t *testing.T, e *env) {
			tok := e.do(http.MethodPost, "/_sim/tokens", "", map[string]any{})
			e.mustStatus(e.do(http.MethodGet, "/ping/v2/ping", str(tok.body, "token"), nil), http.StatusOK)
		}},
		{name: "AuthRule2_ScopedThroughGroupHierarchy", run: func(t *testing.T, e *env) {
			sub := e.do(http.MethodPost, "/iam/v2/groups/org1", testToken, map[string]any{"name": "team"})
			e.mustStatus(sub, http.StatusOK)
			id := e.do(
				http.MethodPost,
				"/iam/v2/identities/"+str(sub.body, "uid"),
				testToken,
				map[string]any{"name": "team bot"},
			)
			tok, err := e.sim.MintToken(str(id.body, "uid"))
			if err != nil {
				t.Fatal(err)
			}
			if got := items(e.do(http.MethodGet, "/registry/v2/repos", tok, nil), "repos"); len(got) != 0 {
				t.Fatalf("subgroup identity sees %d org repos", len(got))
			}
		}},
		{name: "AuthRule3_RootIdentityReachesRegistry", run: func(t *testing.T, e *env) {
			id := e.do(http.MethodPost, "/iam/v2/identities/org1", testToken, map[string]any{"name": "root bot"})
			tok, _ := e.sim.MintToken(str(id.body, "uid"))
			_, repoName := e.someTag("")
			r := e.do(http.MethodGet, "/token?scope="+url.QueryEscape("repository:acme/"+repoName+":pull"), tok, nil)
			e.mustStatus(r, http.StatusOK)
		}},
		{name: "AuthRule3_SubgroupIdentityCannotReachRegistry", run: func(t *testing.T, e *env) {
			sub := e.do(http.MethodPost, "/iam/v2/groups/org1", testToken, map[string]any{"name": "team"})
			id := e.do(
				http.MethodPost,
				"/iam/v2/identities/"+str(sub.body, "uid"),
				testToken,
				map[string]any{"name": "team bot"},
			)
			tok, _ := e.sim.MintToken(str(id.body, "uid"))
			_, repoName := e.someTag("")
			r := e.do(http.MethodGet, "/token?scope="+url.QueryEscape("repository:acme/"+repoName+":pull"), tok, nil)
			e.mustStatus(r, http.StatusForbidden)
		}},
		{name: "AuthRule4_IdentityCarriesClaimMatch", run: func(t *testing.T, e *env) {
			r := e.do(http.MethodPost, "/iam/v2/identities/org1", testToken, map[string]any{"name": "gha",
				"claimMatch": map[string]any{
					"issuer":  "https://token.actions.githubusercontent.com",
					"subject": "repo:acme/app:ref:refs/heads/main",
				}})
			e.mustStatus(r, http.StatusOK)
			cm := r.body["claimMatch"].(map[string]any)
			if str(cm, "subject") != "repo:acme/app:ref:refs/heads/main" || str(r.body, "lastSeenTime") == "" {
				t.Fatalf("identity=%s", r.raw)
			}
		}},
		{name: "AuthRule5_AnonymousPublicLatestOnly", run: func(t *testing.T, e *env) {
			pub := e.sim.Truth().PublicTags[0]
			image := "chainguard/" + pub.Image
			tok := e.registryToken(image, "")
			e.mustStatus(e.history(image, "latest-dev", tok, ""), http.StatusOK)
			e.mustStatus(e.history(image, "1", tok, ""), http.StatusForbidden)
		}},
		{name: "AuthRule5_TokenValidForOneImage", run: func(t *testing.T, e *env) {
			pubs := e.sim.Truth().PublicTags
			tok := e.registryToken("chainguard/"+pubs[0].Image, "")
			var other string
			for _, p := range pubs {
				if p.Image != pubs[0].Image {
					other = p.Image
				}
			}
			e.mustStatus(e.history("chainguard/"+other, "latest", tok, ""), http.StatusForbidden)
		}},
		{name: "AuthRule6_PrivateNeedsToken", run: func(t *testing.T, e *env) {
			tg, repoName := e.someTag("")
			r := e.do(http.MethodGet, "/token?scope="+url.QueryEscape("repository:acme/"+repoName+":pull"), "", nil)
			e.mustStatus(r, http.StatusUnauthorized)
			r = e.history("acme/"+repoName, tg.Name, "", "")
			e.mustStatus(r, http.StatusUnauthorized)
			if !strings.HasPrefix(r.header.Get("WWW-Authenticate"), "Bearer realm=") {
				t.Fatalf("WWW-Authenticate=%q", r.header.Get("WWW-Authenticate"))
			}
		}},
		{name: "AuthRule6_OtherAudienceForbidden", run: func(t *testing.T, e *env) {
			tg, repoName := e.someTag("")
			e.mustStatus(e.history("acme/"+repoName, tg.Name, testToken, ""), http.StatusForbidden)
		}},
	})
}

func TestErrorRules(t *testing.T) {
	runCases(t, []testCase{
		{name: "ErrorRule1_IdentityEmptyBody", run: func(t *testing.T, e *env) {
			req, _ := http.NewRequest(http.MethodPost, e.srv.URL+"/iam/v2/identities/org1", nil)
			req.Header.Set("Authorization", "Bearer "+testToken)
			hr, err := e.srv.Client().Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer hr.Body.Close()
			raw, _ := io.ReadAll(hr.Body)
			r := resp{status: hr.StatusCode, raw: raw}
			_ = json.Unmarshal(raw, &r.body)
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "name")
			v := detail(r, "BadRequest")["fieldViolations"].([]any)[0].(map[string]any)
			if !strings.Contains(str(v, "description"), "^[a-z0-9 ._-]{1,}$") {
				t.Fatalf("violation does not state the pattern: %v", v)
			}
		}},
		{name: "ErrorRule1_IdentityBadName", run: func(t *testing.T, e *env) {
			r := e.do(http.MethodPost, "/iam/v2/identities/org1", testToken, map[string]any{"name": "Bad/Name"})
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "name")
		}},
		{name: "ErrorRule2_GroupNotEmpty", run: func(t *testing.T, e *env) {
			g := e.do(http.MethodPost, "/iam/v2/groups/org1", testToken, map[string]any{"name": "team"})
			gid := str(g.body, "uid")
			e.mustStatus(
				e.do(http.MethodPost, "/registry/v2/repos/"+gid, testToken, map[string]any{"name": "svc"}),
				http.StatusOK,
			)
			r := e.do(http.MethodDelete, "/iam/v2/groups/"+gid, testToken, nil)
			e.mustStatus(r, http.StatusBadRequest)
			if r.body["code"] != float64(9) || !strings.HasPrefix(str(r.body, "message"), "Precondition failed: ") {
				t.Fatalf("body=%s", r.raw)
			}
			if ei := detail(r, "ErrorInfo"); str(ei, "reason") != "FAILED_PRECONDITION" {
				t.Fatalf("ErrorInfo=%v", ei)
			}
			pf := detail(r, "PreconditionFailure")
			vs, _ := pf["violations"].([]any)
			if len(vs) == 0 || str(vs[0].(map[string]any), "type") != "RESOURCE_NOT_EMPTY" {
				t.Fatalf("PreconditionFailure=%v", pf)
			}
			// The root group holds the populated repos.
			e.mustStatus(e.do(http.MethodDelete, "/iam/v2/groups/org1", testToken, nil), http.StatusBadRequest)
		}},
		{name: "ErrorRule3_NotFoundWithResourceInfo", run: func(t *testing.T, e *env) {
			for _, p := range []string{"/registry/v2/repos/org1/nope", "/registry/v2/tags/org1/nope/nope",
				"/vulnerabilities/v2/advisories/nope", "/iam/v2/groups/org1/nope", "/iam/v2/identities/org1/nope",
				"/iam/v2/roles/nope", "/iam/v2/roleBindings/org1/nope", "/events/v2/subscriptions/org1/nope"} {
				r := e.get(p)
				e.mustStatus(r, http.StatusNotFound)
				ri := detail(r, "ResourceInfo")
				if r.body["code"] != float64(5) || ri == nil || str(ri, "resourceName") == "" {
					t.Fatalf("%s: body=%s", p, r.raw)
				}
			}
			e.mustStatus(e.do(http.MethodDelete, "/registry/v2/repos/org1/nope", testToken, nil), http.StatusNotFound)
		}},
		{name: "ErrorRule4_HistoryWrongAudience403", run: func(t *testing.T, e *env) {
			tg, repoName := e.someTag("")
			r := e.history("acme/"+repoName, tg.Name, testToken, "")
			e.mustStatus(r, http.StatusForbidden)
		}},
		{name: "ErrorRule5_StatusMatchesCode", run: func(t *testing.T, e *env) {
			for _, c := range []struct {
				status int
				code   float64
				r      resp
			}{
				{400, 3, e.get("/registry/v2/repos?page_size=x")},
				{404, 5, e.get("/registry/v2/repos/org1/x")},
				{401, 16, e.do(http.MethodGet, "/registry/v2/repos", "", nil)},
				{
					409,
					6,
					e.do(http.MethodPost, "/registry/v2/repos/org1", testToken, map[string]any{"name": e.sim.Truth().Repos[0].Name}),
				},
			} {
				if c.r.status != c.status || c.r.body["code"] != c.code {
					t.Fatalf("status %d code %v, want %d %v: %s", c.r.status, c.r.body["code"], c.status, c.code, c.r.raw)
				}
			}
		}},
	})
}

func TestEndpoints(t *testing.T) {
	runCases(t, []testCase{
		{name: "Service6_DeletesReturnEmptyBody", run: func(t *testing.T, e *env) {
			tg, _ := e.someTag("")
			r := e.do(http.MethodDelete, "/registry/v2/tags/"+tg.UID, testToken, nil)
			e.mustStatus(r, http.StatusOK)
			if len(r.raw) != 0 {
				t.Fatalf("delete body=%q", r.raw)
			}
			e.mustStatus(e.get("/registry/v2/tags/"+tg.UID), http.StatusNotFound)
		}},
		{name: "Resources_CommonFieldsCamelCase", run: func(t *testing.T, e *env) {
			r := e.get("/registry/v2/repos?page_size=1")
			rp := items(r, "repos")[0]
			for _, k := range []string{
				"uid",
				"name",
				"description",
				"createTime",
				"updateTime",
				"catalogTier",
				"aliases",
				"activeTags",
				"bundles",
			} {
				if _, ok := rp[k]; !ok {
					t.Fatalf("repo lacks %s: %v", k, rp)
				}
			}
			if _, err := time.Parse("2006-01-02T15:04:05.000Z", str(rp, "createTime")); err != nil {
				t.Fatalf("createTime %q not ISO 8601 with milliseconds and Z", str(rp, "createTime"))
			}
		}},
		{name: "Repos_CreateGetDelete", run: func(t *testing.T, e *env) {
			r := e.do(
				http.MethodPost,
				"/registry/v2/repos/org1",
				testToken,
				map[string]any{"name": "newimg", "description": "x"},
			)
			e.mustStatus(r, http.StatusOK)
			uid := str(r.body, "uid")
			if !strings.HasPrefix(uid, "org1/") || strings.Count(uid, "/") != 1 {
				t.Fatalf("repo uid %q is not a child of org1", uid)
			}
			e.mustStatus(e.get("/registry/v2/repos/"+uid), http.StatusOK)
			e.mustStatus(e.get("/registry/v2/repos/"+uid+"/readme"), http.StatusOK)
			e.mustStatus(e.do(http.MethodDelete, "/registry/v2/repos/"+uid, testToken, nil), http.StatusOK)
			e.mustStatus(e.get("/registry/v2/repos/"+uid), http.StatusNotFound)
		}},
		{name: "Tags_CreateGetDelete", run: func(t *testing.T, e *env) {
			rp := e.sim.Truth().Repos[0]
			d := "sha256:" + strings.Repeat("cd", 32)
			r := e.do(http.MethodPost, "/registry/v2/tags/"+rp.UID, testToken, map[string]any{"name": "9.9", "digest": d})
			e.mustStatus(r, http.StatusOK)
			uid := str(r.body, "uid")
			if parent := uid[:strings.LastIndex(uid, "/")]; parent != rp.UID {
				t.Fatalf("tag uid %q not under repo %s", uid, rp.UID)
			}
			g := e.get("/registry/v2/tags/" + uid)
			if str(g.body, "digest") != d || g.body["deprecated"] != false {
				t.Fatalf("tag=%s", g.raw)
			}
			e.mustStatus(e.do(http.MethodDelete, "/registry/v2/tags/"+uid, testToken, nil), http.StatusOK)
		}},
		{name: "Images_ArchitecturesAndSize", run: func(t *testing.T, e *env) {
			tg, _ := e.someTag("")
			r := e.get("/registry/v2/repos/" + tg.RepoUID + "/digests/" + tg.Digest + "/architectures")
			e.mustStatus(r, http.StatusOK)
			archs, _ := r.body["architectures"].([]any)
			if len(archs) == 0 || archs[0] != "amd64" {
				t.Fatalf("architectures=%s", r.raw)
			}
			r = e.get("/registry/v2/repos/" + tg.RepoUID + "/digests/" + tg.Digest + "/size?architecture=amd64")
			e.mustStatus(r, http.StatusOK)
			if n, err := strconv.ParseInt(str(r.body, "size"), 10, 64); err != nil || n <= 0 {
				t.Fatalf("size=%s", r.raw)
			}
			e.mustStatus(
				e.get("/registry/v2/repos/"+tg.RepoUID+"/digests/sha256:"+strings.Repeat("0", 64)+"/architectures"),
				http.StatusNotFound,
			)
		}},
		{name: "Ping", run: func(t *testing.T, e *env) {
			e.mustStatus(e.get("/ping/v2/ping"), http.StatusOK)
		}},
		{name: "Roles_BuiltinViewer", run: func(t *testing.T, e *env) {
			got := items(e.get("/iam/v2/roles?name=viewer"), "roles")
			if len(got) != 1 || str(got[0], "name") != "viewer" {
				t.Fatalf("roles=%v", got)
			}
		}},
		{name: "RoleBindings_Hydrated", run: func(t *testing.T, e *env) {
			id := e.do(http.MethodPost, "/iam/v2/identities/org1", testToken, map[string]any{"name": "puller",
				"claimMatch": map[string]any{"issuer": "https://issuer.example", "subject": "s1"}})
			role := items(e.get("/iam/v2/roles?name=viewer"), "roles")[0]
			r := e.do(
				http.MethodPost,
				"/iam/v2/roleBindings/org1",
				testToken,
				map[string]any{"identityUid": str(id.body, "uid"), "roleUid": str(role, "uid")},
			)
			e.mustStatus(r, http.StatusOK)
			ident, _ := r.body["identity"].(map[string]any)
			grp, _ := r.body["group"].(map[string]any)
			rl, _ := r.body["role"].(map[string]any)
			if str(ident, "name") != "puller" || str(ident, "subject") != "s1" || str(ident, "issuer") != "https://issuer.example" ||
				str(grp, "uid") != "org1" ||
				str(rl, "name") != "viewer" ||
				str(r.body, "createTime") == "" {
				t.Fatalf("binding not hydrated: %s", r.raw)
			}
			e.mustStatus(e.do(http.MethodDelete, "/iam/v2/roleBindings/"+str(r.body, "uid"), testToken, nil), http.StatusOK)
			e.mustStatus(e.do(http.MethodDelete, "/iam/v2/identities/"+str(id.body, "uid"), testToken, nil), http.StatusOK)
		}},
		{name: "Groups_CreateDeleteEmpty", run: func(t *testing.T, e *env) {
			g := e.do(http.MethodPost, "/iam/v2/groups/org1", testToken, map[string]any{"name": "tmp"})
			e.mustStatus(g, http.StatusOK)
			e.mustStatus(e.do(http.MethodDelete, "/iam/v2/groups/"+str(g.body, "uid"), testToken, nil), http.StatusOK)
		}},
		{
			name: "Subscriptions_CRUDAndHTTPSRule",
			opts: func(o *platformsim.Options) { o.AllowHTTPSinks = false },
			run: func(t *testing.T, e *env) {
				r := e.do(
					http.MethodPost,
					"/events/v2/subscriptions/org1",
					testToken,
					map[string]any{"sink": "http://127.0.0.1:1/x"},
				)
				e.mustStatus(r, http.StatusBadRequest)
				assertBadRequest(t, r, "sink")
				r = e.do(
					http.MethodPost,
					"/events/v2/subscriptions/org1",
					testToken,
					map[string]any{"sink": "https://hooks.example/x"},
				)
				e.mustStatus(r, http.StatusOK)
				uid := str(r.body, "uid")
				if got := items(e.get("/events/v2/subscriptions"), "subscriptions"); len(got) != 1 {
					t.Fatalf("subscriptions=%v", got)
				}
				e.mustStatus(e.get("/events/v2/subscriptions/"+uid), http.StatusOK)
				e.mustStatus(e.do(http.MethodDelete, "/events/v2/subscriptions/"+uid, testToken, nil), http.StatusOK)
			},
		},
	})
}

// sinkRecorder is a webhook receiver that records what it gets.
type sinkRecorder struct {
	mu       sync.Mutex
	got      []*http.Request
	bodies   [][]byte
	failures int // answer 500 to this many requests first
	ch       chan struct{}
}

func newSink(t *testing.T, failures int) (*sinkRecorder, string) {
	s := &sinkRecorder{failures: failures, ch: make(chan struct{}, 1000)}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		s.mu.Lock()
		fail := s.failures > 0
		if fail {
			s.failures--
		}
		s.got = append(s.got, r)
		s.bodies = append(s.bodies, b)
		s.mu.Unlock()
		s.ch <- struct{}{}
		if fail {
			w.WriteHeader(http.StatusInternalServerError)
			return
		}
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(srv.Close)
	return s, srv.URL
}

// waitFor blocks until the sink has received n requests or fails the test.
func (s *sinkRecorder) waitFor(t *testing.T, n int) ([]*http.Request, [][]byte) {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		s.mu.Lock()
		if len(s.got) >= n {
			g, b := append([]*http.Request(nil), s.got...), append([][]byte(nil), s.bodies...)
			s.mu.Unlock()
			return g, b
		}
		s.mu.Unlock()
		select {
		case <-s.ch:
		case <-deadline:
			t.Fatalf("sink got fewer than %d requests", n)
		}
	}
}

// verifyJWT checks an RS256 token against the issuer's discovered JWKS and
// returns its claims.
func verifyJWT(t *testing.T, e *env, tok string) map[string]any {
	t.Helper()
	disc := e.do(http.MethodGet, "/.well-known/openid-configuration", "", nil)
	if str(disc.body, "issuer") != e.srv.URL {
		t.Fatalf("issuer=%q, want %q", str(disc.body, "issuer"), e.srv.URL)
	}
	jwks := e.do(http.MethodGet, strings.TrimPrefix(str(disc.body, "jwks_uri"), e.srv.URL), "", nil)
	key := jwks.body["keys"].([]any)[0].(map[string]any)
	enc := base64.RawURLEncoding
	n, _ := enc.DecodeString(str(key, "n"))
	ex, _ := enc.DecodeString(str(key, "e"))
	pub := &rsa.PublicKey{N: new(big.Int).SetBytes(n), E: int(new(big.Int).SetBytes(ex).Int64())}
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		t.Fatalf("token is not a JWT")
	}
	sig, _ := enc.DecodeString(parts[2])
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	if err := rsa.VerifyPKCS1v15(pub, crypto.SHA256, sum[:], sig); err != nil {
		t.Fatalf("JWT signature: %v", err)
	}
	payload, _ := enc.DecodeString(parts[1])
	var claims map[string]any
	if err := json.Unmarshal(payload, &claims); err != nil {
		t.Fatal(err)
	}
	return claims
}

func subscribe(t *testing.T, e *env, sink string) {
	t.Helper()
	e.mustStatus(
		e.do(http.MethodPost, "/events/v2/subscriptions/org1", testToken, map[string]any{"sink": sink}),
		http.StatusOK,
	)
}

func fastDelivery(o *platformsim.Options) {
	o.DeliveryBackoff, o.DeliveryMaxBackoff = 5*time.Millisecond, 20*time.Millisecond
}

func TestEvents(t *testing.T) {
	runCases(t, []testCase{
		{name: "Events_CloudEventsBinaryModeSigned", opts: fastDelivery, run: func(t *testing.T, e *env) {
			sink, u := newSink(t, 0)
			subscribe(t, e, u)
			tg, repoName := e.someTag("")
			if err := e.sim.MoveTag(tg.UID, "sha256:"+strings.Repeat("ef", 32)); err != nil {
				t.Fatal(err)
			}
			reqs, bodies := sink.waitFor(t, 2) // subscription.created, then the push
			r, body := reqs[1], bodies[1]
			if got, want := r.Header.Get("Ce-Type"), "dev.chainguard.registry.push.v1"; got != want {
				t.Fatalf("Ce-Type=%q, want %q", got, want)
			}
			for _, h := range []string{
				"Ce-Specversion",
				"Ce-Id",
				"Ce-Source",
				"Ce-Subject",
				"Ce-Time",
				"Ce-Group",
				"Ce-Audience",
			} {
				if r.Header.Get(h) == "" {
					t.Fatalf("missing %s", h)
				}
			}
			if r.Header.Get("Ce-Group") != "org1" || r.Header.Get("Ce-Subject") != tg.RepoUID {
				t.Fatalf("Ce-Group=%q Ce-Subject=%q", r.Header.Get("Ce-Group"), r.Header.Get("Ce-Subject"))
			}
			var ev struct {
				Actor map[string]any `json:"actor"`
				Body  map[string]any `json:"body"`
			}
			if err := json.Unmarshal(body, &ev); err != nil {
				t.Fatal(err)
			}
			if str(ev.Body, "repository") != repoName || str(ev.Body, "tag") != tg.Name || str(ev.Body, "type") != "manifest" ||
				str(ev.Body, "tag_previous_digest") != tg.Digest || str(ev.Actor, "subject") == "" {
				t.Fatalf("push body=%s", body)
			}
			claims := verifyJWT(t, e, strings.TrimPrefix(r.Header.Get("Authorization"), "Bearer "))
			sum := sha256.Sum256(body)
			wh, _ := claims["webhook"].(map[string]any)
			if claims["iss"] != e.srv.URL || claims["aud"] != "customer" || claims["sub"] != "webhook:org1" ||
				str(wh, "digest") != "sha256:"+hex.EncodeToString(sum[:]) {
				t.Fatalf("claims=%v", claims)
			}
		}},
		{name: "Events_RetriedOnNon2xx", opts: fastDelivery, run: func(t *testing.T, e *env) {
			sink, u := newSink(t, 2)
			subscribe(t, e, u)
			reqs, _ := sink.waitFor(t, 3)
			if a, b := reqs[0].Header.Get("Ce-Id"), reqs[2].Header.Get("Ce-Id"); a != b {
				t.Fatalf("retry has a new Ce-Id: %s vs %s", a, b)
			}
		}},
		{name: "Events_DuplicateFault", opts: fastDelivery, run: func(t *testing.T, e *env) {
			e.sim.SetDeliveryFaults(platformsim.DeliveryFaults{DuplicateRate: 1})
			sink, u := newSink(t, 0)
			subscribe(t, e, u)
			reqs, _ := sink.waitFor(t, 2)
			if reqs[0].Header.Get("Ce-Id") != reqs[1].Header.Get("Ce-Id") {
				t.Fatal("duplicate carries a different Ce-Id")
			}
		}},
		{name: "Events_DropFault", opts: fastDelivery, run: func(t *testing.T, e *env) {
			sink, u := newSink(t, 0)
			subscribe(t, e, u)
			sink.waitFor(t, 1)
			e.sim.SetDeliveryFaults(platformsim.DeliveryFaults{DropRate: 1})
			tg, _ := e.someTag("")
			_ = e.sim.MoveTag(tg.UID, "sha256:"+strings.Repeat("11", 32))
			e.sim.SetDeliveryFaults(platformsim.DeliveryFaults{})
			_ = e.sim.MoveTag(tg.UID, "sha256:"+strings.Repeat("22", 32))
			_, bodies := sink.waitFor(t, 2)
			if !strings.Contains(string(bodies[1]), strings.Repeat("22", 32)) {
				t.Fatalf("second delivery is not the undropped event: %s", bodies[1])
			}
			dropped := 0
			for _, d := range e.sim.Deliveries() {
				if d.Dropped {
					dropped++
				}
			}
			if dropped != 1 {
				t.Fatalf("dropped=%d, want 1", dropped)
			}
		}},
		{name: "Events_ReorderFault", opts: fastDelivery, run: func(t *testing.T, e *env) {
			sink, u := newSink(t, 0)
			subscribe(t, e, u)
			sink.waitFor(t, 1)
			tg, _ := e.someTag("")
			e.sim.SetDeliveryFaults(platformsim.DeliveryFaults{ReorderRate: 1, ReorderDelay: 300 * time.Millisecond})
			_ = e.sim.MoveTag(tg.UID, "sha256:"+strings.Repeat("11", 32))
			e.sim.SetDeliveryFaults(platformsim.DeliveryFaults{})
			_ = e.sim.MoveTag(tg.UID, "sha256:"+strings.Repeat("22", 32))
			_, bodies := sink.waitFor(t, 3)
			if !strings.Contains(string(bodies[1]), strings.Repeat("22", 32)) {
				t.Fatalf("later event did not overtake the held one")
			}
		}},
		{name: "Events_RepoLifecycleTypes", opts: fastDelivery, run: func(t *testing.T, e *env) {
			sink, u := newSink(t, 0)
			subscribe(t, e, u)
			r := e.do(http.MethodPost, "/registry/v2/repos/org1", testToken, map[string]any{"name": "evimg"})
			e.do(http.MethodDelete, "/registry/v2/repos/"+str(r.body, "uid"), testToken, nil)
			reqs, _ := sink.waitFor(t, 3)
			var types []string
			for _, q := range reqs {
				types = append(types, q.Header.Get("Ce-Type"))
			}
			want := []string{"dev.chainguard.api.events.subscription.created.v1",
				"dev.chainguard.api.platform.registry.repo.created.v1", "dev.chainguard.api.platform.registry.repo.deleted.v1"}
			if !slices.Equal(types, want) {
				t.Fatalf("types=%v, want %v", types, want)
			}
		}},
	})
}

func TestFaults(t *testing.T) {
	runCases(t, []testCase{
		{name: "Fault_5xxStatuses", run: func(t *testing.T, e *env) {
			for _, st := range []int{500, 502, 503} {
				e.sim.SetFaults(
					platformsim.Fault{Pattern: "GET /registry/v2/repos", ErrorRate: 1, ErrorStatuses: []int{st}, Remaining: 1},
				)
				if got, _, _ := e.rawDo(http.MethodGet, "/registry/v2/repos", testToken); got != st {
					t.Fatalf("status=%d, want %d", got, st)
				}
			}
			e.mustStatus(e.get("/registry/v2/repos"), http.StatusOK) // Remaining used up
		}},
		{name: "Fault_429RetryAfterSeconds", run: func(t *testing.T, e *env) {
			e.sim.SetFaults(platformsim.Fault{Pattern: "GET /registry/v2/*", RateLimitRate: 1, RetryAfter: 3 * time.Second})
			r := e.get("/registry/v2/tags")
			e.mustStatus(r, http.StatusTooManyRequests)
			if r.header.Get("Retry-After") != "3" || r.body["code"] != float64(8) {
				t.Fatalf("Retry-After=%q body=%s", r.header.Get("Retry-After"), r.raw)
			}
		}},
		{name: "Fault_429RetryAfterHTTPDate", run: func(t *testing.T, e *env) {
			e.sim.SetFaults(platformsim.Fault{Pattern: "*", RateLimitRate: 1, RetryAfter: time.Minute, RetryAfterHTTPDate: true})
			r := e.get("/registry/v2/tags")
			if _, err := http.ParseTime(r.header.Get("Retry-After")); err != nil || r.status != 429 {
				t.Fatalf("Retry-After=%q: %v", r.header.Get("Retry-After"), err)
			}
		}},
		{name: "Fault_ConnectionReset", run: func(t *testing.T, e *env) {
			e.sim.SetFaults(platformsim.Fault{Pattern: "GET /registry/v2/tags", ResetRate: 1})
			if _, _, err := e.rawDo(http.MethodGet, "/registry/v2/tags", testToken); err == nil {
				t.Fatal("request succeeded through a reset")
			}
		}},
		{name: "Fault_TruncatedBody", run: func(t *testing.T, e *env) {
			e.sim.SetFaults(platformsim.Fault{Pattern: "GET /registry/v2/tags", TruncateRate: 1})
			st, _, err := e.rawDo(http.MethodGet, "/registry/v2/tags", testToken)
			if st != http.StatusOK || err == nil {
				t.Fatalf("status=%d err=%v, want 200 and a short body", st, err)
			}
		}},
		{name: "Fault_StalledBody", run: func(t *testing.T, e *env) {
			e.sim.SetFaults(platformsim.Fault{Pattern: "GET /registry/v2/tags", StallRate: 1, Stall: 50 * time.Millisecond})
			start := time.Now()
			_, _, err := e.rawDo(http.MethodGet, "/registry/v2/tags", testToken)
			if err == nil || time.Since(start) < 50*time.Millisecond {
				t.Fatalf("err=%v after %v, want a short body after the stall", err, time.Since(start))
			}
		}},
		{name: "Fault_Latency", run: func(t *testing.T, e *env) {
			e.sim.SetFaults(
				platformsim.Fault{
					Pattern:       "GET /ping/v2/ping",
					Latency:       40 * time.Millisecond,
					LatencyJitter: 10 * time.Millisecond,
				},
			)
			start := time.Now()
			e.mustStatus(e.get("/ping/v2/ping"), http.StatusOK)
			if d := time.Since(start); d < 40*time.Millisecond {
				t.Fatalf("answered in %v, want at least 40ms", d)
			}
		}},
		{name: "Fault_RespondAfter", run: func(t *testing.T, e *env) {
			// Set through the control API, which reads and echoes it.
			r := e.do(http.MethodPut, "/_sim/faults", "", map[string]any{"faults": []map[string]any{
				{"pattern": "GET /registry/v2/tags", "respondAfter": "60ms"}}})
			e.mustStatus(r, http.StatusOK)
			r = e.do(http.MethodGet, "/_sim/faults", "", nil)
			if !strings.Contains(string(r.raw), `"respondAfter":"60ms"`) {
				t.Fatalf("control API answered %s, want the fault with respondAfter 60ms", r.raw)
			}
			start := time.Now()
			st, body, err := e.rawDo(http.MethodGet, "/registry/v2/tags", testToken)
			took := time.Since(start)
			var page struct {
				Tags []json.RawMessage `json:"tags"`
			}
			if st != http.StatusOK || err != nil || json.Unmarshal(body, &page) != nil || len(page.Tags) == 0 {
				t.Fatalf("status=%d err=%v body=%.200s, want a whole page of tags", st, err, body)
			}
			if took < 60*time.Millisecond {
				t.Fatalf("answered in %v, want no sooner than 60ms after the request", took)
			}
		}},
		{name: "Fault_SeededReproducible", run: func(t *testing.T, e *env) {
			seq := func() string {
				e.sim.SetFaults(platformsim.Fault{Pattern: "GET /ping/v2/ping", ErrorRate: 0.5, ErrorStatuses: []int{503}})
				var b strings.Builder
				for range 20 {
					st, _, _ := e.rawDo(http.MethodGet, "/ping/v2/ping", testToken)
					fmt.Fprintf(&b, "%d ", st)
				}
				return b.String()
			}
			if a, b := seq(), seq(); a != b {
				t.Fatalf("fault sequence differs:\n%s\n%s", a, b)
			}
		}},
		{name: "Fault_ControlAPI", run: func(t *testing.T, e *env) {
			r := e.do(http.MethodPut, "/_sim/faults", "", map[string]any{"faults": []map[string]any{
				{"pattern": "GET /ping/v2/ping", "errorRate": 1, "errorStatuses": []int{502}, "remaining": 1}}})
			e.mustStatus(r, http.StatusOK)
			if st, _, _ := e.rawDo(http.MethodGet, "/ping/v2/ping", testToken); st != 502 {
				t.Fatalf("status=%d, want 502", st)
			}
		}},
	})
}

func TestScenarioAndControl(t *testing.T) {
	runCases(t, []testCase{
		{name: "Scenario_DeterministicFromSeed", run: func(t *testing.T, e *env) {
			other := newEnv(t, smallScale(), nil)
			a, b := e.sim.Step(50), other.sim.Step(50)
			ja, _ := json.Marshal(a)
			jb, _ := json.Marshal(b)
			if string(ja) != string(jb) {
				t.Fatal("same seed gave different mutations")
			}
			ta, _ := json.Marshal(e.sim.Truth())
			tb, _ := json.Marshal(other.sim.Truth())
			if string(ta) != string(tb) {
				t.Fatal("same seed gave different truth")
			}
		}},
		{name: "Scenario_TagMovesAppendHistory", run: func(t *testing.T, e *env) {
			e.sim.SetRates(platformsim.Rates{MoveTag: 1})
			e.sim.Advance(time.Hour)
			muts := e.sim.Step(5)
			for _, m := range muts {
				if m.Kind != platformsim.TagMoved {
					t.Fatalf("kind=%s", m.Kind)
				}
				h, _ := e.sim.History(m.UID)
				if last := h[len(h)-1]; last.Digest != m.Digest || !last.UpdateTime.Equal(m.Time) {
					t.Fatalf("history tail=%v, want %s at %v", last, m.Digest, m.Time)
				}
				got := e.get("/registry/v2/tags/" + m.UID)
				if str(got.body, "digest") != e.sim.Truth().History[m.UID][len(h)-1].Digest {
					t.Fatalf("tag digest not updated")
				}
			}
		}},
		{name: "Scenario_AllKinds", run: func(t *testing.T, e *env) {
			seen := map[platformsim.MutationKind]bool{}
			for _, m := range e.sim.Step(400) {
				seen[m.Kind] = true
			}
			for _, k := range []platformsim.MutationKind{platformsim.TagMoved, platformsim.TagDeprecated, platformsim.TagCreated,
				platformsim.TagDeleted, platformsim.RepoCreated, platformsim.AdvisoryCreated, platformsim.AdvisoryUpdated} {
				if !seen[k] {
					t.Fatalf("400 steps never produced %s", k)
				}
			}
		}},
		{name: "Control_AdvanceMutateTruthStats", run: func(t *testing.T, e *env) {
			before := e.sim.Now()
			e.mustStatus(e.do(http.MethodPost, "/_sim/advance", "", map[string]any{"duration": "72h"}), http.StatusOK)
			if d := e.sim.Now().Sub(before); d != 72*time.Hour {
				t.Fatalf("advanced %v", d)
			}
			tg, _ := e.someTag("")
			r := e.do(
				http.MethodPost,
				"/_sim/mutations",
				"",
				map[string]any{"kind": "tag.moved", "uid": tg.UID, "digest": "sha256:" + strings.Repeat("77", 32)},
			)
			e.mustStatus(r, http.StatusOK)
			truth := e.do(http.MethodGet, "/_sim/truth", "", nil)
			hist := truth.body["history"].(map[string]any)[tg.UID].([]any)
			if str(hist[len(hist)-1].(map[string]any), "digest") != "sha256:"+strings.Repeat("77", 32) {
				t.Fatal("truth lacks the mutation")
			}
			e.get("/registry/v2/repos")
			e.get("/registry/v2/repos/" + tg.RepoUID)
			st := e.do(http.MethodGet, "/_sim/stats", "", nil)
			by := st.body["byEndpoint"].(map[string]any)
			if by["GET /registry/v2/repos"] != float64(1) || by["GET /registry/v2/repos/{uid}"] != float64(1) {
				t.Fatalf("stats=%s", st.raw)
			}
			e.mustStatus(e.do(http.MethodPost, "/_sim/step", "", map[string]any{"n": 3}), http.StatusOK)
		}},
	})
}
