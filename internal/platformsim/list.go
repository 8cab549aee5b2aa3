package platformsim

import (
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
)

const (
	defaultPageSize = 50
	maxPageSize     = 200
)

// paramAliases maps every accepted spelling of a list parameter to its
// snake_case name: the upstream accepts both spellings.
func canonicalParam(name string) string {
	switch name {
	case "pageSize":
		return "page_size"
	case "pageToken":
		return "page_token"
	case "orderBy":
		return "order_by"
	case "uidp.childrenOf":
		return "uidp.children_of"
	case "uidp.descendantsOf":
		return "uidp.descendants_of"
	case "updatedSince":
		return "updated_since"
	case "includeReferrers":
		return "include_referrers"
	case "includeDates":
		return "include_dates"
	case "includeEpochs":
		return "include_epochs"
	}
	// The advisory list's filters, kept in camelCase.
	if c := camelCase(name); advisoryFilters[c] != nil || c == "latestEventType" || c == "excludeEventAuthors" {
		return c
	}
	return name
}

// query is a request's query with parameter names canonicalized.
type query map[string][]string

func canonicalQuery(q url.Values) query {
	out := query{}
	for k, vs := range q {
		c := canonicalParam(k)
		out[c] = append(out[c], vs...)
	}
	return out
}

// flag reads a boolean parameter (absent: false).
func (q query) flag(name string) (bool, error) {
	v := q.get(name)
	if v == "" {
		return false, nil
	}
	return strconv.ParseBool(v)
}

func (q query) get(name string) string {
	if vs := q[name]; len(vs) > 0 {
		return vs[0]
	}
	return ""
}

// list returns the values of a multi-valued filter, given repeated or
// comma-separated.
func (q query) list(name string) []string {
	var out []string
	for _, v := range q[name] {
		for _, p := range strings.Split(v, ",") {
			if p = strings.TrimSpace(p); p != "" {
				out = append(out, p)
			}
		}
	}
	return out
}

// orderField is one term of order_by.
type orderField struct {
	field string
	desc  bool
}

type listParams struct {
	q             query
	childrenOf    string
	descendantsOf string
	name          string
	pageSize      int
	skip          int
	pageToken     string
	order         []orderField
	filterHash    string
}

// parseListParams validates the list parameters shared by every List
// endpoint. fieldAliases maps accepted order_by spellings to sort fields.
func (s *Sim) parseListParams(r *http.Request, fieldAliases map[string]string) (listParams, *apiError) {
	q := canonicalQuery(r.URL.Query())
	p := listParams{
		q:             q,
		childrenOf:    q.get("uidp.children_of"),
		descendantsOf: q.get("uidp.descendants_of"),
		name:          q.get("name"),
		pageToken:     q.get("page_token"),
		pageSize:      defaultPageSize,
	}
	if v := q.get("page_size"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			return p, s.errInvalid("page_size", "must be an integer")
		}
		switch {
		case n < 0:
			return p, s.errInvalid("page_size", "must not be negative")
		case n == 0:
			n = defaultPageSize
		case n > maxPageSize:
			n = maxPageSize
		}
		p.pageSize = n
	}
	if v := q.get("skip"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 {
			return p, s.errInvalid("skip", "must be a non-negative integer")
		}
		p.skip = n
	}
	order, err := parseOrderBy(q.get("order_by"), fieldAliases)
	if err != nil {
		return p, s.errInvalid("order_by", err.Error())
	}
	p.order = order

	// A page token is only valid for the query that produced it (AIP-158),
	// so the cursor remembers a fingerprint of the filters.
	var parts []string
	for k, vs := range q {
		switch k {
		case "page_token", "page_size", "skip", "order_by":
			continue
		}
		parts = append(parts, k+"="+strings.Join(vs, ","))
	}
	sort.Strings(parts)
	h := sha256.Sum256([]byte(strings.Join(parts, "&")))
	p.filterHash = hex.EncodeToString(h[:6])
	return p, nil
}

func parseOrderBy(v string, aliases map[string]string) ([]orderField, error) {
	v = strings.TrimSpace(v)
	if v == "" {
		return []orderField{{field: "uid"}}, nil
	}
	var out []orderField
	for _, term := range strings.Split(v, ",") {
		f := strings.Fields(term)
		if len(f) == 0 || len(f) > 2 {
			return nil, fmt.Errorf("malformed order term %q", term)
		}
		name, ok := aliases[f[0]]
		if !ok {
			names := make([]string, 0, len(aliases))
			for k := range aliases {
				names = append(names, k)
			}
			sort.Strings(names)
			return nil, fmt.Errorf("unknown sort field %q; sortable fields: %s", f[0], strings.Join(names, ", "))
		}
		of := orderField{field: name}
		if len(f) == 2 {
			switch strings.ToLower(f[1]) {
			case "desc":
				of.desc = true
			case "asc":
			default:
				return nil, fmt.Errorf("unknown direction %q in %q", f[1], term)
			}
		}
		out = append(out, of)
	}
	return out, nil
}

func orderString(o []orderField) string {
	parts := make([]string, len(o))
	for i, f := range o {
		parts[i] = f.field
		if f.desc {
			parts[i] += " desc"
		}
	}
	return strings.Join(parts, ",")
}

// cursor is the decoded page token. Keyset paging (the sort key and uid of
// the last item returned) keeps pages consistent when items are inserted or
// deleted between requests, unlike an offset.
type cursor struct {
	Order  string   `json:"o"`
	Filter string   `json:"f"`
	Keys   []string `json:"k"`
	UID    string   `json:"u"`
	Issued int64    `json:"t"` // simulator time of issue, Unix ms
}

func encodeCursor(c cursor) string {
	b, _ := json.Marshal(c)
	return base64.RawURLEncoding.EncodeToString(b)
}

func decodeCursor(tok string) (cursor, error) {
	var c cursor
	b, err := base64.RawURLEncoding.DecodeString(tok)
	if err != nil {
		return c, err
	}
	err = json.Unmarshal(b, &c)
	return c, err
}

// lister describes how one resource type is listed.
type lister[T any] struct {
	plural string
	uid    func(T) string
	keys   map[string]func(T) string // sort field -> comparable string key
	render func(T) any
}

func msKey(ms int64) string { return fmt.Sprintf("%016d", ms) }

type keyed[T any] struct {
	item T
	keys []string
	uid  string
}

// compareKeys orders by the requested fields, then by uid ascending so the
// order is total and a cursor position is unambiguous.
func compareKeys(order []orderField, ak []string, au string, bk []string, bu string) int {
	for i, f := range order {
		c := strings.Compare(ak[i], bk[i])
		if f.desc {
			c = -c
		}
		if c != 0 {
			return c
		}
	}
	return strings.Compare(au, bu)
}

// paginate builds one page of a list response for the already filtered
// items. Callers hold the read lock; the returned value shares no mutable
// state with the simulator, so it can be written after unlocking.
//
// Only the items after the cursor are ranked, and only the first
// skip+page_size+1 of them are kept in order (a bounded heap), so a page of
// a 50,000-tag listing costs O(n log page) rather than a full sort.
func paginate[T any](s *Sim, p listParams, items []T, l lister[T]) (map[string]any, *apiError) {
	now := s.nowLocked().UnixMilli()
	ord := orderString(p.order)
	var after *cursor
	if p.pageToken != "" {
		c, err := decodeCursor(p.pageToken)
		if err != nil || len(c.Keys) != len(p.order) {
			return nil, s.errInvalid("page_token", "malformed page token")
		}
		if c.Order != ord || c.Filter != p.filterHash {
			return nil, s.errInvalid("page_token", "page token was issued for a different query")
		}
		// An expired token restarts the listing without an error (rule 4).
		if now-c.Issued <= s.opts.PageTokenTTL.Milliseconds() {
			after = &c
		}
	}
	keyFns := make([]func(T) string, len(p.order))
	for i, f := range p.order {
		keyFns[i] = l.keys[f.field]
	}
	less := func(a, b *keyed[T]) bool { return compareKeys(p.order, a.keys, a.uid, b.keys, b.uid) < 0 }
	limit := p.skip + p.pageSize + 1 // one extra tells whether a next page exists
	h := &boundedHeap[T]{less: less, limit: limit}
	remaining := 0
	for _, it := range items {
		k := &keyed[T]{item: it, uid: l.uid(it), keys: make([]string, len(keyFns))}
		for i, fn := range keyFns {
			k.keys[i] = fn(it)
		}
		if after != nil && compareKeys(p.order, k.keys, k.uid, after.Keys, after.UID) <= 0 {
			continue
		}
		remaining++
		h.offer(k)
	}
	ranked := h.sorted()
	skipped := min(p.skip, len(ranked))
	start := skipped
	end := min(start+p.pageSize, len(ranked))

	page := make([]any, 0, end-start)
	for _, k := range ranked[start:end] {
		page = append(page, l.render(k.item))
	}
	resp := map[string]any{
		l.plural:     page,
		"totalCount": strconv.Itoa(len(items)),
		"skipped":    skipped,
	}
	if end < remaining && end > start {
		last := ranked[end-1]
		resp["nextPageToken"] = encodeCursor(cursor{Order: ord, Filter: p.filterHash,
			Keys: last.keys, UID: last.uid, Issued: now})
	}
	return s.wireEnvelope(resp), nil
}

// boundedHeap keeps the limit smallest items offered: a max-heap whose root
// is the largest kept item.
type boundedHeap[T any] struct {
	less  func(a, b *keyed[T]) bool
	limit int
	items []*keyed[T]
}

func (h *boundedHeap[T]) offer(k *keyed[T]) {
	if len(h.items) < h.limit {
		h.items = append(h.items, k)
		h.up(len(h.items) - 1)
		return
	}
	if h.limit == 0 || !h.less(k, h.items[0]) {
		return
	}
	h.items[0] = k
	h.down(0)
}

func (h *boundedHeap[T]) up(i int) {
	for i > 0 {
		parent := (i - 1) / 2
		if !h.less(h.items[parent], h.items[i]) {
			return
		}
		h.items[parent], h.items[i] = h.items[i], h.items[parent]
		i = parent
	}
}

func (h *boundedHeap[T]) down(i int) {
	n := len(h.items)
	for {
		largest, l, r := i, 2*i+1, 2*i+2
		if l < n && h.less(h.items[largest], h.items[l]) {
			largest = l
		}
		if r < n && h.less(h.items[largest], h.items[r]) {
			largest = r
		}
		if largest == i {
			return
		}
		h.items[i], h.items[largest] = h.items[largest], h.items[i]
		i = largest
	}
}

// sorted returns the kept items in ascending order.
func (h *boundedHeap[T]) sorted() []*keyed[T] {
	out := slices.Clone(h.items)
	slices.SortFunc(out, func(a, b *keyed[T]) int {
		switch {
		case h.less(a, b):
			return -1
		case h.less(b, a):
			return 1
		}
		return 0
	})
	return out
}

// scopeMatches applies the uidp filters, which are prefix relations on the
// hierarchical uid.
func (p listParams) scopeMatches(uid string) bool {
	if p.childrenOf != "" && parentOf(uid) != p.childrenOf {
		return false
	}
	if p.descendantsOf != "" && !isDescendant(uid, p.descendantsOf) {
		return false
	}
	return true
}
