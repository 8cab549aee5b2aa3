package platformsim

import (
	"net/http"
	"slices"
	"strings"
)

func (s *Sim) advisoryLister() lister[*advisory] {
	return lister[*advisory]{
		plural: "advisories",
		uid:    func(a *advisory) string { return a.uid },
		keys: map[string]func(*advisory) string{
			"uid":           func(a *advisory) string { return a.uid },
			"advisory_id":   func(a *advisory) string { return a.advisoryID },
			"artifact_name": func(a *advisory) string { return a.artifactName },
			"create_time":   func(a *advisory) string { return msKey(a.createMs) },
			"update_time":   func(a *advisory) string { return msKey(a.updateMs) },
		},
		render: func(a *advisory) any { return s.renderAdvisory(a) },
	}
}

func (s *Sim) renderAdvisory(a *advisory) map[string]any {
	m := map[string]any{
		"uid":                  a.uid,
		"advisoryId":           a.advisoryID,
		"artifactName":         a.artifactName,
		"createTime":           fmtMs(a.createMs),
		"updateTime":           fmtMs(a.updateMs),
		"author":               a.author,
		"artifactType":         a.artifactType,
		"artifactArchitecture": a.artifactArch,
		"componentName":        a.componentName,
		"componentLocation":    a.componentLocation,
		"componentType":        a.componentType,
		"aliases":              append([]string{}, a.aliases...),
	}
	sev := make([]any, len(a.severities))
	for i, x := range a.severities {
		sev[i] = map[string]any{"type": x.typ, "score": x.score}
	}
	m["severities"] = sev
	evs := make([]any, len(a.events))
	for i, e := range a.events {
		evs[i] = s.renderEvent(e)
	}
	m["events"] = evs
	// Optional fields are absent when unset, in either mode. A withdrawn
	// advisory stays listed, with its deleteTime set.
	if a.legacyID != "" {
		m["legacyAdvisoryId"] = a.legacyID
	}
	if a.deleteMs != 0 {
		m["deleteTime"] = fmtMs(a.deleteMs)
	}
	return s.wire("advisory", a.uid, m)
}

// advisoryFilters are the list filters of ListAdvisoriesRequest that match
// one of an advisory's string fields against any of several values.
var advisoryFilters = map[string]func(a *advisory) []string{
	"advisoryIds":           func(a *advisory) []string { return []string{a.advisoryID} },
	"legacyAdvisoryIds":     func(a *advisory) []string { return []string{a.legacyID} },
	"artifactNames":         func(a *advisory) []string { return []string{a.artifactName} },
	"artifactTypes":         func(a *advisory) []string { return []string{a.artifactType} },
	"artifactArchitectures": func(a *advisory) []string { return []string{a.artifactArch} },
	"componentNames":        func(a *advisory) []string { return []string{a.componentName} },
	"componentTypes":        func(a *advisory) []string { return []string{a.componentType} },
	"componentLocations":    func(a *advisory) []string { return []string{a.componentLocation} },
	"aliases":               func(a *advisory) []string { return a.aliases },
	"eventReviewStates": func(a *advisory) []string {
		return eventValues(a, func(e *advEvent) string { return e.reviewState })
	},
	"eventAuthors":   func(a *advisory) []string { return eventValues(a, func(e *advEvent) string { return e.author }) },
	"eventReviewers": func(a *advisory) []string { return eventValues(a, func(e *advEvent) string { return e.reviewer }) },
	"eventTypes":     func(a *advisory) []string { return eventValues(a, func(e *advEvent) string { return e.kind }) },
}

func eventValues(a *advisory, f func(*advEvent) string) []string {
	out := make([]string, len(a.events))
	for i, e := range a.events {
		out[i] = f(e)
	}
	return out
}

// advisoryMatcher reads the advisory list's filters into a predicate.
func (s *Sim) advisoryMatcher(q query) (func(*advisory) bool, *apiError) {
	want := map[string][]string{}
	for name := range advisoryFilters {
		if vs := q.list(name); len(vs) > 0 {
			want[name] = vs
		}
	}
	// Enum filters take the value's name or number.
	for i, v := range want["eventTypes"] {
		kind, ok := eventTypeFilters[v]
		if !ok {
			return nil, s.errInvalid("event_types", "unknown EventTypeFilter "+v)
		}
		want["eventTypes"][i] = kind
	}
	latest := q.get("latestEventType")
	if latest != "" {
		kind, ok := eventTypeFilters[latest]
		if !ok {
			return nil, s.errInvalid("latest_event_type", "unknown EventTypeFilter "+latest)
		}
		latest = kind
	}
	text := strings.ToLower(q.get("query"))
	excluded := q.list("excludeEventAuthors")
	return func(a *advisory) bool {
		for name, vs := range want {
			if !slices.ContainsFunc(advisoryFilters[name](a), func(v string) bool { return slices.Contains(vs, v) }) {
				return false
			}
		}
		if latest != "" && a.latestApproved() != latest {
			return false
		}
		if len(excluded) > 0 &&
			slices.ContainsFunc(a.events, func(e *advEvent) bool { return slices.Contains(excluded, e.author) }) {
			return false
		}
		if text != "" && !strings.Contains(strings.ToLower(a.artifactName), text) &&
			!strings.Contains(strings.ToLower(a.componentName), text) &&
			!slices.ContainsFunc(a.aliases, func(x string) bool { return strings.Contains(strings.ToLower(x), text) }) {
			return false
		}
		return true
	}, nil
}

func (s *Sim) listAdvisories(w http.ResponseWriter, r *http.Request, _ route) {
	p, e := s.parseListParams(r, timeAliases(map[string]string{
		"uid": "uid", "advisory_id": "advisory_id", "advisoryId": "advisory_id",
		"artifact_name": "artifact_name", "artifactName": "artifact_name",
	}))
	if e != nil {
		writeError(w, e)
		return
	}
	match, e := s.advisoryMatcher(p.q)
	if e != nil {
		writeError(w, e)
		return
	}
	s.mu.RLock()
	resp, e := paginateCached(s, p, "", func() []*advisory {
		var items []*advisory
		for _, a := range s.advisories {
			if p.scopeMatches(a.uid) && match(a) {
				items = append(items, a)
			}
		}
		return items
	}, s.advisoryLister())
	s.mu.RUnlock()
	writeResult(w, resp, e)
}

func (s *Sim) getAdvisory(w http.ResponseWriter, _ *http.Request, rt route) {
	s.mu.RLock()
	a, ok := s.advisories[rt.uid]
	var resp map[string]any
	if ok {
		resp = s.renderAdvisory(a)
	}
	s.mu.RUnlock()
	if !ok {
		writeError(w, s.errNotFound("advisory", rt.uid))
		return
	}
	writeJSON(w, http.StatusOK, resp)
}
