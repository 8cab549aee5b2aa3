package events

import (
	"context"
	"encoding/json"
	"net/http"
	"path"
	"strings"
)

// eventBody holds the fields syncd reads from an event's signed body, for
// every kind of body a delivery may carry: a registry push or pull, or a
// platform resource (or the request that deleted it). Which of them are set
// tells the kinds apart, so that a body sent under another Ce-Type than its
// own is recognised.
type eventBody struct {
	// Registry pushes and pulls.
	Repository string `json:"repository"`
	RepoID     string `json:"repo_id"`
	Tag        string `json:"tag"`
	Type       string `json:"type"`
	Method     string `json:"method"` // pulls only: GET or HEAD
	Error      *struct {
		Status  int    `json:"status"`
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`

	// Platform resources: the resource's uid (API v2), or id (v1).
	UID string `json:"uid"`
	ID  string `json:"id"`
}

// registryAccess reports whether the body is a registry push or pull.
func (b *eventBody) registryAccess() bool { return b.RepoID != "" || b.Repository != "" }

// resource is the uid of the platform resource the body is about.
func (b *eventBody) resource() string {
	if b.UID != "" {
		return b.UID
	}
	return b.ID
}

// mapEvent turns a delivery's signed body into the crawler job it asks for,
// or nil when it asks for none (unknown says whether because its type is
// one syncd does not know). What to refresh comes from the body alone: the
// Ce-Type and Ce-Subject headers are not signed, so they only choose how to
// read the body and are refused when they disagree with it. Types syncd
// does not know are acknowledged, so that a new kind of event upstream
// never blocks delivery.
func (r *Receiver) mapEvent(typ, subject string, body []byte) (*job, bool, *rejection) {
	kind, ok := strings.CutPrefix(typ, r.cfg.TypePrefix)
	if !ok {
		r.log.Debug("ignoring event of another vendor's type", "type", typ)
		return nil, true, nil
	}
	var env struct {
		Body json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, false, refusal(http.StatusBadRequest, ReasonMalformed, "body is not JSON: %v", err)
	}
	var b eventBody
	if len(env.Body) > 0 && string(env.Body) != "null" {
		if err := json.Unmarshal(env.Body, &b); err != nil {
			return nil, false, refusal(http.StatusBadRequest, ReasonMalformed, "event body: %v", err)
		}
	}
	switch kind {
	case "registry.push.v1":
		j, rej := r.mapPush(&b, subject)
		return j, false, rej
	case "api.platform.registry.tag.created.v1",
		"api.platform.registry.tag.updated.v1",
		"api.platform.registry.tag.deleted.v1":
		tag, rej := r.resourceOf(&b, typ, subject)
		if rej != nil || tag == "" {
			return nil, false, rej
		}
		// A tag's uid is its repo's uid, a slash and one more segment.
		if !strings.Contains(tag, "/") {
			return nil, false, refusal(http.StatusBadRequest, ReasonMalformed, "tag uid %q names no repo", tag)
		}
		repo := path.Dir(tag)
		return &job{
			key: "repo\x00" + repo,
			run: func(ctx context.Context) error { return r.jobs.RefreshRepo(ctx, repo) },
		}, false, nil
	case "api.platform.registry.repo.created.v1",
		"api.platform.registry.repo.deleted.v1",
		"api.platform.registry.repo.updated.v1":
		repo, rej := r.resourceOf(&b, typ, subject)
		if rej != nil || repo == "" {
			return nil, false, rej
		}
		return &job{key: "repos", run: r.jobs.RefreshRepos}, false, nil
	case "registry.pull.v1":
		return nil, false, nil
	default:
		r.log.Debug("ignoring event type syncd does not use", "type", typ)
		return nil, true, nil
	}
}

// mapPush reads a registry push: the tag it moved, if any.
func (r *Receiver) mapPush(b *eventBody, subject string) (*job, *rejection) {
	// A pull's body or a platform resource's body under the push type
	// would aim a refresh at something nobody pushed.
	if !b.registryAccess() || b.resource() != "" || b.Method == http.MethodGet || b.Method == http.MethodHead {
		return nil, refusal(http.StatusForbidden, ReasonTypeMismatch, "the body is not a registry push")
	}
	// repository has been a name and a uid; repo_id is always the uid.
	repo := b.RepoID
	if repo == "" {
		repo = b.Repository
	}
	// The subject of a push is the repository pushed to.
	if subject != "" && subject != b.RepoID && subject != b.Repository {
		return nil, refusal(
			http.StatusForbidden,
			ReasonSubjectMismatch,
			"Ce-Subject %q is not the pushed repository %q",
			subject,
			repo,
		)
	}
	// Failed pushes, pushes by digest and pushes of blobs change no tag.
	if b.Error != nil || b.Tag == "" || b.Type != "manifest" {
		return nil, nil
	}
	tag := b.Tag
	return &job{
		key: "tag\x00" + repo + "\x00" + tag,
		run: func(ctx context.Context) error { return r.jobs.RefreshTag(ctx, repo, tag) },
	}, nil
}

// resourceOf returns the uid of the platform resource a resource event's
// body is about, or "" when the body names none: such an event asks for
// nothing, because the only other place naming a resource is the unsigned
// Ce-Subject; the next crawl catches the change instead.
func (r *Receiver) resourceOf(b *eventBody, typ, subject string) (string, *rejection) {
	if b.registryAccess() {
		return "", refusal(http.StatusForbidden, ReasonTypeMismatch, "the body is a registry push or pull, not a %s", typ)
	}
	uid := b.resource()
	if uid == "" {
		r.log.Info("pushed event's body names no resource; leaving it to the next crawl", "type", typ)
		return "", nil
	}
	if subject != "" && subject != uid {
		return "", refusal(
			http.StatusForbidden,
			ReasonSubjectMismatch,
			"Ce-Subject %q is not the body's resource %q",
			subject,
			uid,
		)
	}
	return uid, nil
}
