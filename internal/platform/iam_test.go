package platform_test

import (
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"net/url"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

// sink accepts the simulator's event deliveries, so subscriptions have a
// receiver on loopback.
func sink(t *testing.T) string {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	t.Cleanup(srv.Close)
	return srv.URL + "/events"
}

// identitiesNamed counts identities by name, asking the simulator directly
// so that the check does not go through the code under test.
func (e *env) identitiesNamed(name string) int {
	e.tb.Helper()
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/iam/v2/identities?"+url.Values{"name": {name}}.Encode(), nil)
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		e.tb.Fatal(err)
	}
	defer resp.Body.Close()
	var body struct {
		Identities []json.RawMessage `json:"identities"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		e.tb.Fatal(err)
	}
	return len(body.Identities)
}

func TestIAM_IdentityRoleBindingLifecycle(t *testing.T) {
	e := newEnv(t, platformsim.Scale{PublicImages: -1}, nil)
	c := e.client(nil)
	ctx := ctxT(t)

	id, err := c.CreateIdentity(ctx, "org1", platform.Identity{Name: "ci deployer", Description: "pushes from CI",
		ClaimMatch: platform.ClaimMatch{
			Issuer:  "https://token.actions.example.com",
			Subject: "repo:acme/app:ref:refs/heads/main",
		}})
	if err != nil {
		t.Fatalf("CreateIdentity: %v", err)
	}
	if id.UID == "" || id.Name != "ci deployer" || id.ClaimMatch.Subject != "repo:acme/app:ref:refs/heads/main" ||
		id.ClaimMatch.Issuer != "https://token.actions.example.com" || id.LastSeenTime.IsZero() || id.CreateTime.IsZero() {
		t.Errorf("created identity = %+v", id)
	}

	roles, err := c.Roles(platform.ListQuery{}).Collect(ctx)
	if err != nil {
		t.Fatalf("list roles: %v", err)
	}
	i := slices.IndexFunc(roles, func(r platform.Role) bool { return r.Name == "viewer" })
	if i < 0 {
		t.Fatalf("no viewer among %d roles", len(roles))
	}
	viewer := roles[i]

	b, err := c.CreateRoleBinding(ctx, "org1", id.UID, viewer.UID)
	if err != nil {
		t.Fatalf("CreateRoleBinding: %v", err)
	}
	if b.UID == "" ||
		b.Identity.UID != id.UID ||
		b.Identity.Name != id.Name ||
		b.Identity.Subject != id.ClaimMatch.Subject ||
		b.Role.UID != viewer.UID || b.Role.Name != "viewer" || b.Group.UID != "org1" ||
		b.Group.Name == "" {
		t.Errorf("binding not hydrated: %+v", b)
	}
	if err := c.DeleteRoleBinding(ctx, b.UID); err != nil {
		t.Fatalf("DeleteRoleBinding: %v", err)
	}
	if err := c.DeleteIdentity(ctx, id.UID); err != nil {
		t.Fatalf("DeleteIdentity: %v", err)
	}
	if err := c.DeleteIdentity(ctx, id.UID); !platform.IsNotFound(err) {
		t.Errorf("second DeleteIdentity: %v, want not found", err)
	}
	if _, err := c.CreateRoleBinding(ctx, "org1", id.UID, viewer.UID); !platform.IsInvalidArgument(err) {
		t.Errorf("binding a deleted identity: %v, want invalid argument", err)
	}
}

func TestSubscriptions_Lifecycle(t *testing.T) {
	e := newEnv(t, platformsim.Scale{PublicImages: -1}, nil)
	c := e.client(nil)
	ctx := ctxT(t)
	url := sink(t)

	sub, err := c.CreateSubscription(ctx, "org1", url)
	if err != nil {
		t.Fatalf("CreateSubscription: %v", err)
	}
	if sub.UID == "" || sub.Sink != url {
		t.Errorf("created %+v", sub)
	}
	got, err := c.GetSubscription(ctx, sub.UID)
	if err != nil || got != sub {
		t.Errorf("GetSubscription = %+v, %v; want %+v", got, err, sub)
	}
	all, err := c.Subscriptions(platform.ListQuery{DescendantsOf: "org1"}).Collect(ctx)
	if err != nil || len(all) != 1 || all[0] != sub {
		t.Errorf("Subscriptions = %+v, %v; want just %+v", all, err, sub)
	}
	if err := c.DeleteSubscription(ctx, sub.UID); err != nil {
		t.Fatalf("DeleteSubscription: %v", err)
	}
	if _, err := c.GetSubscription(ctx, sub.UID); !platform.IsNotFound(err) {
		t.Errorf("GetSubscription after delete: %v, want not found", err)
	}
	if _, err := c.CreateSubscription(ctx, "org1", "ftp://example.com/x"); !platform.IsInvalidArgument(err) {
		t.Errorf("CreateSubscription(ftp://): %v, want invalid argument", err)
	}
}

func TestCreate_RetriedOnlyWhenNotProcessed(t *testing.T) {
	const createPattern = "POST /iam/v2/identities/{parent}"
	for _, tc := range []struct {
		name      string
		fault     platformsim.Fault
		sent      int
		created   bool
		ambiguous bool
	}{
		{"RateLimited", platformsim.Fault{RateLimitRate: 1, RetryAfter: time.Second}, 2, true, false},
		{
			"RateLimitedHTTPDate",
			platformsim.Fault{RateLimitRate: 1, RetryAfter: time.Second, RetryAfterHTTPDate: true},
			2,
			true,
			false,
		},
		{"ServerError", platformsim.Fault{ErrorRate: 1, ErrorStatuses: []int{500}}, 1, false, true},
		{"Unavailable", platformsim.Fault{ErrorRate: 1, ErrorStatuses: []int{503}}, 1, false, true},
		{"Reset", platformsim.Fault{ResetRate: 1}, 1, false, true},
		{"TruncatedAnswer", platformsim.Fault{TruncateRate: 1}, 1, true, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, platformsim.Scale{PublicImages: -1}, nil)
			c := e.client(nil)
			f := tc.fault
			f.Pattern, f.Remaining = createPattern, 1
			e.sim.SetFaults(f)
			_, err := c.CreateIdentity(ctxT(t), "org1", platform.Identity{Name: "robot"})
			if got := e.requests(createPattern); got != tc.sent {
				t.Errorf("%d creates sent, want %d", got, tc.sent)
			}
			if tc.ambiguous != errors.Is(err, platform.ErrOutcomeUnknown) {
				t.Errorf("err = %v; want outcome unknown: %v", err, tc.ambiguous)
			}
			if !tc.ambiguous && err != nil {
				t.Errorf("err = %v, want success after the retry", err)
			}
			want := 0
			if tc.created {
				want = 1
			}
			if got := e.identitiesNamed("robot"); got != want {
				t.Errorf("%d identities exist, want %d", got, want)
			}
		})
	}
}

func TestDelete_AppliedButAnswerLost(t *testing.T) {
	e := newEnv(t, platformsim.Scale{PublicImages: -1}, nil)
	c := e.client(nil)
	ctx := ctxT(t)
	id, err := c.CreateIdentity(ctx, "org1", platform.Identity{Name: "short lived"})
	if err != nil {
		t.Fatal(err)
	}
	// The first DELETE reaches the simulator and is applied, but its answer
	// is lost with the connection: the retry's 404 means it is done.
	var lost atomic.Bool
	e.setFront(func(w http.ResponseWriter, r *http.Request, h http.Handler) {
		if r.Method != http.MethodDelete || !lost.CompareAndSwap(false, true) {
			h.ServeHTTP(w, r)
			return
		}
		h.ServeHTTP(httptest.NewRecorder(), r)
		conn, _, err := http.NewResponseController(w).Hijack()
		if err == nil {
			conn.Close()
		}
	})
	if err := c.DeleteIdentity(ctx, id.UID); err != nil {
		t.Fatalf("DeleteIdentity: %v", err)
	}
	if got, want := e.requests("DELETE /iam/v2/identities/{uid}"), 2; got != want {
		t.Errorf("%d deletes sent, want %d", got, want)
	}
	if got := e.identitiesNamed("short lived"); got != 0 {
		t.Errorf("identity still there")
	}
	// Without an ambiguous attempt before it, a 404 stays a 404.
	if err := c.DeleteIdentity(ctx, id.UID); !platform.IsNotFound(err) {
		t.Errorf("DeleteIdentity of a gone identity: %v, want not found", err)
	}
}
