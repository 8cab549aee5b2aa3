package platformsim

import (
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
)

// Sort fields accepted in order_by, by spelling.
func timeAliases(m map[string]string) map[string]string {
	for _, a := range []string{"create_time", "created_at", "createTime", "createdAt"} {
		m[a] = "create_time"
	}
	for _, a := range []string{"update_time", "updated_at", "updateTime", "updatedAt"} {
		m[a] = "update_time"
	}
	return m
}

func repoOrderFields() map[string]string {
	return timeAliases(map[string]string{"name": "name", "uid": "uid"})
}

func (s *Sim) resourceRoutes() []resourceRoute {
	return []resourceRoute{
		{
			collection: "/registry/v2/repos",
			list:       s.listRepos,
			get:        s.getRepo,
			create:     s.createRepo,
			patch:      s.patchRepo,
			del:        s.deleteRepo,
		},
		{collection: "/registry/v2/tags", list: s.listTags, get: s.getTag, create: s.createTag, del: s.deleteTag},
		{collection: "/vulnerabilities/v2/advisories", list: s.listAdvisories, get: s.getAdvisory},
	}
}

func (s *Sim) renderRepo(r *repo) map[string]any {
	return s.wire("repo", r.uid, map[string]any{
		"uid":         r.uid,
		"name":        r.name,
		"description": r.description,
		"catalogTier": r.catalogTier,
		"aliases":     nonNil(r.aliases),
		"activeTags":  nonNil(r.activeTags),
		"bundles":     nonNil(r.bundles),
		"createTime":  fmtMs(r.createMs),
		"updateTime":  fmtMs(r.updateMs),
	})
}

func (s *Sim) renderTag(t *tag) map[string]any {
	return s.wire("tag", t.uid, map[string]any{
		"uid":        t.uid,
		"name":       t.name,
		"digest":     fmtDigest(t.digest),
		"deprecated": t.deprecated,
		"bundles":    nonNil(t.bundles),
		"createTime": fmtMs(t.createMs),
		"updateTime": fmtMs(t.updateMs),
	})
}

// nonNil keeps empty lists as [] in JSON, never null.
func nonNil(v []string) []string {
	if v == nil {
		return []string{}
	}
	return v
}

func (s *Sim) repoLister() lister[*repo] {
	return lister[*repo]{
		plural: "repos",
		uid:    func(r *repo) string { return r.uid },
		keys: map[string]func(*repo) string{
			"name":        func(r *repo) string { return r.name },
			"uid":         func(r *repo) string { return r.uid },
			"create_time": func(r *repo) string { return msKey(r.createMs) },
			"update_time": func(r *repo) string { return msKey(r.updateMs) },
		},
		render: func(r *repo) any { return s.renderRepo(r) },
	}
}

func (s *Sim) tagLister() lister[*tag] {
	return lister[*tag]{
		plural: "tags",
		uid:    func(t *tag) string { return t.uid },
		keys: map[string]func(*tag) string{
			"name":        func(t *tag) string { return t.name },
			"uid":         func(t *tag) string { return t.uid },
			"create_time": func(t *tag) string { return msKey(t.createMs) },
			"update_time": func(t *tag) string { return msKey(t.updateMs) },
		},
		render: func(t *tag) any { return s.renderTag(t) },
	}
}

// scope returns the group a request's token may see; requests reaching a
// handler have been authenticated already.
func (s *Sim) scope(r *http.Request) string {
	m, _ := s.credential(bearer(r))
	return m.group
}

// visible reports whether a resource uid lies within a token's scope.
func visible(uid, scope string) bool {
	return uid == scope || isDescendant(uid, scope)
}

func (s *Sim) listRepos(w http.ResponseWriter, r *http.Request, _ route) {
	p, e := s.parseListParams(r, repoOrderFields())
	if e != nil {
		writeError(w, e)
		return
	}
	scope := s.scope(r)
	s.mu.RLock()
	resp, e := paginateCached(s, p, scope, func() []*repo {
		var items []*repo
		for _, rp := range s.repos {
			if visible(rp.uid, scope) && p.scopeMatches(rp.uid) && (p.name == "" || rp.name == p.name) {
				items = append(items, rp)
			}
		}
		return items
	}, s.repoLister())
	s.mu.RUnlock()
	writeResult(w, resp, e)
}

func writeResult(w http.ResponseWriter, resp any, e *apiError) {
	if e != nil {
		writeError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Sim) getRepo(w http.ResponseWriter, r *http.Request, rt route) {
	scope := s.scope(r)
	s.mu.RLock()
	rp, ok := s.repos[rt.uid]
	var resp map[string]any
	if ok && visible(rp.uid, scope) {
		resp = s.renderRepo(rp)
	}
	s.mu.RUnlock()
	if resp == nil {
		writeError(w, s.errNotFound("repo", rt.uid))
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

func (s *Sim) listTags(w http.ResponseWriter, r *http.Request, _ route) {
	p, e := s.parseListParams(r, repoOrderFields())
	if e != nil {
		writeError(w, e)
		return
	}
	var digest [32]byte
	wantDigest := p.q.get("digest")
	if wantDigest != "" {
		d, err := parseDigest(wantDigest)
		if err != nil {
			writeError(w, s.errInvalid("digest", "must be of the form sha256:<64 hex digits>"))
			return
		}
		digest = d
	}
	var since int64
	if v := p.q.get("updated_since"); v != "" {
		ms, err := parseTime(v)
		if err != nil {
			writeError(w, s.errInvalid("updated_since", "must be an RFC 3339 timestamp"))
			return
		}
		since = ms
		if s.opts.UpdatedSinceExclusive {
			since++ // the proto: tags updated after the timestamp
		}
	}
	fam := familyFilter{hide: s.opts.HideTagFamilies}
	for _, f := range []struct {
		name string
		p    *bool
	}{{"include_referrers", &fam.referrers}, {"include_dates", &fam.dates}, {"include_epochs", &fam.epochs}} {
		v, err := p.q.flag(f.name)
		if err != nil {
			writeError(w, s.errInvalid(f.name, "must be true or false"))
			return
		}
		*f.p = v
	}
	scope := s.scope(r)
	s.mu.RLock()
	// Listing the tags of one repo is the common case; use the repo's index.
	var candidates map[string]*tag
	if rp, ok := s.repos[p.childrenOf]; ok {
		candidates = rp.tags
	} else if p.childrenOf != "" {
		candidates = nil
	} else {
		candidates = s.tags
	}
	resp, e := paginateCached(s, p, scope, func() []*tag {
		var items []*tag
		for _, t := range candidates {
			if !visible(t.uid, scope) || !p.scopeMatches(t.uid) {
				continue
			}
			if (p.name != "" && t.name != p.name) || (wantDigest != "" && t.digest != digest) || t.updateMs < since ||
				!fam.shows(t.name) {
				continue
			}
			items = append(items, t)
		}
		return items
	}, s.tagLister())
	s.mu.RUnlock()
	writeResult(w, resp, e)
}

func (s *Sim) getTag(w http.ResponseWriter, r *http.Request, rt route) {
	scope := s.scope(r)
	s.mu.RLock()
	t, ok := s.tags[rt.uid]
	var resp map[string]any
	if ok && visible(t.uid, scope) {
		resp = s.renderTag(t)
	}
	s.mu.RUnlock()
	if resp == nil {
		writeError(w, s.errNotFound("tag", rt.uid))
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// readBody decodes a JSON object body into fields; an empty body is an
// empty object.
func (s *Sim) readBody(r *http.Request) (map[string]json.RawMessage, *apiError) {
	b, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		return nil, s.newError(codeInvalidArgument, "Invalid argument: body: "+err.Error())
	}
	fields := map[string]json.RawMessage{}
	if len(b) == 0 {
		return fields, nil
	}
	if err := json.Unmarshal(b, &fields); err != nil {
		return nil, s.errInvalid("body", "must be a JSON object: "+err.Error())
	}
	return fields, nil
}

// repoFields are the updatable fields of a repo, by camelCase name.
func repoFields(rp *repo) fieldSet {
	return fieldSet{
		"name":        stringField(&rp.name),
		"description": stringField(&rp.description),
		"catalogTier": catalogTierField(&rp.catalogTier),
		"aliases":     listField(&rp.aliases),
		"activeTags":  listField(&rp.activeTags),
		"bundles":     listField(&rp.bundles),
	}
}

// catalogTierField accepts the tier by its short name (APPLICATION) or, as
// protojson spells enums, in full (CATALOG_TIER_APPLICATION).
func catalogTierField(p *string) func(json.RawMessage) error {
	set := stringField(p)
	return func(raw json.RawMessage) error {
		if err := set(raw); err != nil {
			return err
		}
		*p = strings.TrimPrefix(*p, "CATALOG_TIER_")
		return nil
	}
}

func (s *Sim) createRepo(w http.ResponseWriter, r *http.Request, rt route) {
	body, e := s.readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var nr repo
	if e := s.applyFields(repoFields(&nr), body, nil); e != nil {
		writeError(w, e)
		return
	}
	if nr.name == "" {
		writeError(w, s.errInvalid("name", "is required"))
		return
	}
	scope := s.scope(r)
	s.mu.Lock()
	if _, ok := s.groups[rt.uid]; !ok || !visible(rt.uid, scope) {
		s.mu.Unlock()
		writeError(w, s.errNotFound("group", rt.uid))
		return
	}
	if s.repoByNameLocked(rt.uid, nr.name) != nil {
		s.mu.Unlock()
		writeError(w, s.errAlreadyExists("repo", nr.name))
		return
	}
	rp := s.addRepoLocked(rt.uid, nr)
	resp := s.renderRepo(rp)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, resp)
}

func (s *Sim) repoByNameLocked(parent, name string) *repo {
	for _, rp := range s.repos {
		if rp.name == name && parentOf(rp.uid) == parent {
			return rp
		}
	}
	return nil
}

// addRepoLocked inserts a repo built from the given fields under parent.
func (s *Sim) addRepoLocked(parent string, fields repo) *repo {
	now := s.nowLocked().UnixMilli()
	rp := &fields
	rp.uid = s.newUIDLocked(parent)
	rp.createMs, rp.updateMs = now, now
	rp.tags = map[string]*tag{}
	s.repos[rp.uid] = rp
	s.indexRepoLocked(rp)
	s.emitLocked(s.platformEvent("registry.repo.created"), rp.uid, s.renderRepo(rp))
	return rp
}

func (s *Sim) patchRepo(w http.ResponseWriter, r *http.Request, rt route) {
	body, e := s.readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	mask, e := s.parseMask(r)
	if e != nil {
		writeError(w, e)
		return
	}
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	rp, ok := s.repos[rt.uid]
	if !ok || !visible(rp.uid, scope) {
		writeError(w, s.errNotFound("repo", rt.uid))
		return
	}
	// Apply to a copy so a failed validation changes nothing.
	nr := *rp
	if e := s.applyFields(repoFields(&nr), body, mask); e != nil {
		writeError(w, e)
		return
	}
	if nr.name == "" {
		writeError(w, s.errInvalid("name", "must not be empty"))
		return
	}
	if nr.name != rp.name {
		if other := s.repoByNameLocked(parentOf(rp.uid), nr.name); other != nil {
			writeError(w, s.errAlreadyExists("repo", nr.name))
			return
		}
	}
	nr.updateMs = s.nowLocked().UnixMilli()
	*rp = nr
	resp := s.renderRepo(rp)
	s.emitLocked(s.platformEvent("registry.repo.updated"), rp.uid, resp)
	writeJSON(w, http.StatusOK, resp)
}

func (s *Sim) deleteRepo(w http.ResponseWriter, r *http.Request, rt route) {
	scope := s.scope(r)
	s.mu.Lock()
	rp, ok := s.repos[rt.uid]
	if !ok || !visible(rp.uid, scope) {
		s.mu.Unlock()
		writeError(w, s.errNotFound("repo", rt.uid))
		return
	}
	s.removeRepoLocked(rp)
	s.mu.Unlock()
	writeEmpty(w)
}

// removeRepoLocked deletes a repo with its tags and their history.
func (s *Sim) removeRepoLocked(rp *repo) {
	for _, t := range rp.tags {
		delete(s.tags, t.uid)
		s.unindexTagLocked(t)
	}
	delete(s.repos, rp.uid)
	s.unindexRepoLocked(rp)
	s.emitLocked(s.platformEvent("registry.repo.deleted"), rp.uid, s.renderRepo(rp))
}

// writeEmpty answers a successful delete: the spec's empty body.
func writeEmpty(w http.ResponseWriter) {
	w.Header().Set("Content-Length", "0")
	w.WriteHeader(http.StatusOK)
}

func (s *Sim) createTag(w http.ResponseWriter, r *http.Request, rt route) {
	body, e := s.readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var nt tag
	var digest string
	fields := fieldSet{
		"name":       stringField(&nt.name),
		"digest":     stringField(&digest),
		"deprecated": boolField(&nt.deprecated),
		"bundles":    listField(&nt.bundles),
	}
	if e := s.applyFields(fields, body, nil); e != nil {
		writeError(w, e)
		return
	}
	if nt.name == "" {
		writeError(w, s.errInvalid("name", "is required"))
		return
	}
	d, err := parseDigest(digest)
	if err != nil {
		writeError(w, s.errInvalid("digest", "must be of the form sha256:<64 hex digits>"))
		return
	}
	scope := s.scope(r)
	s.mu.Lock()
	rp, ok := s.repos[rt.uid]
	if !ok || !visible(rt.uid, scope) {
		s.mu.Unlock()
		writeError(w, s.errNotFound("repo", rt.uid))
		return
	}
	for _, t := range rp.tags {
		if t.name == nt.name {
			s.mu.Unlock()
			writeError(w, s.errAlreadyExists("tag", nt.name))
			return
		}
	}
	t := s.addTagLocked(rp, nt.name, d, nt.deprecated)
	t.bundles = nt.bundles
	resp := s.renderTag(t)
	s.mu.Unlock()
	writeJSON(w, http.StatusOK, resp)
}

// addTagLocked creates a tag pointing at digest, with its first history
// record stamped now.
func (s *Sim) addTagLocked(rp *repo, name string, d [32]byte, deprecated bool) *tag {
	now := s.nowLocked().UnixMilli()
	t := &tag{uid: s.newUIDLocked(rp.uid), repoUID: rp.uid, name: name, digest: d,
		deprecated: deprecated, createMs: now, updateMs: now,
		history: []histRec{{ms: now, digest: d}}}
	rp.tags[t.uid] = t
	s.tags[t.uid] = t
	s.indexTagLocked(t)
	s.emitLocked(s.platformEvent("registry.tag.created"), t.uid, s.renderTag(t))
	s.emitPushLocked(rp, t, [32]byte{})
	return t
}

func (s *Sim) deleteTag(w http.ResponseWriter, r *http.Request, rt route) {
	scope := s.scope(r)
	s.mu.Lock()
	t, ok := s.tags[rt.uid]
	if !ok || !visible(t.uid, scope) {
		s.mu.Unlock()
		writeError(w, s.errNotFound("tag", rt.uid))
		return
	}
	s.removeTagLocked(t)
	s.mu.Unlock()
	writeEmpty(w)
}

func (s *Sim) removeTagLocked(t *tag) {
	if rp, ok := s.repos[t.repoUID]; ok {
		delete(rp.tags, t.uid)
	}
	delete(s.tags, t.uid)
	s.unindexTagLocked(t)
	s.emitLocked(s.platformEvent("registry.tag.deleted"), t.uid, s.renderTag(t))
}

// imageOf finds a digest among the history of a repo's tags: the set of
// images the repo holds.
func (s *Sim) imageOf(w http.ResponseWriter, r *http.Request, rt route) ([32]byte, bool) {
	d, err := parseDigest(rt.digest)
	if err != nil {
		writeError(w, s.errInvalid("digest", "must be of the form sha256:<64 hex digits>"))
		return d, false
	}
	scope := s.scope(r)
	s.mu.RLock()
	defer s.mu.RUnlock()
	rp, ok := s.repos[rt.uid]
	if !ok || !visible(rp.uid, scope) {
		writeError(w, s.errNotFound("repo", rt.uid))
		return d, false
	}
	for _, t := range rp.tags {
		for _, h := range t.history {
			if h.digest == d {
				return d, true
			}
		}
	}
	writeError(w, s.errNotFound("image", rt.uid+"@"+rt.digest))
	return d, false
}

// architecturesOf derives an image's platforms from its digest, so the
// answer is stable without storing anything per image.
func architecturesOf(d [32]byte) []string {
	switch d[0] % 4 {
	case 0:
		return []string{"amd64"}
	case 1:
		return []string{"amd64", "arm64", "s390x"}
	default:
		return []string{"amd64", "arm64"}
	}
}

func (s *Sim) serveArchitectures(w http.ResponseWriter, r *http.Request, rt route) {
	d, ok := s.imageOf(w, r, rt)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"architectures": architecturesOf(d)})
}

func (s *Sim) serveSize(w http.ResponseWriter, r *http.Request, rt route) {
	d, ok := s.imageOf(w, r, rt)
	if !ok {
		return
	}
	arch := r.URL.Query().Get("architecture")
	if arch == "" {
		arch = "amd64"
	}
	archs := architecturesOf(d)
	i := slices.Index(archs, arch)
	if i < 0 {
		writeError(w, s.errNotFound("architecture", arch))
		return
	}
	size := 4<<20 + int64(binary.BigEndian.Uint32(d[4:8])%(200<<20)) + int64(i)*1024
	// int64 fields are strings in proto3 JSON.
	writeJSON(w, http.StatusOK, map[string]any{"architecture": arch, "size": strconv.FormatInt(size, 10)})
}

func (s *Sim) serveReadme(w http.ResponseWriter, r *http.Request, rt route) {
	scope := s.scope(r)
	s.mu.RLock()
	rp, ok := s.repos[rt.uid]
	var readme string
	if ok && visible(rp.uid, scope) {
		readme = "# " + rp.name + "\n\n" + rp.description + "\n"
	}
	s.mu.RUnlock()
	if !ok || readme == "" {
		writeError(w, s.errNotFound("repo", rt.uid))
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"readme": readme})
}

func (s *Sim) servePing(w http.ResponseWriter, _ *http.Request, _ route) {
	writeJSON(w, http.StatusOK, map[string]any{})
}
