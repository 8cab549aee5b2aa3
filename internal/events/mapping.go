package events

import (
	"context"
	"encoding/json"
	"fmt"
	"path"
	"strings"
)

// pushBody is the body of a registry push event.
type pushBody struct {
	Repository string `json:"repository"`
	RepoID     string `json:"repo_id"`
	Tag        string `json:"tag"`
	Digest     string `json:"digest"`
	Type       string `json:"type"`
	Error      *struct {
		Status  int    `json:"status"`
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// mapEvent turns a verified delivery into the crawler job it asks for, or
// nil when it asks for none. Types it does not know are counted and
// acknowledged, so that a new kind of event upstream never blocks delivery.
func (r *Receiver) mapEvent(id, typ, subject string, body []byte) (*job, error) {
	kind, ok := strings.CutPrefix(typ, r.cfg.TypePrefix)
	if !ok {
		r.Stats.Unknown.Add(1)
		r.log.Debug("ignoring event of another vendor's type", "type", typ)
		return nil, nil
	}
	var env struct {
		Body json.RawMessage `json:"body"`
	}
	if err := json.Unmarshal(body, &env); err != nil {
		return nil, fmt.Errorf("body is not JSON: %v", err)
	}
	mk := func(run func(ctx context.Context) error) *job { return &job{id: id, typ: typ, run: run} }
	switch kind {
	case "registry.push.v1":
		var p pushBody
		if len(env.Body) > 0 {
			if err := json.Unmarshal(env.Body, &p); err != nil {
				return nil, fmt.Errorf("push body: %v", err)
			}
		}
		// Failed pushes, pushes by digest and pushes of blobs change no tag.
		if p.Error != nil || p.Tag == "" || p.Type != "manifest" {
			r.Stats.Ignored.Add(1)
			return nil, nil
		}
		// repository has been a name and a uid; repo_id is always the uid.
		repo := p.RepoID
		if repo == "" {
			repo = p.Repository
		}
		if repo == "" {
			return nil, fmt.Errorf("push event names no repository")
		}
		return mk(func(ctx context.Context) error { return r.jobs.RefreshTag(ctx, repo, p.Tag) }), nil
	case "api.platform.registry.tag.created.v1", "api.platform.registry.tag.deleted.v1":
		// A tag's uid is its repo's uid, a slash and one more segment.
		if subject == "" || !strings.Contains(subject, "/") {
			return nil, fmt.Errorf("tag event needs the tag's uid in Ce-Subject")
		}
		repo := path.Dir(subject)
		return mk(func(ctx context.Context) error { return r.jobs.RefreshRepo(ctx, repo) }), nil
	case "api.platform.registry.repo.created.v1", "api.platform.registry.repo.deleted.v1", "api.platform.registry.repo.updated.v1":
		return mk(func(ctx context.Context) error { return r.jobs.RefreshRepos(ctx) }), nil
	case "registry.pull.v1":
		r.Stats.Ignored.Add(1)
		return nil, nil
	default:
		r.Stats.Unknown.Add(1)
		r.log.Debug("ignoring event type syncd does not use", "type", typ)
		return nil, nil
	}
}
