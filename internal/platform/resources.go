package platform

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// The resources below model the fields syncd uses. The gateway writes
// protojson: fields at their zero value may be absent, timestamps carry 0,
// 3, 6 or 9 fractional digits, and fields are added without a version
// change; each resource keeps its JSON as received in Raw, so that nothing
// is lost for the fields not modelled here.

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
	// Raw is the repo's JSON as received, set by listings and GetRepo.
	Raw json.RawMessage `json:"-"`
}

// Tag is a tag of a repo.
type Tag struct {
	UID        string    `json:"uid"`
	Name       string    `json:"name"`
	Digest     string    `json:"digest"`
	Deprecated bool      `json:"deprecated"`
	Bundles    []string  `json:"bundles,omitempty"`
	CreateTime time.Time `json:"createTime,omitzero"` // the v2 Tag has none; kept for older servers
	UpdateTime time.Time `json:"updateTime,omitzero"`
	// Raw is the tag's JSON as received, set by listings and GetTag.
	Raw json.RawMessage `json:"-"`
}

// Advisory is a vulnerability advisory: which artifact and component it is
// about, the CVE and GHSA ids it covers, their severities, and its
// lifecycle (Events, oldest first).
type Advisory struct {
	UID          string    `json:"uid"`
	AdvisoryID   string    `json:"advisoryId"`
	ArtifactName string    `json:"artifactName"`
	CreateTime   time.Time `json:"createTime,omitzero"`
	UpdateTime   time.Time `json:"updateTime,omitzero"`
	// DeleteTime is set on a withdrawn advisory.
	DeleteTime           time.Time  `json:"deleteTime,omitzero"`
	Author               string     `json:"author,omitempty"`
	ArtifactType         string     `json:"artifactType,omitempty"`
	ArtifactArchitecture string     `json:"artifactArchitecture,omitempty"`
	ComponentName        string     `json:"componentName,omitempty"`
	ComponentLocation    string     `json:"componentLocation,omitempty"`
	ComponentType        string     `json:"componentType,omitempty"`
	Aliases              []string   `json:"aliases,omitempty"` // CVE and GHSA ids
	LegacyAdvisoryID     string     `json:"legacyAdvisoryId,omitempty"`
	Severities           []Severity `json:"severities,omitempty"`
	// Events is the advisory's lifecycle.
	Events []AdvisoryEvent `json:"events,omitempty"`
	// Raw is the advisory's JSON as received, set by listings and GetAdvisory.
	Raw json.RawMessage `json:"-"`
}

// Withdrawn reports whether the advisory was withdrawn (has a deleteTime).
func (a Advisory) Withdrawn() bool { return !a.DeleteTime.IsZero() }

// Severity is one scored severity of an advisory.
type Severity struct {
	Type  string `json:"type"`  // TYPE_CVSS_V2, TYPE_CVSS_V3, TYPE_CVSS_V4
	Score string `json:"score"` // a CVSS vector, or a number
}

// rawKeeper is a resource that keeps its JSON as received.
type rawKeeper interface{ keepRaw(json.RawMessage) }

func (r *Repo) keepRaw(b json.RawMessage)     { r.Raw = b }
func (t *Tag) keepRaw(b json.RawMessage)      { t.Raw = b }
func (a *Advisory) keepRaw(b json.RawMessage) { a.Raw = b }

// ListQuery holds the parameters shared by every List endpoint.
type ListQuery struct {
	DescendantsOf string // uidp.descendants_of
	ChildrenOf    string // uidp.children_of
	Name          string // exact-match name filter
	// OrderBy is sent as order_by when set. Empty keeps the default order,
	// uid ascending, which is also what restart detection relies on.
	OrderBy  string
	PageSize int // default 200, the maximum
	// The tag list hides three tag families unless asked: referrers
	// ("sha256-*": signatures, attestations), dates ("*-20yymmdd") and
	// epochs ("*-r<N>"). Each is sent only when true.
	IncludeReferrers, IncludeDates, IncludeEpochs bool
	// UpdatedSince, when not zero, lists only what was updated after it
	// (tags).
	UpdatedSince time.Time
	// Digest, when set, lists only the tags pointing at it.
	Digest string
	Extra  url.Values
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
	for name, on := range map[string]bool{
		"include_referrers": q.IncludeReferrers,
		"include_dates":     q.IncludeDates,
		"include_epochs":    q.IncludeEpochs,
	} {
		if on {
			v.Set(name, "true")
		}
	}
	if !q.UpdatedSince.IsZero() {
		v.Set("updated_since", q.UpdatedSince.UTC().Format(time.RFC3339Nano))
	}
	if q.Digest != "" {
		v.Set("digest", q.Digest)
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
	return fmt.Sprintf(
		"listing %s restarted at page %d (uid %q came after %q): the page token probably expired",
		e.Path,
		e.Page,
		e.RestartUID,
		e.AfterUID,
	)
}

// ErrTooManyPages is returned (wrapped) by a listing that reached
// Config.MaxPages: a page token that never ends is a known upstream fault,
// and following it would never finish.
var ErrTooManyPages = errors.New("too many pages")

// page is one decoded List response.
type page[T any] struct {
	items []T
	next  string
	total int64 // -1 when the response carried no usable totalCount
}

// decodePage decodes a List response envelope whose items are under key.
// An absent item member is an empty page (proto JSON leaves out empty
// lists). totalCount is a string holding an integer; a number is accepted
// too, and an unusable one is ignored, since it only feeds progress.
func decodePage[T any](body []byte, key string) (page[T], error) {
	p := page[T]{total: -1}
	var env map[string]json.RawMessage
	if err := json.Unmarshal(body, &env); err != nil {
		return p, fmt.Errorf("decode list envelope: %w (body starts %q)", err, excerpt(body, 80))
	}
	if env == nil {
		return p, fmt.Errorf("decode list envelope: not an object (body starts %q)", excerpt(body, 80))
	}
	if err := decodeItems(env, key, &p.items); err != nil {
		return p, err
	}
	if err := decodeMember(env, "nextPageToken", &p.next); err != nil {
		return p, err
	}
	if raw, ok := env["totalCount"]; ok {
		var s string
		if json.Unmarshal(raw, &s) != nil {
			s = string(raw)
		}
		if n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64); err == nil && n >= 0 {
			p.total = n
		}
	}
	return p, nil
}

// Lister walks a listing page by page. A Lister is for one walk at a time;
// Total reports on the latest one.
type Lister[T any] struct {
	c    *Client
	path string
	q    ListQuery
	key  string // the envelope member holding the items
	uid  func(T) string

	total atomic.Int64
}

// Total is the listing's totalCount as of the latest page, for progress;
// -1 before the first page or when the server sent none.
func (l *Lister[T]) Total() int64 { return l.total.Load() }

// Pages yields the listing one page at a time. It follows nextPageToken
// until it is absent, and stops with an error wrapping ErrTooManyPages
// after Config.MaxPages pages, or when the server hands back the token it
// was given.
//
// It stops with a *ListRestartedError when a uid comes back that an
// earlier page already returned, or (in the default order, uid ascending)
// when uids stop ascending: that is what a silently restarted listing looks
// like, and the repeated items must not be taken for new ones. Under an
// order by a field that changes (update_time), an item updated between two
// pages can move and come back too; that is reported the same way, as the
// listing is no longer a consistent snapshot either.
func (l *Lister[T]) Pages(ctx context.Context) iter.Seq2[[]T, error] {
	return func(yield func([]T, error) bool) {
		l.total.Store(-1)
		token, last := "", ""
		checkOrder := l.q.OrderBy == "" || l.q.OrderBy == "uid" || l.q.OrderBy == "uid asc"
		// In uid order, ascending uids already rule out a repeat; a set of
		// every uid listed is kept only under another order. It held the
		// whole listing's uids (200,000 tags and 80,000 advisories at four
		// times the benchmark organization, about 35 MB) and grew the
		// crawl's memory with the organization.
		var seen map[string]struct{}
		if !checkOrder {
			seen = make(map[string]struct{})
		}
		for n := 1; ; n++ {
			if n > l.c.cfg.MaxPages {
				yield(
					nil,
					fmt.Errorf(
						"list %s: more than %d pages; giving up rather than looping: %w",
						l.path,
						l.c.cfg.MaxPages,
						ErrTooManyPages,
					),
				)
				return
			}
			v := l.q.values()
			if token != "" {
				v.Set("page_token", token)
			}
			var body json.RawMessage
			if err := l.c.do(ctx, l.c.api(http.MethodGet, l.path, v, nil), &body); err != nil {
				yield(nil, fmt.Errorf("list %s, page %d: %w", l.path, n, err))
				return
			}
			p, err := decodePage[T](body, l.key)
			if err != nil {
				yield(nil, fmt.Errorf("list %s, page %d: %w", l.path, n, err))
				return
			}
			if p.total >= 0 {
				l.total.Store(p.total)
			}
			for _, it := range p.items {
				u := l.uid(it)
				_, dup := seen[u]
				if dup || (checkOrder && last != "" && u <= last) {
					yield(nil, &ListRestartedError{Path: l.path, Page: n, AfterUID: last, RestartUID: u})
					return
				}
				if seen != nil {
					seen[u] = struct{}{}
				}
				last = u
			}
			if !yield(p.items, nil) || p.next == "" {
				return
			}
			if p.next == token {
				yield(
					nil,
					fmt.Errorf("list %s, page %d: the server returned the page token it was given: %w", l.path, n, ErrTooManyPages),
				)
				return
			}
			token = p.next
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

// Collect reads the whole listing into a slice.
func (l *Lister[T]) Collect(ctx context.Context) ([]T, error) {
	var out []T
	for page, err := range l.Pages(ctx) {
		if err != nil {
			return out, err
		}
		out = append(out, page...)
	}
	return out, nil
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
	return &Lister[Advisory]{
		c:    c,
		path: "/vulnerabilities/v2/advisories",
		q:    q,
		key:  "advisories",
		uid:  func(a Advisory) string { return a.UID },
	}
}

// GetRepo fetches one repo.
func (c *Client) GetRepo(ctx context.Context, uid string) (Repo, error) {
	var r Repo
	if err := c.get(ctx, "/registry/v2/repos", uid, &r); err != nil {
		return r, fmt.Errorf("get repo %s: %w", uid, err)
	}
	return r, nil
}

// GetTag fetches one tag.
func (c *Client) GetTag(ctx context.Context, uid string) (Tag, error) {
	var t Tag
	if err := c.get(ctx, "/registry/v2/tags", uid, &t); err != nil {
		return t, fmt.Errorf("get tag %s: %w", uid, err)
	}
	return t, nil
}

// GetAdvisory fetches one advisory.
func (c *Client) GetAdvisory(ctx context.Context, uid string) (Advisory, error) {
	var a Advisory
	if err := c.get(ctx, "/vulnerabilities/v2/advisories", uid, &a); err != nil {
		return a, fmt.Errorf("get advisory %s: %w", uid, err)
	}
	return a, nil
}

// get fetches the resource uid of collection into out, keeping its JSON
// as received when out keeps it.
func (c *Client) get(ctx context.Context, collection, uid string, out any) error {
	var raw json.RawMessage
	if err := c.call(ctx, http.MethodGet, collection, uid, nil, &raw); err != nil {
		return err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return fmt.Errorf("decode: %w", err)
	}
	if k, ok := out.(rawKeeper); ok {
		k.keepRaw(raw)
	}
	return nil
}

// decodeItems decodes the list env[key] into *items, giving each item
// that keeps its JSON (rawKeeper) its own element of the list: a slice of
// the envelope's copy, so keeping it costs no allocation. One decoder
// walks the list, so its state is reused from item to item.
func decodeItems[T any](env map[string]json.RawMessage, key string, items *[]T) error {
	var zero T
	if _, keeps := any(&zero).(rawKeeper); !keeps {
		return decodeMember(env, key, items)
	}
	raw, ok := env[key]
	if !ok || string(raw) == "null" {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('[') {
		return fmt.Errorf("decode %q: not a list (starts %q)", key, excerpt(raw, 20))
	}
	var out []T
	for dec.More() {
		start := dec.InputOffset()
		out = append(out, zero)
		it := &out[len(out)-1]
		if err := dec.Decode(it); err != nil {
			return fmt.Errorf("decode %q, item %d: %w", key, len(out)-1, err)
		}
		e := bytes.TrimLeft(raw[start:dec.InputOffset()], " \t\r\n,")
		any(it).(rawKeeper).keepRaw(e[:len(e):len(e)])
	}
	*items = out
	return nil
}

// decodeMember decodes env[key] into v; an absent member leaves v alone.
func decodeMember(env map[string]json.RawMessage, key string, v any) error {
	raw, ok := env[key]
	if !ok || string(raw) == "null" {
		return nil
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("decode %q: %w", key, err)
	}
	return nil
}
