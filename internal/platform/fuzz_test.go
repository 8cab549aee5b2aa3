package platform_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/platform"
)

// FuzzDecodeError feeds arbitrary error bodies to the decoder: whatever
// arrives, the result is an *Error with the status, a bounded excerpt, and
// a message that renders.
func FuzzDecodeError(f *testing.F) {
	for _, seed := range []struct {
		status int
		body   string
	}{
		{
			400,
			`{"code":3,"message":"Invalid argument: name: must match ^[a-z0-9 ._-]{1,}$","details":[{"@type":"type.googleapis.com/google.rpc.ErrorInfo","reason":"INVALID_ARGUMENT","domain":"example.dev"},{"@type":"type.googleapis.com/google.rpc.BadRequest","fieldViolations":[{"field":"name","description":"must match"}]}]}`,
		},
		{
			400,
			`{"code":9,"message":"Precondition failed","details":[{"@type":"type.googleapis.com/google.rpc.PreconditionFailure","violations":[{"type":"RESOURCE_NOT_EMPTY","description":"has repos"}]}]}`,
		},
		{
			404,
			`{"code":5,"message":"Not found","details":[{"@type":"type.googleapis.com/google.rpc.ResourceInfo","resourceType":"repo","resourceName":"a/b","owner":7}]}`,
		},
		{403, `{"errors":[{"code":"DENIED","message":"token audience is not the registry"}]}`},
		{503, `{"error":{"code":14,"message":"Unavailable","details":[]}}`},
		{502, "<html><body><h1>502 Bad Gateway</h1></body></html>"},
		{500, ""},
		{500, "null"},
		{500, `[]`},
		{500, `{"code":"3","message":7}`},
		{400, `{"code":3,"details":[{"@type":7},{"@type":""},{"@type":"ErrorInfo","reason":["x"]},null,"x"]}`},
		{400, `{"code":3,"details":[{"@type":"BadRequest","fieldViolations":{"field":"x"}}]}`},
		{429, `{"errors":[{}, {"code":"TOOMANYREQUESTS"}]}`},
		{500, "\xff\xfe{\"code\":\xc3"},
		{500, strings.Repeat("é", 300)},
		{500, strings.Repeat("[", 10000)},
	} {
		f.Add(seed.status, []byte(seed.body))
	}
	f.Fuzz(func(t *testing.T, status int, body []byte) {
		e := platform.DecodeError(status, body)
		if e == nil {
			t.Fatal("nil *Error")
		}
		if e.Status != status {
			t.Fatalf("status %d, want %d", e.Status, status)
		}
		if len(e.Excerpt) > 200 {
			t.Fatalf("excerpt of %d bytes", len(e.Excerpt))
		}
		if e.Error() == "" {
			t.Fatal("empty error text")
		}
		_ = platform.IsNotFound(e) || platform.IsInvalidArgument(e) || platform.IsFailedPrecondition(e) ||
			platform.IsPermission(e)
	})
}

// FuzzDecodePage feeds arbitrary list envelopes to the page decoder: it
// either fails or returns items, a token and a total that make sense.
func FuzzDecodePage(f *testing.F) {
	for _, seed := range []string{
		`{"repos":[{"uid":"o/a","name":"a","createTime":"2024-01-02T03:04:05.678Z"}],"nextPageToken":"abc","totalCount":"12","skipped":0}`,
		`{"repos":[],"totalCount":"0"}`,
		`{}`,
		`{"totalCount":12}`,
		`{"totalCount":"-3","nextPageToken":""}`,
		`{"totalCount":"99999999999999999999999"}`,
		`{"repos":null,"nextPageToken":null}`,
		`{"repos":{"uid":"x"}}`,
		`{"repos":[{"uid":7}]}`,
		`{"repos":[{"createTime":"yesterday"}]}`,
		`{"nextPageToken":5}`,
		`null`,
		`[]`,
		`"repos"`,
		`{"repos":[`,
		"",
		"\x00",
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		items, next, total, err := platform.DecodeRepoPage(body)
		if err != nil {
			if err.Error() == "" {
				t.Fatal("empty error text")
			}
			return
		}
		if total < -1 {
			t.Fatalf("total %d", total)
		}
		if !json.Valid(body) {
			t.Fatalf("accepted invalid JSON %q", body)
		}
		_ = next
		for i, it := range items {
			if !json.Valid(it.Raw) {
				t.Fatalf("item %d kept raw %q, which is not JSON", i, it.Raw)
			}
		}
	})
}
