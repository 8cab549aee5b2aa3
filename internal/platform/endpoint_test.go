package platform

import "testing"

func TestEndpointOf(t *testing.T) {
	for _, tc := range []struct{ method, path, want string }{
		{"GET", "/registry/v2/repos", "GET /registry/v2/repos"},
		{"GET", "/registry/v2/repos/org1/abc", "GET /registry/v2/repos/{uid}"},
		{"POST", "/events/v2/subscriptions/org1", "POST /events/v2/subscriptions/{uid}"},
		{"GET", "/v2/acme/nginx/_chainguard/history/latest", "GET /v2/{image}/history"},
		{"GET", "/v2/acme/team/nginx/_chainguard/history/latest", "GET /v2/{image}/history"},
		{"GET", "/token", "GET /token"},
		{"GET", "/ping/v2/ping", "GET /ping/v2/ping"},
	} {
		if got := endpointOf(tc.method, tc.path, "chainguard"); got != tc.want {
			t.Errorf("endpointOf(%s %s)=%q, want %q", tc.method, tc.path, got, tc.want)
		}
	}
}
