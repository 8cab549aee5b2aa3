package platform

import (
	"context"
	"encoding/json"
	"fmt"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"time"
)

// Repo is a container repository (platform API v2).
type Repo struct {
	UID         string    `json:"uid"`
	Name        string    `json:"name"`
	Description string    `json:"description,omitempty"`
	CatalogTier string    `json:"catalogTier,omitempty"`
	Aliases     []string  `json:"aliases,omitempty"`
	ActiveTags  []string  `json:"activeTags,omitempty"`
	Bundles     []string  `json:"bundles,omitempty"`
	CreateTime  time.Time `json:"createTime,omitzero"`
	UpdateTime  time.Time `json:"updateTime,omitzero"`
}

// Tag is a tag of a repo.
type Tag struct {
	UID        string    `json:"uid"`
	Name       string    `json:"name"`
	Digest     string    `json:"digest"`
	Deprecated bool      `json:"deprecated"`
	Bundles    []string  `json:"bundles,omitempty"`
	CreateTime time.Time `json:"createTime,omitzero"`
	UpdateTime time.Time `json:"updateTime,omitzero"`
}

// Advisory is a vulnerability advisory.
type Advisory struct {
	UID          string    `json:"uid"`
	AdvisoryID   string    `json:"advisoryId"`
	ArtifactName string    `json:"artifactName"`
	CreateTime   time.Time `json:"createTime,omitzero"`
	UpdateTime   time.Time `json:"updateTime,omitzero"`
}

// ListQuery holds the parameters shared by every List endpoint.
type ListQuery struct {
	DescendantsOf string // uidp.descendants_of
	ChildrenOf    string // uidp.children_of
	Name          string // exact-match name filter
	// OrderBy is sent as order_by when set. Empty keeps the default order,
	// uid ascending, which is also what restart detection relies on.
	OrderBy  string
	PageSize int // default 200, the maximum
	Extra    url.Values
}

func (q ListQuery) values() url.Values {
	v := url.Values{}
	for k, vs := range q.Extra {
		v[k] = append([]string(nil), vs...)
	}
	if q.DescendantsOf != "" {
		v.Set("uidp.descendants_of", q.DescendantsOf)
	}
	if q.ChildrenOf != "" {
		v.Set("uidp.children_of", q.ChildrenOf)
	}
	if q.Name != "" {
		v.Set("name", q.Name)
	}
	if q.OrderBy != "" {
		v.Set("order_by", q.OrderBy)
	}
	size := q.PageSize
	if size <= 0 || size > 200 {
		size = 200
	}
	v.Set("page_size", strconv.Itoa(size))
	return v
}

// ListRestartedError reports that a listing began again from the start in
// the middle (an expired page token restarts it silently), so the items
// already returned must not be taken as all there is, nor the repeated ones
// as new.
type ListRestartedError struct {
	Path       string
	Page       int
	AfterUID   string
	RestartUID string
}

func (e *ListRestartedError) Error() string {
	return fmt.Sprintf("listing %s restarted at page %d (uid %q came after %q): the page token probably expired", e.Path, e.Page, e.RestartUID, e.AfterUID)
}

// Lister walks a listing page by page.
type Lister[T any] struct {
	c    *Client
	path string
	q    ListQuery
	key  string // the envelope member holding the items
	uid  func(T) string

	total int64
	pages int
}

// Total is the listing's totalCount as of the latest page, for progress.
func (l *Lister[T]) Total() int64 { return l.total }

// Pages yields the listing one page at a time. It follows nextPageToken
// until it is absent, stops with an error after Config.MaxPages pages, and
// stops with a *ListRestartedError when uids stop ascending in the default
// order, which is what a silently restarted listing looks like.
func (l *Lister[T]) Pages(ctx context.Context) iter.Seq2[[]T, error] {
	return func(yield func([]T, error) bool) {
		token, last := "", ""
		checkOrder := l.q.OrderBy == "" || l.q.OrderBy == "uid"
		for l.pages = 1; ; l.pages++ {
			if l.pages > l.c.cfg.MaxPages {
				yield(nil, fmt.Errorf("listing %s: more than %d pages; giving up rather than looping", l.path, l.c.cfg.MaxPages))
				return
			}
			v := l.q.values()
			if token != "" {
				v.Set("page_token", token)
			}
			var env map[string]jsonRaw
			if err := l.c.do(ctx, l.c.api(http.MethodGet, l.path, v, nil), &env); err != nil {
				yield(nil, fmt.Errorf("list %s: %w", l.path, err))
				return
			}
			var items []T
			if err := decodeMember(env, l.key, &items); err != nil {
				yield(nil, fmt.Errorf("list %s: %w", l.path, err))
				return
			}
			var next, total string
			decodeMember(env, "nextPageToken", &next)
			if decodeMember(env, "totalCount", &total) == nil && total != "" {
				l.total, _ = strconv.ParseInt(total, 10, 64)
			}
			if checkOrder {
				for _, it := range items {
					u := l.uid(it)
					if last != "" && u <= last {
						yield(nil, &ListRestartedError{Path: l.path, Page: l.pages, AfterUID: last, RestartUID: u})
						return
					}
					last = u
				}
			}
			if !yield(items, nil) || next == "" {
				return
			}
			token = next
		}
	}
}

// All yields the listing item by item.
func (l *Lister[T]) All(ctx context.Context) iter.Seq2[T, error] {
	return func(yield func(T, error) bool) {
		for page, err := range l.Pages(ctx) {
			if err != nil {
				var zero T
				yield(zero, err)
				return
			}
			for _, it := range page {
				if !yield(it, nil) {
					return
				}
			}
		}
	}
}

// Repos lists repos.
func (c *Client) Repos(q ListQuery) *Lister[Repo] {
	return &Lister[Repo]{c: c, path: "/registry/v2/repos", q: q, key: "repos", uid: func(r Repo) string { return r.UID }}
}

// Tags lists tags; set q.ChildrenOf to a repo uid for the tags of one repo.
func (c *Client) Tags(q ListQuery) *Lister[Tag] {
	return &Lister[Tag]{c: c, path: "/registry/v2/tags", q: q, key: "tags", uid: func(t Tag) string { return t.UID }}
}

// Advisories lists advisories.
func (c *Client) Advisories(q ListQuery) *Lister[Advisory] {
	return &Lister[Advisory]{c: c, path: "/vulnerabilities/v2/advisories", q: q, key: "advisories", uid: func(a Advisory) string { return a.UID }}
}

// GetRepo fetches one repo.
func (c *Client) GetRepo(ctx context.Context, uid string) (Repo, error) {
	var r Repo
	err := c.do(ctx, c.api(http.MethodGet, "/registry/v2/repos/"+uid, nil, nil), &r)
	return r, err
}

// GetTag fetches one tag.
func (c *Client) GetTag(ctx context.Context, uid string) (Tag, error) {
	var t Tag
	err := c.do(ctx, c.api(http.MethodGet, "/registry/v2/tags/"+uid, nil, nil), &t)
	return t, err
}

// GetAdvisory fetches one advisory.
func (c *Client) GetAdvisory(ctx context.Context, uid string) (Advisory, error) {
	var a Advisory
	err := c.do(ctx, c.api(http.MethodGet, "/vulnerabilities/v2/advisories/"+uid, nil, nil), &a)
	return a, err
}

type jsonRaw = json.RawMessage

// decodeMember decodes env[key] into v; an absent member leaves v alone.
func decodeMember(env map[string]jsonRaw, key string, v any) error {
	raw, ok := env[key]
	if !ok || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decode %q: %w", key, err)
	}
	return nil
}
