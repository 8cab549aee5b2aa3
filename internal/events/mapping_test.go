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
	push := func(fields map[string]any) map[string]any { return map[string]any{"body": fields} }
	for _, tc := range []struct {
		name, typ, subject string
		body               any
		want               string // "" for no job
		unknown            bool
		reason             string // the rejection, if any
	}{
		{
			name:    "Push",
			typ:     "dev.chainguard.registry.push.v1",
			subject: "org1/r",
			body:    push(map[string]any{"repository": "org1/r", "repo_id": "org1/r", "tag": "latest", "type": "manifest"}),
			want:    "tag org1/r latest",
		},
		{
			name: "PushWithoutSubject",
			typ:  "dev.chainguard.registry.push.v1",
			body: push(map[string]any{"repo_id": "org1/r", "tag": "latest", "type": "manifest"}),
			want: "tag org1/r latest",
		},
		{
			name:    "PushSubjectIsName",
			typ:     "dev.chainguard.registry.push.v1",
			subject: "chainguard/nginx",
			body: push(
				map[string]any{"repository": "chainguard/nginx", "repo_id": "org1/r", "tag": "latest", "type": "manifest"},
			),
			want: "tag org1/r latest",
		},
		{
			name: "PushByName",
			typ:  "dev.chainguard.registry.push.v1",
			body: push(map[string]any{"repository": "nginx", "tag": "latest", "type": "manifest"}),
			want: "tag nginx latest",
		},
		{
			name: "PushByDigest",
			typ:  "dev.chainguard.registry.push.v1",
			body: push(map[string]any{"repo_id": "org1/r", "type": "manifest", "digest": "sha256:x"}),
		},
		{
			name: "FailedPush",
			typ:  "dev.chainguard.registry.push.v1",
			body: push(
				map[string]any{"repo_id": "org1/r", "tag": "latest", "type": "manifest", "error": map[string]any{"status": 500}},
			),
		},
		{
			name: "BlobPush",
			typ:  "dev.chainguard.registry.push.v1",
			body: push(map[string]any{"repo_id": "org1/r", "tag": "latest", "type": "blob"}),
		},
		{
			name:   "PushNoRepo",
			typ:    "dev.chainguard.registry.push.v1",
			body:   push(map[string]any{"tag": "latest", "type": "manifest"}),
			reason: ReasonTypeMismatch,
		},
		{
			name:    "PushOtherSubject",
			typ:     "dev.chainguard.registry.push.v1",
			subject: "org1/attacker",
			body:    push(map[string]any{"repo_id": "org1/r", "tag": "latest", "type": "manifest"}),
			reason:  ReasonSubjectMismatch,
		},
		{
			name:    "PushOtherSubjectOfIgnoredPush",
			typ:     "dev.chainguard.registry.push.v1",
			subject: "org1/attacker",
			body:    push(map[string]any{"repo_id": "org1/r", "type": "blob"}),
			reason:  ReasonSubjectMismatch,
		},
		{
			name:    "PullBodyAsPush",
			typ:     "dev.chainguard.registry.push.v1",
			subject: "org1/r",
			body:    push(map[string]any{"repo_id": "org1/r", "tag": "latest", "type": "manifest", "method": "HEAD"}),
			reason:  ReasonTypeMismatch,
		},
		{
			name:    "TagBodyAsPush",
			typ:     "dev.chainguard.registry.push.v1",
			subject: "org1/r/t",
			body:    push(map[string]any{"uid": "org1/r/t", "name": "latest"}),
			reason:  ReasonTypeMismatch,
		},
		{
			name:    "TagCreated",
			typ:     "dev.chainguard.api.platform.registry.tag.created.v1",
			subject: "org1/r/t",
			body:    push(map[string]any{"uid": "org1/r/t", "name": "latest"}),
			want:    "repo org1/r",
		},
		{
			name:    "TagUpdatedV1Body",
			typ:     "dev.chainguard.api.platform.registry.tag.updated.v1",
			subject: "org1/r/t",
			body:    push(map[string]any{"id": "org1/r/t", "name": "latest"}),
			want:    "repo org1/r",
		},
		{
			name: "TagDeletedWithoutSubject",
			typ:  "dev.chainguard.api.platform.registry.tag.deleted.v1",
			body: push(map[string]any{"uid": "org1/r/t"}),
			want: "repo org1/r",
		},
		{
			name:    "TagOtherSubject",
			typ:     "dev.chainguard.api.platform.registry.tag.deleted.v1",
			subject: "org1/attacker/t",
			body:    push(map[string]any{"uid": "org1/r/t"}),
			reason:  ReasonSubjectMismatch,
		},
		{
			name:    "TagBodyNamesNothing",
			typ:     "dev.chainguard.api.platform.registry.tag.deleted.v1",
			subject: "org1/r/t",
			body:    map[string]any{},
		},
		{
			name:   "TagUIDWithoutRepo",
			typ:    "dev.chainguard.api.platform.registry.tag.deleted.v1",
			body:   push(map[string]any{"uid": "t"}),
			reason: ReasonMalformed,
		},
		{
			name:    "PushBodyAsTagEvent",
			typ:     "dev.chainguard.api.platform.registry.tag.created.v1",
			subject: "org1/attacker/t",
			body:    push(map[string]any{"repo_id": "org1/r", "tag": "latest", "type": "manifest"}),
			reason:  ReasonTypeMismatch,
		},
		{
			name:    "RepoDeleted",
			typ:     "dev.chainguard.api.platform.registry.repo.deleted.v1",
			subject: "org1/r",
			body:    push(map[string]any{"uid": "org1/r"}),
			want:    "repos",
		},
		{
			name:    "RepoOtherSubject",
			typ:     "dev.chainguard.api.platform.registry.repo.updated.v1",
			subject: "org1/x",
			body:    push(map[string]any{"uid": "org1/r"}),
			reason:  ReasonSubjectMismatch,
		},
		{
			name:   "PushBodyAsRepoEvent",
			typ:    "dev.chainguard.api.platform.registry.repo.created.v1",
			body:   push(map[string]any{"repo_id": "org1/r", "tag": "latest", "type": "manifest"}),
			reason: ReasonTypeMismatch,
		},
		{name: "Pull", typ: "dev.chainguard.registry.pull.v1", body: map[string]any{}},
		{
			name:    "IAM",
			typ:     "dev.chainguard.api.iam.group.created.v1",
			subject: "org1/g",
			body:    map[string]any{},
			unknown: true,
		},
		{name: "OtherVendor", typ: "dev.example.registry.push.v1", body: map[string]any{}, unknown: true},
		{name: "NotJSON", typ: "dev.chainguard.registry.push.v1", body: "{", reason: ReasonMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got calls
			r := NewReceiver(Config{Issuer: "https://issuer.invalid", TypePrefix: "dev.chainguard."}, &got, nil)
			body, _ := json.Marshal(tc.body)
			if s, ok := tc.body.(string); ok {
				body = []byte(s)
			}
			j, unknown, rej := r.mapEvent(tc.typ, tc.subject, body)
			if tc.reason != "" {
				if rej == nil || rej.reason != tc.reason {
					t.Fatalf("rejection=%+v, want reason %q", rej, tc.reason)
				}
				return
			}
			if rej != nil {
				t.Fatalf("rejected: %+v", rej)
			}
			if unknown != tc.unknown {
				t.Fatalf("unknown=%v, want %v", unknown, tc.unknown)
			}
			if tc.want == "" {
				if j != nil {
					t.Fatal("want no job")
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
