package platformsim

import (
	"net/http"
	"slices"
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
		"uid":          a.uid,
		"advisoryId":   a.advisoryID,
		"artifactName": a.artifactName,
		"createTime":   fmtMs(a.createMs),
		"updateTime":   fmtMs(a.updateMs),
	}
	// A withdrawn advisory stays listed, with its deleteTime set.
	if a.deleteMs != 0 {
		m["deleteTime"] = fmtMs(a.deleteMs)
	}
	return s.wire("advisory", a.uid, m)
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
	names, ids := p.q.list("artifactNames"), p.q.list("advisoryIds")
	s.mu.RLock()
	var items []*advisory
	for _, a := range s.advisories {
		if !p.scopeMatches(a.uid) {
			continue
		}
		if len(names) > 0 && !slices.Contains(names, a.artifactName) {
			continue
		}
		if len(ids) > 0 && !slices.Contains(ids, a.advisoryID) {
			continue
		}
		items = append(items, a)
	}
	resp, e := paginate(s, p, items, s.advisoryLister())
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
