package platform

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The kinds of advisory lifecycle step: the members of the proto's oneof
// `type` in AdvisoryEvent, by the JSON names the gateway gives them.
const (
	KindDetection                  = "detection"
	KindFixed                      = "fixed"
	KindFalsePositiveDetermination = "falsePositiveDetermination"
	KindTruePositiveDetermination  = "truePositiveDetermination"
	KindAnalysisNotPlanned         = "analysisNotPlanned"
	KindFixNotPlanned              = "fixNotPlanned"
	KindPendingUpstreamFix         = "pendingUpstreamFix"
	KindPatched                    = "patched"
)

// knownKinds are the kinds above, in the order the proto numbers them.
var knownKinds = [...]string{KindDetection, KindFixed, KindFalsePositiveDetermination, KindAnalysisNotPlanned,
	KindFixNotPlanned, KindPendingUpstreamFix, KindTruePositiveDetermination, KindPatched}

// AdvisoryEvent is one step of an advisory's lifecycle. The proto keeps the
// step's kind in a oneof, which the gateway renders as one member named
// after the kind, holding the kind's fields: {"uid": …, "fixed":
// {"fixedVersion": "1.2.3-r1"}}. Kind names the member present and Details
// keeps it as received; a kind this client does not know yet is kept the
// same way rather than dropped. The kind's fields syncd models are copied
// out of it (Note, FixedVersion, ...).
type AdvisoryEvent struct {
	UID        string    `json:"uid"`
	CreateTime time.Time `json:"createTime,omitzero"`
	// Findings is the scanner's findings, bytes that protojson renders in
	// base64; kept as received.
	Findings string `json:"findings,omitempty"`
	Author   string `json:"author,omitempty"`
	Reviewer string `json:"reviewer,omitempty"`
	// ReviewState is REVIEW_STATE_PENDING, _APPROVED, _REQUEST_CHANGES or
	// _REJECTED.
	ReviewState string `json:"reviewState,omitempty"`
	Issue       string `json:"issue,omitempty"`

	// Kind is the member of the oneof that is set (KindFixed, ...), or
	// another member's name for a kind added upstream; "" when none is.
	Kind string `json:"-"`
	// Details is that member's JSON object as received.
	Details json.RawMessage `json:"-"`

	// Note is the note every kind but detection carries.
	Note string `json:"-"`
	// FixedVersion is the first fixed version, of a fixed step.
	FixedVersion string `json:"-"`
	// PatchedVersions are the patched versions, of a patched step.
	PatchedVersions []string `json:"-"`
	// FalsePositiveType is the false positive's type (TYPE_…), of a
	// false positive determination.
	FalsePositiveType string `json:"-"`
	// DetectionType is how a detection was made: the member of the
	// detection's own oneof ("scanv1", "nvdapi" or "manual").
	DetectionType string `json:"-"`
}

// UnmarshalJSON decodes an event as the gateway renders it. The known
// kinds are read with the common fields in one pass; only an event with
// none of them is read again, for a kind added upstream.
func (e *AdvisoryEvent) UnmarshalJSON(b []byte) error {
	type common AdvisoryEvent // the same fields, without this method
	var c struct {
		common
		Detection          json.RawMessage `json:"detection"`
		Fixed              json.RawMessage `json:"fixed"`
		FalsePositive      json.RawMessage `json:"falsePositiveDetermination"`
		AnalysisNotPlanned json.RawMessage `json:"analysisNotPlanned"`
		FixNotPlanned      json.RawMessage `json:"fixNotPlanned"`
		PendingUpstream    json.RawMessage `json:"pendingUpstreamFix"`
		TruePositive       json.RawMessage `json:"truePositiveDetermination"`
		Patched            json.RawMessage `json:"patched"`
	}
	// The members in knownKinds' order, by the JSON names of the kinds.
	members := [...]*json.RawMessage{&c.Detection, &c.Fixed, &c.FalsePositive, &c.AnalysisNotPlanned, &c.FixNotPlanned,
		&c.PendingUpstream, &c.TruePositive, &c.Patched}
	if err := json.Unmarshal(b, &c); err != nil {
		return err
	}
	*e = AdvisoryEvent(c.common)
	for i, m := range members {
		if len(*m) > 0 && string(*m) != "null" {
			e.Kind, e.Details = knownKinds[i], *m
			break
		}
	}
	if e.Kind == "" {
		var all map[string]json.RawMessage
		if err := json.Unmarshal(b, &all); err != nil {
			return err
		}
		e.Kind, e.Details = kindMember(all)
		return nil // a kind of unknown shape: Details has it all
	}
	if e.Kind == KindDetection {
		var how map[string]json.RawMessage
		if err := json.Unmarshal(e.Details, &how); err != nil {
			return fmt.Errorf("decode detection of advisory event %s: %w", e.UID, err)
		}
		e.DetectionType, _ = kindMember(how)
		return nil
	}
	var d struct {
		Note            string   `json:"note"`
		FixedVersion    string   `json:"fixedVersion"`
		PatchedVersions []string `json:"patchedVersions"`
		Type            string   `json:"type"`
	}
	if err := json.Unmarshal(e.Details, &d); err != nil {
		return fmt.Errorf("decode %s of advisory event %s: %w", e.Kind, e.UID, err)
	}
	e.Note, e.FixedVersion, e.PatchedVersions = d.Note, d.FixedVersion, d.PatchedVersions
	if e.Kind == KindFalsePositiveDetermination {
		e.FalsePositiveType = d.Type
	}
	return nil
}

// eventFields are the members of an advisory event outside its oneof.
var eventFields = []string{"uid", "createTime", "findings", "author", "reviewer", "reviewState", "issue"}

// kindMember finds the member of a oneof in members: the first member (by
// name) holding an object that is not one of an event's common fields.
// Only one member of a oneof is ever rendered; a member rendered as null is
// not set.
func kindMember(members map[string]json.RawMessage) (string, json.RawMessage) {
	names := make([]string, 0, len(members))
	for k := range members {
		names = append(names, k)
	}
	slices.Sort(names)
	for _, k := range names {
		if v := bytes.TrimSpace(members[k]); len(v) > 0 && v[0] == '{' && !slices.Contains(eventFields, k) {
			return k, members[k]
		}
	}
	return "", nil
}

// AdvisoryFilter holds filters of the advisory list beyond ListQuery's
// (ListAdvisoriesRequest in the proto). Each list matches any of its
// values; empty lists do not filter.
type AdvisoryFilter struct {
	AdvisoryIDs, ArtifactNames, ArtifactTypes, ComponentNames, Aliases []string
	// EventTypes keeps advisories having an event of one of these types,
	// spelled as the proto's EventTypeFilter (EVENT_TYPE_FILTER_FIXED, ...).
	EventTypes []string
	// LatestEventType keeps advisories whose latest approved event has
	// this type (an EventTypeFilter name).
	LatestEventType string
}

// Query returns q with the filter's parameters added to q.Extra.
func (f AdvisoryFilter) Query(q ListQuery) ListQuery {
	extra := make(map[string][]string, len(q.Extra)+7)
	for k, vs := range q.Extra {
		extra[k] = append([]string(nil), vs...)
	}
	for name, vs := range map[string][]string{
		"advisory_ids":    f.AdvisoryIDs,
		"artifact_names":  f.ArtifactNames,
		"artifact_types":  f.ArtifactTypes,
		"component_names": f.ComponentNames,
		"aliases":         f.Aliases,
		"event_types":     f.EventTypes,
	} {
		if len(vs) > 0 {
			extra[name] = append(extra[name], vs...)
		}
	}
	if f.LatestEventType != "" {
		extra["latest_event_type"] = []string{strings.TrimSpace(f.LatestEventType)}
	}
	q.Extra = extra
	return q
}
