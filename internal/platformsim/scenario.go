package platformsim

import (
	"fmt"
	"slices"
	"time"
)

func (s *Sim) indexRepoLocked(rp *repo) {
	rp.idx = len(s.repoList)
	s.repoList = append(s.repoList, rp)
}

func (s *Sim) unindexRepoLocked(rp *repo) {
	last := s.repoList[len(s.repoList)-1]
	s.repoList[rp.idx], last.idx = last, rp.idx
	s.repoList = s.repoList[:len(s.repoList)-1]
}

func (s *Sim) indexTagLocked(t *tag) {
	t.idx = len(s.tagList)
	s.tagList = append(s.tagList, t)
}

func (s *Sim) unindexTagLocked(t *tag) {
	last := s.tagList[len(s.tagList)-1]
	s.tagList[t.idx], last.idx = last, t.idx
	s.tagList = s.tagList[:len(s.tagList)-1]
}

func (s *Sim) addAdvisoryLocked(a *advisory) {
	s.advisories[a.uid] = a
	a.idx = len(s.advList)
	s.advList = append(s.advList, a)
}

func (s *Sim) removeAdvisoryLocked(a *advisory) {
	delete(s.advisories, a.uid)
	last := s.advList[len(s.advList)-1]
	s.advList[a.idx], last.idx = last, a.idx
	s.advList = s.advList[:len(s.advList)-1]
}

// MutationKind names a change the scenario engine can make.
type MutationKind string

// The mutations of the scenario engine.
const (
	TagMoved        MutationKind = "tag.moved"
	TagDeprecated   MutationKind = "tag.deprecated"
	TagCreated      MutationKind = "tag.created"
	TagDeleted      MutationKind = "tag.deleted"
	RepoCreated     MutationKind = "repo.created"
	RepoDeleted     MutationKind = "repo.deleted"
	AdvisoryCreated MutationKind = "advisory.created"
	AdvisoryUpdated MutationKind = "advisory.updated"
	RepoDescribed   MutationKind = "repo.updated"
	// AdvisoryWithdrawn sets an advisory's deleteTime: it stays listed and
	// gettable, as upstream keeps withdrawn advisories.
	AdvisoryWithdrawn MutationKind = "advisory.withdrawn"
	// AdvisoryDeleted removes an advisory outright, so it is neither listed
	// nor found any more.
	AdvisoryDeleted MutationKind = "advisory.deleted"
	// AdvisoryEventAdded appends a step to an advisory's lifecycle: an
	// event of kind Mutation.Event (EventFixed, ...), reviewed as
	// Mutation.Review (default approved), at version Mutation.Version for a
	// fix or a patch (default the next epoch of the detected version).
	AdvisoryEventAdded MutationKind = "advisory.event"
	// AdvisoryReviewed approves an advisory's latest event pending review.
	AdvisoryReviewed MutationKind = "advisory.reviewed"
)

// Mutation is one applied change, as returned by Step and accepted by Apply.
type Mutation struct {
	Kind MutationKind `json:"kind"`
	// UID is the changed resource (for TagCreated and RepoCreated, the new
	// one; Apply ignores it for creations).
	UID string `json:"uid,omitempty"`
	// RepoUID is the tag's repo; for Apply(TagCreated) the repo to create
	// in; for Apply(RepoCreated) the parent group (default the root group).
	RepoUID string `json:"repoUid,omitempty"`
	// Name of a created repo or tag, or the description of RepoDescribed.
	Name string `json:"name,omitempty"`
	// Digest is the new digest of a moved or created tag.
	Digest         string `json:"digest,omitempty"`
	PreviousDigest string `json:"previousDigest,omitempty"`
	// Event is the kind of an added advisory event; EventUID its uid.
	Event    string `json:"event,omitempty"`
	EventUID string `json:"eventUid,omitempty"`
	// Version is a fixed or patched event's version.
	Version string `json:"version,omitempty"`
	// Review is an added advisory event's review state.
	Review string    `json:"review,omitempty"`
	Time   time.Time `json:"time"`
}

// Rates weights the mutation kinds Step draws; only ratios matter.
type Rates struct {
	MoveTag        float64 `json:"moveTag"`
	Deprecate      float64 `json:"deprecate"`
	CreateTag      float64 `json:"createTag"`
	DeleteTag      float64 `json:"deleteTag"`
	CreateRepo     float64 `json:"createRepo"`
	DeleteRepo     float64 `json:"deleteRepo"`
	UpdateRepo     float64 `json:"updateRepo"`
	CreateAdvisory float64 `json:"createAdvisory"`
	UpdateAdvisory float64 `json:"updateAdvisory"`
	// WithdrawAdvisory and DeleteAdvisory are 0 in DefaultRates, so the
	// mix of existing scenarios is unchanged.
	WithdrawAdvisory float64 `json:"withdrawAdvisory"`
	DeleteAdvisory   float64 `json:"deleteAdvisory"`
	// AdvanceAdvisory moves an advisory one step along its lifecycle
	// (AdvisoryEventAdded, or AdvisoryReviewed when its latest event
	// awaits review); 0 in DefaultRates.
	AdvanceAdvisory float64 `json:"advanceAdvisory"`
}

// DefaultRates is mostly tag moves, with a little of everything else.
func DefaultRates() Rates {
	return Rates{MoveTag: 70, Deprecate: 5, CreateTag: 5, DeleteTag: 2,
		CreateRepo: 2, DeleteRepo: 1, UpdateRepo: 2, CreateAdvisory: 7, UpdateAdvisory: 6}
}

// StrictRates is DefaultRates with advisory withdrawals and lifecycles, the
// default of a Strict simulator.
func StrictRates() Rates {
	r := DefaultRates()
	r.WithdrawAdvisory, r.AdvanceAdvisory = 2, 8
	return r
}

// SetRates changes the mix of mutations Step applies.
func (s *Sim) SetRates(r Rates) {
	s.mu.Lock()
	s.opts.Rates = r
	s.mu.Unlock()
}

// Step applies n seeded random mutations at the simulator's current time
// and returns them in order.
func (s *Sim) Step(n int) []Mutation {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]Mutation, 0, n)
	for range n {
		if m, ok := s.randomMutationLocked(); ok {
			out = append(out, m)
		}
	}
	return out
}

func (s *Sim) pickKindLocked() MutationKind {
	r := s.opts.Rates
	choices := []struct {
		k MutationKind
		w float64
	}{
		{TagMoved, r.MoveTag}, {TagDeprecated, r.Deprecate}, {TagCreated, r.CreateTag},
		{TagDeleted, r.DeleteTag}, {RepoCreated, r.CreateRepo}, {RepoDeleted, r.DeleteRepo},
		{RepoDescribed, r.UpdateRepo}, {AdvisoryCreated, r.CreateAdvisory}, {AdvisoryUpdated, r.UpdateAdvisory},
		{AdvisoryWithdrawn, r.WithdrawAdvisory}, {AdvisoryDeleted, r.DeleteAdvisory}, {AdvisoryEventAdded, r.AdvanceAdvisory},
	}
	var total float64
	for _, c := range choices {
		total += max(c.w, 0)
	}
	if total == 0 {
		return TagMoved
	}
	x := s.rng.Float64() * total
	for _, c := range choices {
		if x < max(c.w, 0) {
			return c.k
		}
		x -= max(c.w, 0)
	}
	return TagMoved
}

// randomMutationLocked draws and applies one mutation. When the drawn kind
// has nothing to act on (no tags to move), it creates a repo instead, so a
// Step always changes something.
func (s *Sim) randomMutationLocked() (Mutation, bool) {
	k := s.pickKindLocked()
	m := Mutation{Kind: k}
	switch k {
	case TagMoved:
		if len(s.tagList) > 0 {
			t := s.tagList[s.rng.IntN(len(s.tagList))]
			m.UID, m.Digest = t.uid, fmtDigest(randDigest(s.rng))
		}
	case TagDeprecated:
		// A handful of draws finds a live tag without scanning all tags.
		for range 8 {
			if len(s.tagList) == 0 {
				break
			}
			if t := s.tagList[s.rng.IntN(len(s.tagList))]; !t.deprecated {
				m.UID = t.uid
				break
			}
		}
	case TagDeleted:
		if len(s.tagList) > 0 {
			m.UID = s.tagList[s.rng.IntN(len(s.tagList))].uid
		}
	case TagCreated:
		if len(s.repoList) > 0 {
			rp := s.repoList[s.rng.IntN(len(s.repoList))]
			m.RepoUID, m.Digest = rp.uid, fmtDigest(randDigest(s.rng))
			m.Name = fmt.Sprintf("%d.%d.%d-r%d", 1+s.rng.IntN(9), s.rng.IntN(30), s.rng.IntN(30), s.rng.IntN(10))
		}
	case RepoDeleted:
		// Keep the organization from draining under a delete-heavy mix.
		if len(s.repoList) > 1 {
			m.UID = s.repoList[s.rng.IntN(len(s.repoList))].uid
		}
	case RepoDescribed:
		if len(s.repoList) > 0 {
			m.UID = s.repoList[s.rng.IntN(len(s.repoList))].uid
			m.Name = fmt.Sprintf("Minimal image, revision %d", s.rng.IntN(1000))
		}
	case RepoCreated:
		words := imageWords()
		m.Name = fmt.Sprintf("%s-%s", words[s.rng.IntN(len(words))], newSegmentFrom(s.rng)[:6])
	case AdvisoryUpdated:
		if len(s.advList) > 0 {
			m.UID = s.advList[s.rng.IntN(len(s.advList))].uid
		}
	case AdvisoryCreated:
		words := imageWords()
		m.Name = words[s.rng.IntN(len(words))]
	case AdvisoryWithdrawn:
		for range 8 {
			if len(s.advList) == 0 {
				break
			}
			if a := s.advList[s.rng.IntN(len(s.advList))]; a.deleteMs == 0 {
				m.UID = a.uid
				break
			}
		}
	case AdvisoryDeleted:
		if len(s.advList) > 0 {
			m.UID = s.advList[s.rng.IntN(len(s.advList))].uid
		}
	case AdvisoryEventAdded:
		m = s.advanceLocked()
	}
	if m.UID == "" && m.RepoUID == "" && m.Name == "" {
		words := imageWords()
		m = Mutation{Kind: RepoCreated, Name: fmt.Sprintf("%s-%s", words[s.rng.IntN(len(words))], newSegmentFrom(s.rng)[:6])}
	}
	out, err := s.applyLocked(m)
	return out, err == nil
}

// MoveTag points a tag at digest now, appending a history record.
func (s *Sim) MoveTag(tagUID, digest string) error {
	_, err := s.Apply(Mutation{Kind: TagMoved, UID: tagUID, Digest: digest})
	return err
}

// Apply performs one mutation at the simulator's current time, emitting the
// events the upstream would, and returns it completed (uids, time).
func (s *Sim) Apply(m Mutation) (Mutation, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.applyLocked(m)
}

func (s *Sim) applyLocked(m Mutation) (Mutation, error) {
	now := s.nowLocked()
	ms := now.UnixMilli()
	m.Time = now.UTC().Truncate(time.Millisecond)
	switch m.Kind {
	case TagMoved:
		t, ok := s.tags[m.UID]
		if !ok {
			return m, fmt.Errorf("move tag %s: no such tag", m.UID)
		}
		d, err := parseDigest(m.Digest)
		if err != nil {
			return m, fmt.Errorf("move tag %s: %w", m.UID, err)
		}
		prev := t.digest
		m.RepoUID, m.PreviousDigest = t.repoUID, fmtDigest(prev)
		// Records stay ordered even if the clock was moved backwards.
		ms = max(ms, t.history[len(t.history)-1].ms)
		t.history = append(t.history, histRec{ms: ms, digest: d})
		t.digest, t.updateMs = d, ms
		if rp, ok := s.repos[t.repoUID]; ok {
			s.emitPushLocked(rp, t, prev)
		}
	case TagDeprecated:
		t, ok := s.tags[m.UID]
		if !ok {
			return m, fmt.Errorf("deprecate tag %s: no such tag", m.UID)
		}
		m.RepoUID = t.repoUID
		// The upstream has no event for deprecation: only a crawl sees it.
		t.deprecated, t.updateMs = true, ms
	case TagCreated:
		rp, ok := s.repos[m.RepoUID]
		if !ok {
			return m, fmt.Errorf("create tag in %s: no such repo", m.RepoUID)
		}
		d, err := parseDigest(m.Digest)
		if err != nil {
			return m, fmt.Errorf("create tag in %s: %w", m.RepoUID, err)
		}
		for _, t := range rp.tags {
			if t.name == m.Name {
				return m, fmt.Errorf("create tag %s in %s: exists", m.Name, m.RepoUID)
			}
		}
		m.UID = s.addTagLocked(rp, m.Name, d, false).uid
	case TagDeleted:
		t, ok := s.tags[m.UID]
		if !ok {
			return m, fmt.Errorf("delete tag %s: no such tag", m.UID)
		}
		m.RepoUID = t.repoUID
		s.removeTagLocked(t)
	case RepoCreated:
		if m.Name == "" {
			return m, fmt.Errorf("create repo: name is required")
		}
		parent := m.RepoUID
		if parent == "" {
			parent = s.opts.RootGroup
		}
		if _, ok := s.groups[parent]; !ok {
			return m, fmt.Errorf("create repo %s: no group %s", m.Name, parent)
		}
		if s.repoByNameLocked(parent, m.Name) != nil {
			return m, fmt.Errorf("create repo %s: exists", m.Name)
		}
		rp := s.addRepoLocked(
			parent,
			repo{name: m.Name, description: "Minimal image for " + m.Name, catalogTier: "APPLICATION"},
		)
		m.UID, m.RepoUID = rp.uid, ""
	case RepoDeleted:
		rp, ok := s.repos[m.UID]
		if !ok {
			return m, fmt.Errorf("delete repo %s: no such repo", m.UID)
		}
		s.removeRepoLocked(rp)
	case RepoDescribed:
		rp, ok := s.repos[m.UID]
		if !ok {
			return m, fmt.Errorf("update repo %s: no such repo", m.UID)
		}
		rp.description, rp.updateMs = m.Name, ms
		s.emitLocked(s.platformEvent("registry.repo.updated"), rp.uid, s.renderRepo(rp))
	case AdvisoryCreated:
		a := &advisory{uid: newSegmentFrom(s.rng) + newSegmentFrom(s.rng), advisoryID: advisoryID(s.rng),
			artifactName: m.Name, createMs: ms, updateMs: ms}
		fillAdvisory(advisoryRand(s.opts.Seed, a.uid), a, max(len(s.advList)/3, 3), s.opts.ErrorDomain)
		s.addAdvisoryLocked(a)
		m.UID, m.Name = a.uid, a.artifactName
		m.Event, m.EventUID = a.events[0].kind, a.events[0].uid
	case AdvisoryEventAdded:
		return s.addEventLocked(m, ms)
	case AdvisoryReviewed:
		a, ok := s.advisories[m.UID]
		if !ok {
			return m, fmt.Errorf("review advisory %s: no such advisory", m.UID)
		}
		e := a.events[len(a.events)-1]
		if e.reviewState == ReviewApproved {
			return m, fmt.Errorf("review advisory %s: its latest event %s is approved already", m.UID, e.uid)
		}
		e.reviewState, e.reviewer = ReviewApproved, "lead@"+s.opts.ErrorDomain
		a.updateMs = max(ms, a.updateMs)
		m.Name, m.Event, m.EventUID, m.Review = a.artifactName, e.kind, e.uid, e.reviewState
	case AdvisoryUpdated:
		a, ok := s.advisories[m.UID]
		if !ok {
			return m, fmt.Errorf("update advisory %s: no such advisory", m.UID)
		}
		a.updateMs = ms
		m.Name = a.artifactName
	case AdvisoryWithdrawn:
		a, ok := s.advisories[m.UID]
		if !ok {
			return m, fmt.Errorf("withdraw advisory %s: no such advisory", m.UID)
		}
		if a.deleteMs != 0 {
			return m, fmt.Errorf("withdraw advisory %s: withdrawn already at %s", m.UID, fmtMs(a.deleteMs))
		}
		a.deleteMs, a.updateMs = ms, ms
		m.Name = a.artifactName
	case AdvisoryDeleted:
		a, ok := s.advisories[m.UID]
		if !ok {
			return m, fmt.Errorf("delete advisory %s: no such advisory", m.UID)
		}
		s.removeAdvisoryLocked(a)
		m.Name = a.artifactName
	default:
		return m, fmt.Errorf("unknown mutation kind %q", m.Kind)
	}
	return m, nil
}

// advanceLocked draws the next step of a random advisory's lifecycle: the
// approval of its latest event if that awaits review, else the event that
// follows its state. Withdrawn advisories and ended lifecycles are skipped;
// after a few draws without one it gives up (an empty mutation).
func (s *Sim) advanceLocked() Mutation {
	for range 8 {
		if len(s.advList) == 0 {
			break
		}
		a := s.advList[s.rng.IntN(len(s.advList))]
		if a.deleteMs != 0 {
			continue
		}
		if last := a.events[len(a.events)-1]; !last.approved() {
			return Mutation{Kind: AdvisoryReviewed, UID: a.uid}
		}
		if kind := nextKind(s.rng, a.latestApproved()); kind != "" {
			m := Mutation{Kind: AdvisoryEventAdded, UID: a.uid, Event: kind, Review: ReviewApproved}
			if s.rng.IntN(8) == 0 {
				m.Review = ReviewPending
			}
			return m
		}
	}
	return Mutation{Kind: AdvisoryEventAdded}
}

// reviewStates are the valid review states of a new event.
var reviewStates = []string{ReviewPending, ReviewApproved, "REVIEW_STATE_REQUEST_CHANGES", "REVIEW_STATE_REJECTED"}

// addEventLocked applies AdvisoryEventAdded at ms.
func (s *Sim) addEventLocked(m Mutation, ms int64) (Mutation, error) {
	a, ok := s.advisories[m.UID]
	if !ok {
		return m, fmt.Errorf("add event to advisory %s: no such advisory", m.UID)
	}
	if a.deleteMs != 0 {
		return m, fmt.Errorf("add event to advisory %s: withdrawn at %s", m.UID, fmtMs(a.deleteMs))
	}
	if !slices.Contains(EventKinds(), m.Event) {
		return m, fmt.Errorf("add event to advisory %s: unknown kind %q (want one of %v)", m.UID, m.Event, EventKinds())
	}
	if m.Review == "" {
		m.Review = ReviewApproved
	}
	if !slices.Contains(reviewStates, m.Review) {
		return m, fmt.Errorf("add event to advisory %s: unknown review state %q", m.UID, m.Review)
	}
	// Events stay ordered even if the clock was moved backwards.
	ms = max(ms, a.events[len(a.events)-1].createMs)
	e := step(s.rng, a, m.Event, m.Version, ms)
	e.reviewState = m.Review
	a.events = append(a.events, e)
	a.updateMs = max(ms, a.updateMs)
	m.Name, m.EventUID = a.artifactName, e.uid
	m.Version = e.fixedVersion
	if len(e.patched) > 0 {
		m.Version = e.patched[0]
	}
	return m, nil
}
