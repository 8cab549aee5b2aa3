package platformsim_test

import (
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"testing"
	"time"
)

// TestListRules covers the numbered list rules of the spec.
func TestListRules(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"ListRule1_AbsentTokenMeansLastPage", func(t *testing.T, e *env) {
			truth := e.sim.Truth()
			got := e.listAll("/registry/v2/repos", url.Values{"page_size": {"5"}}, "repos")
			if len(got) != len(truth.Repos) {
				t.Fatalf("listed %d repos, want %d", len(got), len(truth.Repos))
			}
			// An exact multiple of the page size must not end with an empty page
			// carrying a token.
			r := e.get("/registry/v2/repos?page_size=" + strconv.Itoa(len(truth.Repos)))
			if _, ok := r.body["nextPageToken"]; ok {
				t.Fatalf("nextPageToken present on the last page: %s", r.raw)
			}
		}},
		{"ListRule2_SortOrderKeptAcrossPages", func(t *testing.T, e *env) {
			for _, order := range []string{"name", "name desc", "uid", "create_time desc", "update_time"} {
				got := e.listAll("/registry/v2/repos", url.Values{"page_size": {"4"}, "order_by": {order}}, "repos")
				key := map[string]string{"name": "name", "name desc": "name", "uid": "uid",
					"create_time desc": "createTime", "update_time": "updateTime"}[order]
				desc := order == "name desc" || order == "create_time desc"
				for i := 1; i < len(got); i++ {
					a, b := str(got[i-1], key), str(got[i], key)
					if (!desc && a > b) || (desc && a < b) {
						t.Fatalf("order %q broken at %d: %q then %q", order, i, a, b)
					}
				}
			}
		}},
		{"ListRule3_SkippedEchoesSkip", func(t *testing.T, e *env) {
			all := e.listAll("/registry/v2/repos", url.Values{}, "repos")
			r := e.get("/registry/v2/repos?skip=3&page_size=2")
			e.mustStatus(r, http.StatusOK)
			if got, want := r.body["skipped"], float64(3); got != want {
				t.Fatalf("skipped=%v, want %v", got, want)
			}
			page := items(r, "repos")
			if str(page[0], "uid") != str(all[3], "uid") {
				t.Fatalf("skip=3 started at %s, want %s", str(page[0], "uid"), str(all[3], "uid"))
			}
		}},
		{"ListRule4_ExpiredTokenRestarts", func(t *testing.T, e *env) {
			first := e.get("/registry/v2/repos?page_size=3")
			tok := str(first.body, "nextPageToken")
			e.sim.Advance(72*time.Hour + time.Minute)
			r := e.get("/registry/v2/repos?page_size=3&page_token=" + url.QueryEscape(tok))
			e.mustStatus(r, http.StatusOK)
			if a, b := str(items(r, "repos")[0], "uid"), str(items(first, "repos")[0], "uid"); a != b {
				t.Fatalf("expired token continued at %s, want restart at %s", a, b)
			}
		}},
		{"ListRule4_TokenValidWithinThreeDays", func(t *testing.T, e *env) {
			first := e.get("/registry/v2/repos?page_size=3")
			tok := str(first.body, "nextPageToken")
			e.sim.Advance(72*time.Hour - time.Minute)
			r := e.get("/registry/v2/repos?page_size=3&page_token=" + url.QueryEscape(tok))
			if a, b := str(items(r, "repos")[0], "uid"), str(items(first, "repos")[0], "uid"); a == b {
				t.Fatalf("token within 3 days restarted the listing")
			}
		}},
		{"ListRule5_DefaultOrderUIDAscending", func(t *testing.T, e *env) {
			got := e.listAll("/registry/v2/repos", url.Values{}, "repos")
			uids := make([]string, len(got))
			for i, g := range got {
				uids[i] = str(g, "uid")
			}
			if !slices.IsSorted(uids) {
				t.Fatalf("default order not uid asc: %v", uids)
			}
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(t, newEnv(t, smallScale(), nil))
		})
	}
}

// registryToken fetches a registry token for org/image, with a platform
// token or anonymously.
func (e *env) registryToken(image, platformToken string) string {
	e.tb.Helper()
	r := e.do(http.MethodGet, "/token?scope="+url.QueryEscape("repository:"+image+":pull"), platformToken, nil)
	e.mustStatus(r, http.StatusOK)
	return str(r.body, "token")
}

func TestMilestoneSmoke(t *testing.T) {
	e := newEnv(t, smallScale(), nil)
	truth := e.sim.Truth()
	tg := truth.Tags[0]
	var repoName string
	for _, rp := range truth.Repos {
		if rp.UID == tg.RepoUID {
			repoName = rp.Name
		}
	}
	tok := e.registryToken("acme/"+repoName, testToken)
	r := e.do(http.MethodGet, "/v2/acme/"+repoName+"/_chainguard/history/"+tg.Name, tok, nil)
	e.mustStatus(r, http.StatusOK)
	hist, _ := r.body["history"].([]any)
	if got, want := len(hist), len(truth.History[tg.UID]); got != want {
		t.Fatalf("history len=%d, want %d", got, want)
	}
	r = e.get("/registry/v2/tags/" + tg.UID)
	e.mustStatus(r, http.StatusOK)
	if got := str(r.body, "digest"); got != tg.Digest {
		t.Fatalf("digest=%s, want %s", got, tg.Digest)
	}
	r = e.get("/registry/v2/repos/org1/doesnotexist")
	e.mustStatus(r, http.StatusNotFound)
	if detail(r, "ResourceInfo") == nil {
		t.Fatalf("no ResourceInfo: %s", r.raw)
	}
	r = e.get("/vulnerabilities/v2/advisories?page_size=2")
	e.mustStatus(r, http.StatusOK)
	if str(r.body, "totalCount") != "30" {
		t.Fatalf("totalCount=%v", r.body["totalCount"])
	}
}
