package platformsim

import (
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"time"
)

// event is one CloudEvent addressed to one subscription's sink.
type event struct {
	id      string // Ce-Id, a UUID; duplicates of a delivery share it
	typ     string
	subject string // uid of the resource
	group   string // the subscribing group
	sink    string
	timeMs  int64
	body    []byte
}

// eventType spells an event type with the configured vendor word.
func (s *Sim) eventType(suffix string) string {
	return "dev." + s.opts.Vendor + "." + suffix + ".v1"
}

// platformEvent is the type of a platform API resource change, for example
// platformEvent("registry.repo.created").
func (s *Sim) platformEvent(kind string) string {
	return s.eventType("api.platform." + kind)
}

// emitLocked queues an event for every subscription whose group contains
// the resource. Callers hold mu, so events leave in the order of changes.
func (s *Sim) emitLocked(typ, subject string, body any) {
	if len(s.subscriptions) == 0 {
		return
	}
	payload, err := json.Marshal(map[string]any{
		"actor": map[string]any{"subject": "system:platformsim"},
		"body":  body,
	})
	if err != nil {
		return
	}
	now := s.nowLocked().UnixMilli()
	for _, sub := range s.subscriptions {
		g := parentOf(sub.uid)
		if subject != g && !isDescendant(subject, g) {
			continue
		}
		s.enqueueLocked(event{id: s.newUUIDLocked(), typ: typ, subject: subject,
			group: g, sink: sub.sink, timeMs: now, body: payload})
	}
}

// civilLayout is a push event's `when` upstream: a date-time with no zone.
const civilLayout = "2006-01-02T15:04:05.000"

// emitPushLocked sends the registry push event of a tag moving to a new
// digest (or being created, with a zero previous digest).
func (s *Sim) emitPushLocked(rp *repo, t *tag, prev [32]byte) {
	// The registry names the repository by its request path; upstream has
	// sent the uid there too.
	repository, ok := s.pathLocked(rp.uid)
	if !ok || s.opts.PushRepositoryUID {
		repository = rp.uid
	}
	when := fmtMs(t.updateMs)
	if s.opts.CivilPushTime {
		when = time.UnixMilli(t.updateMs).UTC().Format(civilLayout)
	}
	body := map[string]any{
		"repository":     repository,
		"repo_id":        rp.uid,
		"tag":            t.name,
		"digest":         fmtDigest(t.digest),
		"type":           "manifest",
		"when":           when,
		"location":       "US",
		"remote_address": "192.0.2.10",
		"user_agent":     "platformsim/1",
	}
	if prev != ([32]byte{}) {
		body["tag_previous_digest"] = fmtDigest(prev)
	}
	s.emitLocked(s.eventType("registry.push"), rp.uid, body)
}

// newUUIDLocked returns a version 4 UUID from the seeded generator, so event
// ids are reproducible.
func (s *Sim) newUUIDLocked() string {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], s.rng.Uint64())
	binary.LittleEndian.PutUint64(b[8:], s.rng.Uint64())
	b[6] = b[6]&0x0f | 0x40
	b[8] = b[8]&0x3f | 0x80
	h := hex.EncodeToString(b[:])
	return h[:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:]
}
