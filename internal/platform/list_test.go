package platform_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

// flakyFaults is the bar: on every endpoint, 20% 5xx, 10% 429 and
// 2% connection resets.
func flakyFaults(httpDate bool) platformsim.Fault {
	return platformsim.Fault{Pattern: "*", ErrorRate: 0.20, ErrorStatuses: []int{500, 502, 503, 504},
		RateLimitRate: 0.10, RetryAfter: time.Second, RetryAfterHTTPDate: httpDate, ResetRate: 0.02}
}

func TestClient_GroundTruthUnderFaults(t *testing.T) {
	sc := platformsim.Scale{Repos: 7, TagsPerRepo: 4, HistoryPerTag: 12, Advisories: 450,
		HeavyTags: 1, HeavyHistory: 2300, PublicImages: 2}
	for _, tc := range []struct {
		name     string
		httpDate bool
	}{{"RetryAfterSeconds", false}, {"RetryAfterHTTPDate", true}} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, sc, nil)
			e.sim.SetFaults(flakyFaults(tc.httpDate))
			seen := e.countOutcomes()
			c := e.client(nil)
			ctx := ctxT(t)
			tr := e.sim.Truth()

			// Small pages, so that every listing takes several pages.
			repos, err := c.Repos(platform.ListQuery{DescendantsOf: "org1", PageSize: 3}).Collect(ctx)
			if err != nil {
				t.Fatalf("list repos: %v", err)
			}
			if got, want := len(repos), len(tr.Repos); got != want {
				t.Fatalf("%d repos, want %d", got, want)
			}
			for i, r := range repos {
				w := tr.Repos[i]
				if r.UID != w.UID || r.Name != w.Name || r.Description != w.Description ||
					!r.CreateTime.Equal(w.CreateTime) || !r.UpdateTime.Equal(w.UpdateTime) {
					t.Fatalf("repo %d = %+v, want %+v", i, r, w)
				}
			}

			var tags []platform.Tag
			for _, r := range repos {
				l := c.Tags(platform.ListQuery{ChildrenOf: r.UID, PageSize: 3})
				page, err := l.Collect(ctx)
				if err != nil {
					t.Fatalf("list tags of %s: %v", r.Name, err)
				}
				if got, want := l.Total(), int64(sc.TagsPerRepo); got != want {
					t.Errorf("Total of tags of %s = %d, want %d", r.Name, got, want)
				}
				tags = append(tags, page...)
			}
			if got, want := len(tags), len(tr.Tags); got != want {
				t.Fatalf("%d tags, want %d", got, want)
			}
			for i, tg := range tags {
				w := tr.Tags[i]
				if tg.UID != w.UID || tg.Name != w.Name || tg.Digest != w.Digest || tg.Deprecated != w.Deprecated ||
					!tg.UpdateTime.Equal(w.UpdateTime) {
					t.Fatalf("tag %d = %+v, want %+v", i, tg, w)
				}
			}

			advs, err := c.Advisories(platform.ListQuery{}).Collect(ctx)
			if err != nil {
				t.Fatalf("list advisories: %v", err)
			}
			if got, want := len(advs), len(tr.Advisories); got != want {
				t.Fatalf("%d advisories, want %d", got, want)
			}
			for i, a := range advs {
				w := tr.Advisories[i]
				if a.UID != w.UID || a.AdvisoryID != w.AdvisoryID || a.ArtifactName != w.ArtifactName ||
					!a.UpdateTime.Equal(w.UpdateTime) {
					t.Fatalf("advisory %d = %+v, want %+v", i, a, w)
				}
			}

			names := repoNames(tr)
			heavy := 0
			for _, tg := range tr.Tags {
				recs, err := c.HistorySince(ctx, c.PrivateImage(names[tg.RepoUID]), tg.Name, time.Time{})
				if err != nil {
					t.Fatalf("history of %s: %v", tg.UID, err)
				}
				checkHistory(t, tg.UID, recs, tr.History[tg.UID])
				if len(recs) > 1000 {
					heavy++
				}
			}
			if heavy != sc.HeavyTags {
				t.Errorf("%d histories over 1000 records, want %d", heavy, sc.HeavyTags)
			}
			public := 0
			for _, pt := range tr.PublicTags {
				if pt.Tag != "latest" && pt.Tag != "latest-dev" {
					continue // anonymous tokens read only these
				}
				recs, err := c.HistorySince(ctx, c.PublicImage(pt.Image), pt.Tag, time.Time{})
				if err != nil {
					t.Fatalf("history of public %s:%s: %v", pt.Image, pt.Tag, err)
				}
				checkHistory(t, pt.Image+":"+pt.Tag, recs, pt.History)
				public++
			}
			if public == 0 {
				t.Fatal("no public tags were read")
			}
			// Every kind of fault must have struck, or this proved nothing.
			if seen.get(http.StatusTooManyRequests) == 0 ||
				seen.get(http.StatusInternalServerError)+seen.get(http.StatusBadGateway)+
					seen.get(http.StatusServiceUnavailable)+seen.get(http.StatusGatewayTimeout) == 0 ||
				seen.resetCount() == 0 {
				t.Errorf("faults seen: statuses %v, %d resets; want 429s, 5xx and resets", seen.status, seen.resetCount())
			}
			t.Logf("%d requests, %d retries", c.Requests(), c.Retries())
		})
	}
}

func TestLister_ExpiredPageTokenIsDetected(t *testing.T) {
	e := newEnv(t, platformsim.Scale{Repos: 10, TagsPerRepo: 1, HistoryPerTag: 1, PublicImages: -1}, nil)
	c := e.client(nil)
	ctx := ctxT(t)

	t.Run("Fresh", func(t *testing.T) {
		repos, err := c.Repos(platform.ListQuery{PageSize: 3}).Collect(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := len(repos), 10; got != want {
			t.Fatalf("%d repos, want %d", got, want)
		}
	})
	t.Run("Expired", func(t *testing.T) {
		var seen int
		var err error
		pages := 0
		for page, perr := range c.Repos(platform.ListQuery{PageSize: 3}).Pages(ctx) {
			if perr != nil {
				err = perr
				break
			}
			pages++
			seen += len(page)
			// The page token now in hand outlives its 3 days.
			e.sim.Advance(72*time.Hour + time.Minute)
		}
		var restarted *platform.ListRestartedError
		if !errors.As(err, &restarted) {
			t.Fatalf("err = %v, want a *ListRestartedError", err)
		}
		if got, want := restarted.Page, 2; got != want {
			t.Errorf("restart reported at page %d, want %d", got, want)
		}
		if pages != 1 || seen != 3 {
			t.Errorf("yielded %d pages, %d repos before the error; want 1 page of 3", pages, seen)
		}
	})
}

func TestLister_StopsAfterMaxPages(t *testing.T) {
	e := newEnv(t, platformsim.Scale{Repos: 10, TagsPerRepo: 1, HistoryPerTag: 1, PublicImages: -1}, nil)
	c := e.client(func(cfg *platform.Config) { cfg.MaxPages = 2 })
	repos, err := c.Repos(platform.ListQuery{PageSize: 3}).Collect(ctxT(t))
	if !errors.Is(err, platform.ErrTooManyPages) {
		t.Fatalf("err = %v, want ErrTooManyPages", err)
	}
	if got, want := len(repos), 6; got != want {
		t.Errorf("%d repos before stopping, want %d", got, want)
	}
	if got, want := e.requests("GET /registry/v2/repos"), 2; got != want {
		t.Errorf("%d list requests, want %d", got, want)
	}
}

func TestLister_TokenThatNeverChanges(t *testing.T) {
	// A broken server: new items every time, and always the same token.
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, `{"repos":[{"uid":"g/r%03d"}],"nextPageToken":"same","totalCount":"1000000"}`, n.Add(1))
	}))
	t.Cleanup(srv.Close)
	c := plainClient(t, srv, nil)
	l := c.Repos(platform.ListQuery{})
	repos, err := l.Collect(ctxT(t))
	if !errors.Is(err, platform.ErrTooManyPages) {
		t.Fatalf("err = %v, want ErrTooManyPages", err)
	}
	if len(repos) != 2 || n.Load() != 2 || l.Total() != 1000000 {
		t.Errorf("%d repos from %d requests, total %d; want 2, 2 and the server's count", len(repos), n.Load(), l.Total())
	}
}
