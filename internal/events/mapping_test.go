package events

import (
	"context"
	"encoding/json"
	"testing"
)

type calls []string

func (c *calls) RefreshTag(_ context.Context, repo, tag string) error {
	*c = append(*c, "tag "+repo+" "+tag)
	return nil
}
func (c *calls) RefreshRepo(_ context.Context, repo string) error {
	*c = append(*c, "repo "+repo)
	return nil
}
func (c *calls) RefreshRepos(context.Context) error { *c = append(*c, "repos"); return nil }

func TestMapEvent(t *testing.T) {
	for _, tc := range []struct {
		name, typ, subject string
		body               any
		want               string // "" for no job
		unknown            bool
		bad                bool
	}{
		{name: "Push", typ: "dev.chainguard.registry.push.v1", body: map[string]any{"body": map[string]any{"repository": "org1/r", "repo_id": "org1/r", "tag": "latest", "type": "manifest"}}, want: "tag org1/r latest"},
		{name: "PushByName", typ: "dev.chainguard.registry.push.v1", body: map[string]any{"body": map[string]any{"repository": "nginx", "tag": "latest", "type": "manifest"}}, want: "tag nginx latest"},
		{name: "PushByDigest", typ: "dev.chainguard.registry.push.v1", body: map[string]any{"body": map[string]any{"repo_id": "org1/r", "type": "manifest", "digest": "sha256:x"}}},
		{name: "FailedPush", typ: "dev.chainguard.registry.push.v1", body: map[string]any{"body": map[string]any{"repo_id": "org1/r", "tag": "latest", "type": "manifest", "error": map[string]any{"status": 500}}}},
		{name: "BlobPush", typ: "dev.chainguard.registry.push.v1", body: map[string]any{"body": map[string]any{"repo_id": "org1/r", "tag": "latest", "type": "blob"}}},
		{name: "PushNoRepo", typ: "dev.chainguard.registry.push.v1", body: map[string]any{"body": map[string]any{"tag": "latest", "type": "manifest"}}, bad: true},
		{name: "TagCreated", typ: "dev.chainguard.api.platform.registry.tag.created.v1", subject: "org1/r/t", body: map[string]any{}, want: "repo org1/r"},
		{name: "TagDeletedNoSubject", typ: "dev.chainguard.api.platform.registry.tag.deleted.v1", body: map[string]any{}, bad: true},
		{name: "RepoDeleted", typ: "dev.chainguard.api.platform.registry.repo.deleted.v1", subject: "org1/r", body: map[string]any{}, want: "repos"},
		{name: "Pull", typ: "dev.chainguard.registry.pull.v1", body: map[string]any{}},
		{name: "IAM", typ: "dev.chainguard.api.iam.group.created.v1", subject: "org1/g", body: map[string]any{}, unknown: true},
		{name: "OtherVendor", typ: "dev.example.registry.push.v1", body: map[string]any{}, unknown: true},
		{name: "NotJSON", typ: "dev.chainguard.registry.push.v1", body: "{", bad: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got calls
			r := NewReceiver(Config{Issuer: "https://issuer.invalid"}, &got, nil)
			body, _ := json.Marshal(tc.body)
			if s, ok := tc.body.(string); ok {
				body = []byte(s)
			}
			j, err := r.mapEvent("id", tc.typ, tc.subject, body)
			if tc.bad {
				if err == nil {
					t.Fatal("want an error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if tc.want == "" {
				if j != nil {
					t.Fatal("want no job")
				}
				if tc.unknown && r.Stats.Unknown.Load() != 1 {
					t.Fatalf("unknown=%d, want 1", r.Stats.Unknown.Load())
				}
				return
			}
			if j == nil {
				t.Fatalf("want job %q, got none", tc.want)
			}
			if err := j.run(context.Background()); err != nil {
				t.Fatal(err)
			}
			if len(got) != 1 || got[0] != tc.want {
				t.Fatalf("calls=%q, want [%q]", got, tc.want)
			}
		})
	}
}
