package platform_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

func TestError_InvalidArgumentFromSimulator(t *testing.T) {
	e := newEnv(t, platformsim.Scale{PublicImages: -1}, nil)
	c := e.client(nil)
	_, err := c.CreateIdentity(ctxT(t), "org1", platform.Identity{})
	apiErr, ok := platform.AsError(err)
	if !ok {
		t.Fatalf("err = %v, want an *Error", err)
	}
	if apiErr.Status != 400 || apiErr.Code != platform.CodeInvalidArgument || apiErr.Reason != "INVALID_ARGUMENT" ||
		apiErr.Domain != "chainguard.dev" {
		t.Errorf("got status %d code %d reason %q domain %q; want 400, 3, INVALID_ARGUMENT, chainguard.dev",
			apiErr.Status, apiErr.Code, apiErr.Reason, apiErr.Domain)
	}
	if len(apiErr.FieldViolations) != 1 || apiErr.FieldViolations[0].Field != "name" ||
		!strings.Contains(apiErr.FieldViolations[0].Description, "^[a-z0-9 ._-]{1,}$") {
		t.Errorf("field violations = %+v, want one on name quoting the pattern", apiErr.FieldViolations)
	}
	if !strings.HasPrefix(apiErr.Message, "Invalid argument: name") {
		t.Errorf("message = %q", apiErr.Message)
	}
	if !platform.IsInvalidArgument(err) || platform.IsFailedPrecondition(err) || platform.IsNotFound(err) {
		t.Error("helpers disagree with the code")
	}
}

func TestError_NotFoundThroughWrapping(t *testing.T) {
	e := newEnv(t, platformsim.Scale{Repos: 1, TagsPerRepo: 1, HistoryPerTag: 1, PublicImages: -1}, nil)
	c := e.client(nil)
	_, err := c.GetRepo(ctxT(t), "org1/no-such-repo")
	wrapped := fmt.Errorf("reconcile: %w", fmt.Errorf("confirm deletion: %w", err))
	if !platform.IsNotFound(wrapped) || platform.IsInvalidArgument(wrapped) {
		t.Fatalf("IsNotFound(%v) = false", wrapped)
	}
	apiErr, _ := platform.AsError(wrapped)
	if apiErr.Code != platform.CodeNotFound || apiErr.ResourceInfo["resourceName"] != "org1/no-such-repo" ||
		apiErr.ResourceInfo["resourceType"] == "" {
		t.Errorf("code %d, resource info %v; want 5 and the repo named", apiErr.Code, apiErr.ResourceInfo)
	}
	// The registry answers in the OCI format; its 404 is a not found too.
	tr := e.sim.Truth()
	_, err = c.HistorySince(ctxT(t), c.PrivateImage(tr.Repos[0].Name), "no-such-tag", time.Time{})
	if apiErr, ok := platform.AsError(err); !ok || !platform.IsNotFound(err) || apiErr.Reason != "MANIFEST_UNKNOWN" {
		t.Errorf("history of a missing tag: %v, want a 404 with reason MANIFEST_UNKNOWN", err)
	}
	// An empty uid would address the collection: refused before sending.
	if _, err := c.GetRepo(ctxT(t), ""); err == nil || e.requests("GET /registry/v2/repos") != 0 {
		t.Errorf("GetRepo(\"\") = %v; want an error and no request", err)
	}
}

// serve starts a plain HTTP server answering every request with status and
// body, counting requests.
func serve(t *testing.T, status int, contentType, body string) (*httptest.Server, *atomic.Int64) {
	t.Helper()
	n := new(atomic.Int64)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", contentType)
		w.WriteHeader(status)
		fmt.Fprint(w, body)
	}))
	t.Cleanup(srv.Close)
	return srv, n
}

func plainClient(t *testing.T, srv *httptest.Server, mod func(*platform.Config)) *platform.Client {
	cfg := platform.Config{BaseURL: srv.URL, RegistryURL: srv.URL, Token: platform.StaticToken(testToken),
		RetryInitialInterval: time.Millisecond, RetryMaxInterval: 5 * time.Millisecond, MaxRetryTime: 200 * time.Millisecond}
	if mod != nil {
		mod(&cfg)
	}
	return mustClient(t, cfg)
}

func TestError_PreconditionFailure(t *testing.T) {
	// The spec's blocked delete, as a gateway maps it: 400 with code 9.
	srv, _ := serve(t, 400, "application/json", `{"code":9,"message":"Precondition failed: group has children",
		"details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"FAILED_PRECONDITION","domain":"example.dev"},
		{"@type":"type.googleapis.com/google.rpc.PreconditionFailure",
		"violations":[{"type":"RESOURCE_NOT_EMPTY","subject":"g1","description":"group g1 has 2 repos"}]}]}`)
	_, err := plainClient(t, srv, nil).GetRepo(ctxT(t), "g1/r1")
	if !platform.IsFailedPrecondition(err) || platform.IsInvalidArgument(err) {
		t.Fatalf("err = %v: want failed precondition and not invalid argument, though both are 400", err)
	}
	apiErr, _ := platform.AsError(err)
	if len(apiErr.PreconditionViolations) != 1 || apiErr.PreconditionViolations[0].Type != "RESOURCE_NOT_EMPTY" ||
		apiErr.Domain != "example.dev" {
		t.Errorf("violations %+v, domain %q", apiErr.PreconditionViolations, apiErr.Domain)
	}
	if !strings.Contains(err.Error(), "precondition RESOURCE_NOT_EMPTY: group g1 has 2 repos") {
		t.Errorf("error text %q lacks the violation", err)
	}
}

func TestError_NonJSONBody(t *testing.T) {
	const html = "<html><head><title>400 Bad Request</title></head><body><h1>Bad Request</h1><p>The proxy refused the request.</p></body></html>"
	t.Run("HTML400", func(t *testing.T) {
		srv, n := serve(t, 400, "text/html", html)
		_, err := plainClient(t, srv, nil).GetRepo(ctxT(t), "g1/r1")
		apiErr, ok := platform.AsError(err)
		if !ok || apiErr.Status != 400 || !strings.Contains(apiErr.Excerpt, "The proxy refused") {
			t.Fatalf("err = %v, want status 400 with an excerpt of the page", err)
		}
		if msg := err.Error(); !strings.Contains(msg, "400") || !strings.Contains(msg, "Bad Request") || len(msg) > 400 {
			t.Errorf("error text %q: want the status and a short excerpt", msg)
		}
		if n.Load() != 1 {
			t.Errorf("%d requests; a 400 is final", n.Load())
		}
	})
	t.Run("Garbled502", func(t *testing.T) {
		srv, n := serve(t, 502, "application/json", `{"code": 14, "message": "upstream conn`+strings.Repeat("x", 5000))
		_, err := plainClient(t, srv, nil).GetRepo(ctxT(t), "g1/r1")
		apiErr, ok := platform.AsError(err)
		if !ok || apiErr.Status != 502 || !strings.HasPrefix(apiErr.Excerpt, `{"code": 14`) || len(apiErr.Excerpt) > 200 {
			t.Fatalf("err = %v: want status 502 with a short excerpt", err)
		}
		if !strings.Contains(err.Error(), "giving up after") || n.Load() < 2 {
			t.Errorf("err = %v after %d requests; want retries, then giving up", err, n.Load())
		}
	})
}

func TestRetryAfter_BothForms(t *testing.T) {
	now := time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)
	date := func(t time.Time) string { return t.Format(http.TimeFormat) }
	for _, tc := range []struct {
		name       string
		retryAfter string
		dateHeader string
		want       time.Duration
	}{
		{"Seconds", "3", "", 3 * time.Second},
		{"SecondsPadded", " 7 ", "", 7 * time.Second},
		{"NegativeSeconds", "-4", "", 0},
		{"DateFromLocalClock", date(now.Add(5 * time.Second)), "", 5 * time.Second},
		// The server's Date wins over a skewed local clock.
		{"DateFromServerDate", date(now.Add(time.Hour + 2*time.Second)), date(now.Add(time.Hour)), 2 * time.Second},
		{"DateInThePast", date(now.Add(-time.Minute)), "", 0},
		{"Garbage", "soon", "", 0},
		{"Absent", "", "", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := http.Header{}
			if tc.retryAfter != "" {
				h.Set("Retry-After", tc.retryAfter)
			}
			if tc.dateHeader != "" {
				h.Set("Date", tc.dateHeader)
			}
			if got := platform.RetryAfter(h, now); got != tc.want {
				t.Errorf("RetryAfter = %v, want %v", got, tc.want)
			}
		})
	}
}

func TestError_Is(t *testing.T) {
	err := fmt.Errorf("outer: %w", &platform.Error{Status: 409, Code: platform.CodeAlreadyExists})
	if !platform.IsAlreadyExists(err) || platform.IsNotFound(err) {
		t.Error("IsAlreadyExists by code failed")
	}
	if !platform.IsRateLimited(&platform.Error{Status: 429}) {
		t.Error("a bare 429 is rate limited")
	}
	if platform.IsNotFound(errors.New("404")) {
		t.Error("a plain error is no *Error")
	}
}
