package platformsim

import (
	"encoding/json"
	"net/http"
	"net/url"
	"strings"
)

// identityNamePattern is the spec's rule for identity names.
const identityNamePattern = `^[a-z0-9 ._-]{1,}$`

func (s *Sim) identityNameOK(name string) bool {
	return s.identityName.MatchString(name)
}

func nameOrderFields() map[string]string {
	return timeAliases(map[string]string{"name": "name", "uid": "uid"})
}

func (s *Sim) iamRoutes() []resourceRoute {
	return []resourceRoute{
		{
			collection: "/iam/v2/groups",
			list:       s.listGroups,
			get:        s.getGroup,
			create:     s.createGroup,
			patch:      s.patchGroup,
			del:        s.deleteGroup,
		},
		{
			collection: "/iam/v2/identities",
			list:       s.listIdentities,
			get:        s.getIdentity,
			create:     s.createIdentity,
			patch:      s.patchIdentity,
			del:        s.deleteIdentity,
		},
		{collection: "/iam/v2/roles", list: s.listRoles, get: s.getRole},
		{
			collection: "/iam/v2/roleBindings",
			list:       s.listBindings,
			get:        s.getBinding,
			create:     s.createBinding,
			del:        s.deleteBinding,
		},
		{
			collection: "/events/v2/subscriptions",
			list:       s.listSubscriptions,
			get:        s.getSubscription,
			create:     s.createSubscription,
			del:        s.deleteSubscription,
		},
	}
}

// simpleLister lists resources sortable by name, uid and times.
func simpleLister[T any](
	plural string,
	uid, name func(T) string,
	createMs, updateMs func(T) int64,
	render func(T) map[string]any,
) lister[T] {
	return lister[T]{
		plural: plural,
		uid:    uid,
		keys: map[string]func(T) string{
			"name":        name,
			"uid":         uid,
			"create_time": func(v T) string { return msKey(createMs(v)) },
			"update_time": func(v T) string { return msKey(updateMs(v)) },
		},
		render: func(v T) any { return render(v) },
	}
}

// listMap is the shared body of the IAM and events list handlers.
func listMap[T any](
	s *Sim,
	w http.ResponseWriter,
	r *http.Request,
	m map[string]T,
	l lister[T],
	name func(T) string,
	always func(T) bool,
) {
	p, e := s.parseListParams(r, nameOrderFields())
	if e != nil {
		writeError(w, e)
		return
	}
	scope := s.scope(r)
	s.mu.RLock()
	var items []T
	for _, v := range m {
		uid := l.uid(v)
		inScope := always != nil && always(v)
		if !inScope {
			inScope = visible(uid, scope) && p.scopeMatches(uid)
		}
		if inScope && (p.name == "" || name(v) == p.name) {
			items = append(items, v)
		}
	}
	resp, e := paginate(s, p, items, l)
	s.mu.RUnlock()
	writeResult(w, resp, e)
}

// getMap is the shared body of the IAM and events get handlers.
func getMap[T any](
	s *Sim,
	w http.ResponseWriter,
	r *http.Request,
	m map[string]T,
	uid, kind string,
	render func(T) map[string]any,
	global func(T) bool,
) {
	scope := s.scope(r)
	s.mu.RLock()
	v, ok := m[uid]
	var resp map[string]any
	if ok && (visible(uid, scope) || (global != nil && global(v))) {
		resp = render(v)
	}
	s.mu.RUnlock()
	if resp == nil {
		writeError(w, s.errNotFound(kind, uid))
		return
	}
	writeJSON(w, http.StatusOK, resp)
}

// ---- groups

func (s *Sim) renderGroup(g *group) map[string]any {
	return s.wire("group", g.uid, map[string]any{"uid": g.uid, "name": g.name, "description": g.description,
		"createTime": fmtMs(g.createMs), "updateTime": fmtMs(g.updateMs)})
}

func (s *Sim) groupLister() lister[*group] {
	return simpleLister("groups", func(g *group) string { return g.uid }, func(g *group) string { return g.name },
		func(g *group) int64 { return g.createMs }, func(g *group) int64 { return g.updateMs }, s.renderGroup)
}

func (s *Sim) listGroups(w http.ResponseWriter, r *http.Request, _ route) {
	listMap(s, w, r, s.groups, s.groupLister(), func(g *group) string { return g.name }, nil)
}

func (s *Sim) getGroup(w http.ResponseWriter, r *http.Request, rt route) {
	getMap(s, w, r, s.groups, rt.uid, "group", s.renderGroup, nil)
}

func groupFields(g *group) fieldSet {
	return fieldSet{"name": stringField(&g.name), "description": stringField(&g.description)}
}

func (s *Sim) createGroup(w http.ResponseWriter, r *http.Request, rt route) {
	body, e := s.readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var ng group
	if e := s.applyFields(groupFields(&ng), body, nil); e != nil {
		writeError(w, e)
		return
	}
	if ng.name == "" {
		writeError(w, s.errInvalid("name", "is required"))
		return
	}
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[rt.uid]; !ok || !visible(rt.uid, scope) {
		writeError(w, s.errNotFound("group", rt.uid))
		return
	}
	now := s.nowLocked().UnixMilli()
	g := &ng
	g.uid, g.createMs, g.updateMs = s.newUIDLocked(rt.uid), now, now
	s.groups[g.uid] = g
	resp := s.renderGroup(g)
	s.emitLocked(s.eventType("api.iam.group.created"), g.uid, resp)
	writeJSON(w, http.StatusOK, resp)
}

func (s *Sim) patchGroup(w http.ResponseWriter, r *http.Request, rt route) {
	body, e := s.readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	mask, _ := s.parseMask(r)
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[rt.uid]
	if !ok || !visible(g.uid, scope) {
		writeError(w, s.errNotFound("group", rt.uid))
		return
	}
	ng := *g
	if e := s.applyFields(groupFields(&ng), body, mask); e != nil {
		writeError(w, e)
		return
	}
	if ng.name == "" {
		writeError(w, s.errInvalid("name", "must not be empty"))
		return
	}
	ng.updateMs = s.nowLocked().UnixMilli()
	*g = ng
	resp := s.renderGroup(g)
	s.emitLocked(s.eventType("api.iam.group.updated"), g.uid, resp)
	writeJSON(w, http.StatusOK, resp)
}

// childrenLocked counts the direct children of a group of every kind.
func (s *Sim) childrenLocked(uid string) int {
	n := 0
	count := func(child string) {
		if parentOf(child) == uid {
			n++
		}
	}
	for k := range s.groups {
		count(k)
	}
	for k := range s.repos {
		count(k)
	}
	for k := range s.identities {
		count(k)
	}
	for k := range s.bindings {
		count(k)
	}
	for k := range s.subscriptions {
		count(k)
	}
	return n
}

func (s *Sim) deleteGroup(w http.ResponseWriter, r *http.Request, rt route) {
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	g, ok := s.groups[rt.uid]
	if !ok || !visible(g.uid, scope) {
		writeError(w, s.errNotFound("group", rt.uid))
		return
	}
	if n := s.childrenLocked(g.uid); n > 0 {
		writeError(w, s.errNotEmpty("group", g.uid, n))
		return
	}
	delete(s.groups, g.uid)
	s.emitLocked(s.eventType("api.iam.group.deleted"), g.uid, s.renderGroup(g))
	writeEmpty(w)
}

// ---- identities

func (s *Sim) renderIdentity(id *identity) map[string]any {
	cm := map[string]any{"issuer": id.issuer, "subject": id.subject}
	if id.audience != "" {
		cm["audience"] = id.audience
	}
	return s.wire("identity", id.uid, map[string]any{"uid": id.uid, "name": id.name, "description": id.description,
		"claimMatch":   cm,
		"lastSeenTime": fmtMs(id.lastSeenMs),
		"createTime":   fmtMs(id.createMs), "updateTime": fmtMs(id.updateMs)})
}

func (s *Sim) identityLister() lister[*identity] {
	return simpleLister(
		"identities",
		func(i *identity) string { return i.uid },
		func(i *identity) string { return i.name },
		func(i *identity) int64 { return i.createMs },
		func(i *identity) int64 { return i.updateMs },
		s.renderIdentity,
	)
}

func (s *Sim) listIdentities(w http.ResponseWriter, r *http.Request, _ route) {
	listMap(s, w, r, s.identities, s.identityLister(), func(i *identity) string { return i.name }, nil)
}

func (s *Sim) getIdentity(w http.ResponseWriter, r *http.Request, rt route) {
	getMap(s, w, r, s.identities, rt.uid, "identity", s.renderIdentity, nil)
}

// claimMatchField decodes the nested claimMatch object.
func claimMatchField(id *identity) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		var cm struct {
			Issuer   string `json:"issuer"`
			Subject  string `json:"subject"`
			Audience string `json:"audience"`
		}
		if raw != nil {
			if err := json.Unmarshal(raw, &cm); err != nil {
				return err
			}
		}
		id.issuer, id.subject, id.audience = cm.Issuer, cm.Subject, cm.Audience
		return nil
	}
}

func identityFields(id *identity) fieldSet {
	return fieldSet{"name": stringField(&id.name), "description": stringField(&id.description),
		"claimMatch": claimMatchField(id)}
}

func (s *Sim) errIdentityName() *apiError {
	return s.errInvalid("name", "must match "+identityNamePattern)
}

func (s *Sim) createIdentity(w http.ResponseWriter, r *http.Request, rt route) {
	body, e := s.readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var nid identity
	if e := s.applyFields(identityFields(&nid), body, nil); e != nil {
		writeError(w, e)
		return
	}
	if !s.identityNameOK(nid.name) {
		writeError(w, s.errIdentityName())
		return
	}
	if nid.issuer != "" {
		if u, err := url.Parse(nid.issuer); err != nil || u.Scheme == "" || u.Host == "" {
			writeError(w, s.errInvalid("claimMatch.issuer", "must be an absolute URL"))
			return
		}
	}
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[rt.uid]; !ok || !visible(rt.uid, scope) {
		writeError(w, s.errNotFound("group", rt.uid))
		return
	}
	now := s.nowLocked().UnixMilli()
	id := &nid
	id.uid, id.createMs, id.updateMs, id.lastSeenMs = s.newUIDLocked(rt.uid), now, now, now
	s.identities[id.uid] = id
	resp := s.renderIdentity(id)
	s.emitLocked(s.eventType("api.iam.identity.created"), id.uid, resp)
	writeJSON(w, http.StatusOK, resp)
}

func (s *Sim) patchIdentity(w http.ResponseWriter, r *http.Request, rt route) {
	body, e := s.readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	mask, _ := s.parseMask(r)
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.identities[rt.uid]
	if !ok || !visible(id.uid, scope) {
		writeError(w, s.errNotFound("identity", rt.uid))
		return
	}
	nid := *id
	if e := s.applyFields(identityFields(&nid), body, mask); e != nil {
		writeError(w, e)
		return
	}
	if !s.identityNameOK(nid.name) {
		writeError(w, s.errIdentityName())
		return
	}
	nid.updateMs = s.nowLocked().UnixMilli()
	*id = nid
	resp := s.renderIdentity(id)
	s.emitLocked(s.eventType("api.iam.identity.updated"), id.uid, resp)
	writeJSON(w, http.StatusOK, resp)
}

func (s *Sim) deleteIdentity(w http.ResponseWriter, r *http.Request, rt route) {
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	id, ok := s.identities[rt.uid]
	if !ok || !visible(id.uid, scope) {
		writeError(w, s.errNotFound("identity", rt.uid))
		return
	}
	delete(s.identities, id.uid)
	// Bindings of a deleted identity go with it, and so do its tokens.
	for k, b := range s.bindings {
		if b.identityUID == id.uid {
			delete(s.bindings, k)
		}
	}
	for k, m := range s.minted {
		if m.identity == id.uid {
			delete(s.minted, k)
		}
	}
	s.emitLocked(s.eventType("api.iam.identity.deleted"), id.uid, s.renderIdentity(id))
	writeEmpty(w)
}

// ---- roles

func (s *Sim) renderRole(ro *role) map[string]any {
	return s.wire("role", ro.uid, map[string]any{"uid": ro.uid, "name": ro.name, "description": ro.description,
		"capabilities": nonNil(ro.capabilities),
		"createTime":   fmtMs(ro.createMs), "updateTime": fmtMs(ro.updateMs)})
}

// builtin reports whether a role is predefined: it applies in every group,
// so the uidp filters do not hide it.
func builtin(ro *role) bool { return !strings.Contains(ro.uid, "/") }

func (s *Sim) listRoles(w http.ResponseWriter, r *http.Request, _ route) {
	l := simpleLister("roles", func(ro *role) string { return ro.uid }, func(ro *role) string { return ro.name },
		func(ro *role) int64 { return ro.createMs }, func(ro *role) int64 { return ro.updateMs }, s.renderRole)
	listMap(s, w, r, s.roles, l, func(ro *role) string { return ro.name }, builtin)
}

func (s *Sim) getRole(w http.ResponseWriter, r *http.Request, rt route) {
	getMap(s, w, r, s.roles, rt.uid, "role", s.renderRole, builtin)
}

// ---- role bindings

// renderBindingLocked hydrates the references, as the v2 API does.
func (s *Sim) renderBindingLocked(b *roleBinding) map[string]any {
	out := map[string]any{"uid": b.uid, "createTime": fmtMs(b.createMs), "updateTime": fmtMs(b.updateMs)}
	if id, ok := s.identities[b.identityUID]; ok {
		out["identity"] = map[string]any{"uid": id.uid, "name": id.name, "description": id.description,
			"subject": id.subject, "issuer": id.issuer}
	}
	if g, ok := s.groups[parentOf(b.uid)]; ok {
		out["group"] = map[string]any{"uid": g.uid, "name": g.name, "description": g.description}
	}
	if ro, ok := s.roles[b.roleUID]; ok {
		out["role"] = map[string]any{"uid": ro.uid, "name": ro.name, "description": ro.description}
	}
	return s.wire("roleBinding", b.uid, out)
}

func (s *Sim) listBindings(w http.ResponseWriter, r *http.Request, _ route) {
	l := lister[*roleBinding]{
		plural: "roleBindings",
		uid:    func(b *roleBinding) string { return b.uid },
		keys: map[string]func(*roleBinding) string{
			"uid":         func(b *roleBinding) string { return b.uid },
			"name":        func(b *roleBinding) string { return b.uid },
			"create_time": func(b *roleBinding) string { return msKey(b.createMs) },
			"update_time": func(b *roleBinding) string { return msKey(b.updateMs) },
		},
		// Rendering happens under the read lock held by listMap.
		render: func(b *roleBinding) any { return s.renderBindingLocked(b) },
	}
	listMap(s, w, r, s.bindings, l, func(b *roleBinding) string { return b.uid }, nil)
}

func (s *Sim) getBinding(w http.ResponseWriter, r *http.Request, rt route) {
	getMap(s, w, r, s.bindings, rt.uid, "roleBinding", s.renderBindingLocked, nil)
}

func (s *Sim) createBinding(w http.ResponseWriter, r *http.Request, rt route) {
	body, e := s.readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var identityUID, roleUID string
	if e := s.applyFields(
		fieldSet{"identityUid": stringField(&identityUID), "roleUid": stringField(&roleUID)},
		body,
		nil,
	); e != nil {
		writeError(w, e)
		return
	}
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[rt.uid]; !ok || !visible(rt.uid, scope) {
		writeError(w, s.errNotFound("group", rt.uid))
		return
	}
	if _, ok := s.identities[identityUID]; !ok {
		writeError(w, s.errInvalid("identityUid", "must name an existing identity"))
		return
	}
	if _, ok := s.roles[roleUID]; !ok {
		writeError(w, s.errInvalid("roleUid", "must name an existing role"))
		return
	}
	now := s.nowLocked().UnixMilli()
	b := &roleBinding{
		uid:         s.newUIDLocked(rt.uid),
		identityUID: identityUID,
		roleUID:     roleUID,
		createMs:    now,
		updateMs:    now,
	}
	s.bindings[b.uid] = b
	resp := s.renderBindingLocked(b)
	s.emitLocked(s.eventType("api.iam.role_binding.created"), b.uid, resp)
	writeJSON(w, http.StatusOK, resp)
}

func (s *Sim) deleteBinding(w http.ResponseWriter, r *http.Request, rt route) {
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.bindings[rt.uid]
	if !ok || !visible(b.uid, scope) {
		writeError(w, s.errNotFound("roleBinding", rt.uid))
		return
	}
	resp := s.renderBindingLocked(b)
	delete(s.bindings, b.uid)
	s.emitLocked(s.eventType("api.iam.role_binding.deleted"), b.uid, resp)
	writeEmpty(w)
}

// ---- subscriptions

func (s *Sim) renderSubscription(sub *subscription) map[string]any {
	return s.wire("subscription", sub.uid, map[string]any{"uid": sub.uid, "sink": sub.sink,
		"createTime": fmtMs(sub.createMs), "updateTime": fmtMs(sub.updateMs)})
}

func (s *Sim) listSubscriptions(w http.ResponseWriter, r *http.Request, _ route) {
	l := simpleLister(
		"subscriptions",
		func(v *subscription) string { return v.uid },
		func(v *subscription) string { return v.sink },
		func(v *subscription) int64 { return v.createMs },
		func(v *subscription) int64 { return v.updateMs },
		s.renderSubscription,
	)
	listMap(s, w, r, s.subscriptions, l, func(v *subscription) string { return v.sink }, nil)
}

func (s *Sim) getSubscription(w http.ResponseWriter, r *http.Request, rt route) {
	getMap(s, w, r, s.subscriptions, rt.uid, "subscription", s.renderSubscription, nil)
}

func (s *Sim) createSubscription(w http.ResponseWriter, r *http.Request, rt route) {
	body, e := s.readBody(r)
	if e != nil {
		writeError(w, e)
		return
	}
	var sink string
	if e := s.applyFields(fieldSet{"sink": stringField(&sink)}, body, nil); e != nil {
		writeError(w, e)
		return
	}
	u, err := url.Parse(sink)
	okScheme := err == nil && (u.Scheme == "https" || (u.Scheme == "http" && s.opts.AllowHTTPSinks))
	if sink == "" || !okScheme || u.Host == "" {
		writeError(w, s.errInvalid("sink", "is required and must be an absolute https:// URL"))
		return
	}
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.groups[rt.uid]; !ok || !visible(rt.uid, scope) {
		writeError(w, s.errNotFound("group", rt.uid))
		return
	}
	now := s.nowLocked().UnixMilli()
	sub := &subscription{uid: s.newUIDLocked(rt.uid), sink: sink, createMs: now, updateMs: now}
	s.subscriptions[sub.uid] = sub
	resp := s.renderSubscription(sub)
	s.emitLocked(s.eventType("api.events.subscription.created"), sub.uid, resp)
	writeJSON(w, http.StatusOK, resp)
}

func (s *Sim) deleteSubscription(w http.ResponseWriter, r *http.Request, rt route) {
	scope := s.scope(r)
	s.mu.Lock()
	defer s.mu.Unlock()
	sub, ok := s.subscriptions[rt.uid]
	if !ok || !visible(sub.uid, scope) {
		writeError(w, s.errNotFound("subscription", rt.uid))
		return
	}
	// The deletion event still reaches the subscription being deleted.
	resp := s.renderSubscription(sub)
	s.emitLocked(s.eventType("api.events.subscription.deleted"), sub.uid, resp)
	delete(s.subscriptions, sub.uid)
	writeEmpty(w)
}
