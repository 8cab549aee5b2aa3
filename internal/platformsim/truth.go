package platformsim

import (
	"sort"
	"time"
)

// Truth is a deep copy of the simulator's data, for tests to compare a
// mirror against. Slices are sorted by uid.
type Truth struct {
	// Groups are the organization's groups, the root group included.
	Groups     []TruthGroup             `json:"groups"`
	Repos      []TruthRepo              `json:"repos"`
	Tags       []TruthTag               `json:"tags"`
	History    map[string][]TruthRecord `json:"history"` // by tag uid, oldest first
	Advisories []TruthAdvisory          `json:"advisories"`
	// PublicTags are the public organization's images, reachable only
	// through the registry.
	PublicTags []TruthPublicTag `json:"publicTags"`
}

// TruthGroup is a group of the organization.
type TruthGroup struct {
	UID  string `json:"uid"`
	Name string `json:"name"`
}

// TruthRepo is a repo of the organization.
type TruthRepo struct {
	UID  string `json:"uid"`
	Name string `json:"name"`
	// Path is the repo's registry path below the organization: the names
	// of its uid's segments below the root group, joined by "/" (equal to
	// Name for a repo directly under the root group).
	Path        string    `json:"path"`
	Description string    `json:"description"`
	CreateTime  time.Time `json:"createTime"`
	UpdateTime  time.Time `json:"updateTime"`
}

// TruthTag is a tag of one of the organization's repos.
type TruthTag struct {
	UID        string    `json:"uid"`
	RepoUID    string    `json:"repoUid"`
	Name       string    `json:"name"`
	Digest     string    `json:"digest"`
	Deprecated bool      `json:"deprecated"`
	UpdateTime time.Time `json:"updateTime"`
	// Family is the hidden tag family of the name (FamilyDates,
	// FamilyEpochs, FamilyReferrers), "" for an ordinary tag.
	Family string `json:"family,omitempty"`
}

// TruthRecord is one tag history record.
type TruthRecord struct {
	UpdateTime time.Time `json:"updateTime"`
	Digest     string    `json:"digest"`
}

// TruthAdvisory is a vulnerability advisory.
type TruthAdvisory struct {
	UID          string    `json:"uid"`
	AdvisoryID   string    `json:"advisoryId"`
	ArtifactName string    `json:"artifactName"`
	CreateTime   time.Time `json:"createTime"`
	UpdateTime   time.Time `json:"updateTime"`
	// DeleteTime is when the advisory was withdrawn; nil while it is live.
	DeleteTime           *time.Time `json:"deleteTime,omitempty"`
	Author               string     `json:"author"`
	ArtifactType         string     `json:"artifactType"`
	ArtifactArchitecture string     `json:"artifactArchitecture"`
	ComponentName        string     `json:"componentName"`
	ComponentLocation    string     `json:"componentLocation"`
	ComponentType        string     `json:"componentType"`
	// LegacyAdvisoryID is "" when the advisory has none.
	LegacyAdvisoryID string          `json:"legacyAdvisoryId,omitempty"`
	Aliases          []string        `json:"aliases"`
	Severities       []TruthSeverity `json:"severities"`
	// Events is the lifecycle, oldest first.
	Events []TruthAdvisoryEvent `json:"events"`
}

// TruthSeverity is one severity of an advisory.
type TruthSeverity struct {
	Type  string `json:"type"`
	Score string `json:"score"`
}

// TruthAdvisoryEvent is one event of an advisory's lifecycle.
type TruthAdvisoryEvent struct {
	UID         string    `json:"uid"`
	CreateTime  time.Time `json:"createTime"`
	Author      string    `json:"author"`
	Reviewer    string    `json:"reviewer,omitempty"`
	ReviewState string    `json:"reviewState"`
	Issue       string    `json:"issue,omitempty"`
	// Findings are the scanner's findings (JSON), served in base64.
	Findings []byte `json:"findings,omitempty"`
	// Kind is the oneof member (EventDetection, EventFixed, ...).
	Kind string `json:"kind"`
	// DetectionType is how a detection was made (DetectionScan, ...), and
	// Match what it matched: the detection's fields that are set, by JSON
	// name.
	DetectionType string            `json:"detectionType,omitempty"`
	Match         map[string]string `json:"match,omitempty"`
	// The fields of the other kinds.
	Note              string   `json:"note,omitempty"`
	FixedVersion      string   `json:"fixedVersion,omitempty"`
	PatchedVersions   []string `json:"patchedVersions,omitempty"`
	FalsePositiveType string   `json:"falsePositiveType,omitempty"`
}

func truthAdvisory(a *advisory) TruthAdvisory {
	ta := TruthAdvisory{UID: a.uid, AdvisoryID: a.advisoryID, ArtifactName: a.artifactName,
		CreateTime: msTime(a.createMs), UpdateTime: msTime(a.updateMs), Author: a.author, ArtifactType: a.artifactType,
		ArtifactArchitecture: a.artifactArch, ComponentName: a.componentName, ComponentLocation: a.componentLocation,
		ComponentType: a.componentType, LegacyAdvisoryID: a.legacyID, Aliases: append([]string(nil), a.aliases...)}
	if a.deleteMs != 0 {
		d := msTime(a.deleteMs)
		ta.DeleteTime = &d
	}
	for _, x := range a.severities {
		ta.Severities = append(ta.Severities, TruthSeverity{Type: x.typ, Score: x.score})
	}
	for _, e := range a.events {
		te := TruthAdvisoryEvent{
			UID:               e.uid,
			CreateTime:        msTime(e.createMs),
			Author:            e.author,
			Reviewer:          e.reviewer,
			ReviewState:       e.reviewState,
			Issue:             e.issue,
			Findings:          append([]byte(nil), e.findings...),
			Kind:              e.kind,
			DetectionType:     e.how,
			Note:              e.note,
			FixedVersion:      e.fixedVersion,
			PatchedVersions:   append([]string(nil), e.patched...),
			FalsePositiveType: e.fp,
		}
		for _, kv := range e.match {
			if kv[1] != "" {
				if te.Match == nil {
					te.Match = map[string]string{}
				}
				te.Match[kv[0]] = kv[1]
			}
		}
		ta.Events = append(ta.Events, te)
	}
	return ta
}

// TruthPublicTag is a tag of a public image with its history.
type TruthPublicTag struct {
	Image   string        `json:"image"`
	Tag     string        `json:"tag"`
	Digest  string        `json:"digest"`
	History []TruthRecord `json:"history"`
}

func msTime(ms int64) time.Time { return time.UnixMilli(ms).UTC() }

func truthHistory(h []histRec) []TruthRecord {
	out := make([]TruthRecord, len(h))
	for i, r := range h {
		out[i] = TruthRecord{UpdateTime: msTime(r.ms), Digest: fmtDigest(r.digest)}
	}
	return out
}

// Truth returns a deep copy of the ground truth.
func (s *Sim) Truth() Truth {
	s.mu.RLock()
	defer s.mu.RUnlock()
	t := Truth{History: make(map[string][]TruthRecord, len(s.tags))}
	for _, g := range s.groups {
		t.Groups = append(t.Groups, TruthGroup{UID: g.uid, Name: g.name})
	}
	for _, r := range s.repos {
		path, _ := s.pathLocked(r.uid)
		t.Repos = append(t.Repos, TruthRepo{UID: r.uid, Name: r.name, Path: path, Description: r.description,
			CreateTime: msTime(r.createMs), UpdateTime: msTime(r.updateMs)})
	}
	for _, tg := range s.tags {
		t.Tags = append(t.Tags, TruthTag{UID: tg.uid, RepoUID: tg.repoUID, Name: tg.name,
			Digest: fmtDigest(tg.digest), Deprecated: tg.deprecated, UpdateTime: msTime(tg.updateMs),
			Family: TagFamily(tg.name)})
		t.History[tg.uid] = truthHistory(tg.history)
	}
	for _, a := range s.advisories {
		t.Advisories = append(t.Advisories, truthAdvisory(a))
	}
	for _, pi := range s.public {
		for _, tg := range pi.tags {
			t.PublicTags = append(t.PublicTags, TruthPublicTag{Image: pi.name, Tag: tg.name,
				Digest: fmtDigest(tg.digest), History: truthHistory(tg.history)})
		}
	}
	sort.Slice(t.Groups, func(i, j int) bool { return t.Groups[i].UID < t.Groups[j].UID })
	sort.Slice(t.Repos, func(i, j int) bool { return t.Repos[i].UID < t.Repos[j].UID })
	sort.Slice(t.Tags, func(i, j int) bool { return t.Tags[i].UID < t.Tags[j].UID })
	sort.Slice(t.Advisories, func(i, j int) bool { return t.Advisories[i].UID < t.Advisories[j].UID })
	sort.Slice(t.PublicTags, func(i, j int) bool {
		a, b := t.PublicTags[i], t.PublicTags[j]
		return a.Image < b.Image || (a.Image == b.Image && a.Tag < b.Tag)
	})
	return t
}

// History returns one tag's history records, oldest first, without copying
// the whole ground truth.
func (s *Sim) History(tagUID string) ([]TruthRecord, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	t, ok := s.tags[tagUID]
	if !ok {
		return nil, false
	}
	return truthHistory(t.history), true
}
