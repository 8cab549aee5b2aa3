package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Fencing. A leader paused past its lease (a long GC, a frozen VM,
// SIGSTOP) wakes up still believing it leads and writes before it looks
// at its clock or its lease. So whether a write may land is decided by
// JetStream, not by the writer: at the start of each lease term the new
// leader publishes a term marker on a reserved subject of every stream it
// writes (the event stream's <subject_prefix>._term, and the key =term of
// every KV bucket), and every later write of the term carries
// Nats-Expected-Last-Subject-Sequence = its marker's sequence with
// Nats-Expected-Last-Subject-Sequence-Subject = the marker's subject. A
// newer leader's marker moves that last sequence, and the server refuses
// every write of the older term ("wrong last sequence"): the deposed
// leader counts it, stops writing, and steps down.
//
// Lanes. On a replicated stream (R>1) nats-server refuses a write
// conditional on a subject while another write conditional on the same
// subject awaits its quorum (10164, "wrong last sequence" without a
// sequence; checkMsgHeadersPreClusteredProposal in nats-server 2.15). So a
// term there has several markers per stream, one per lane: lane 0 on the
// marker subject itself, lane i on the marker subject followed by "_i".
// Each write is conditional on one lane's marker, and no two writes in
// flight share a lane: the pipelined writers (the relay, the KV writer)
// take lanes 1 to n-1 in turn with at most n-1 writes in flight, and the
// occasional single writes (checkpoints, snapshot records, the audit's
// re-publishes) share lane 0, one at a time. A new term's markers move
// every lane, so every write of the older term is refused on whichever
// lane it was sent. An unreplicated stream has one lane and no limit.

// TermToken is the subject token of term markers on the event stream.
const TermToken = "_term"

// TermKey is the key of the term marker in every KV bucket (lane 0's; the
// other lanes' are TermKey followed by "_i"): '=' followed by anything but
// two hex digits is no key EscapeKeyToken makes, so no resource's key can
// be one.
const TermKey = "=term"

// IsTermKey reports whether key is one of the term markers' keys.
func IsTermKey(key string) bool {
	rest, ok := strings.CutPrefix(key, TermKey)
	return ok && (rest == "" || rest[0] == '_')
}

// ReplicatedLanes is the number of lanes of a term on replicated streams:
// the relay and the KV writer keep at most 1+laneSlack fewer writes in
// flight.
const ReplicatedLanes = 32

// laneSubject is the marker subject of lane i of the stream whose lane 0
// marker subject is base.
func laneSubject(base string, i int) string {
	if i == 0 {
		return base
	}
	return base + "_" + strconv.Itoa(i)
}

// TermType is a term marker's CloudEvents type on the event stream.
const TermType = TypePrefix + "term"

// TermSubject is where the term markers of the event stream go.
func TermSubject(prefix string) string { return prefix + "." + TermToken }

// Reserved reports whether subject, under prefix, is one of syncd's control
// records on the event stream rather than a resource's event: one token
// after the prefix, beginning with "_" (<prefix>._checkpoint, ._term,
// ._term_i, ._snapshot). A resource's event has three tokens after the
// prefix, <resource>.<action>.<scope>, and its last, the escaped scope,
// may begin with "_" too (EscapeToken keeps it): a repo named "_internal"
// is no control record.
func Reserved(prefix, subject string) bool {
	rest, ok := strings.CutPrefix(subject, prefix+".")
	return ok && strings.HasPrefix(rest, "_") && !strings.Contains(rest, ".")
}

// ErrFenced is the error of a write the fence refused: another replica's
// term began after this one's, or this replica's term ended.
var ErrFenced = errors.New("fenced: another replica leads (a newer lease term's marker is on the stream)")

// FenceConfig configures a Fence.
type FenceConfig struct {
	// Node names the replica in its markers.
	Node   string
	Format Format
	// Lanes is the number of markers a term has on each stream (see
	// "Lanes" above): 1 (the default) for unreplicated streams,
	// ReplicatedLanes when any is replicated.
	Lanes int
	// Stream is the event stream's name, where an earlier term's lane
	// markers are looked for (see markerLanes); empty: not looked for.
	Stream string
	// OnFenced is called once a term, from the writer's goroutine, when the
	// server refused a write of the term: the replica steps down.
	OnFenced func()
	Logger   *slog.Logger
}

// Fence stamps a lease term's writes with the sequences of the term's
// markers. A nil *Fence stamps nothing: single mode, where one process
// writes by configuration (the mirror's lock), is unfenced.
type Fence struct {
	js  jetstream.JetStream
	cfg FenceConfig
	log *slog.Logger

	mu      sync.Mutex
	targets []fenceTarget
	// seqs holds the sequence of this term's marker by marker subject; nil
	// outside a term, when every write is refused before it is sent.
	seqs    map[string]uint64
	tripped bool // a write of this term was refused
	// remark confirms the lease around laying the term's markers again
	// after they vanished (SetRemark); remarking is set while it runs, and
	// marking serializes Mark and the remark.
	remark    func(ctx context.Context, lay func(context.Context) error) error
	remarking atomic.Bool
	// again: a Doubt came while the remark laid the markers; it lays them
	// once more. Under mu.
	again   bool
	marking sync.Mutex
	refused atomic.Int64
	// single is lane 0's: held by a single write from its stamp to its
	// answer.
	single sync.Mutex
}

// fenceTarget is one stream's marker: pub is the subject it is published
// to, check the subject of the stream it is stored under (they differ for
// a KV bucket mirrored from another domain).
// fenceTarget is a guarded stream: its term marker is published to pub,
// stored under check, in the stream named stream ("": unknown).
type fenceTarget struct{ pub, check, stream string }

// NewFence returns a fence of the event stream of cfg.Format; Guard adds
// the KV buckets.
func NewFence(js jetstream.JetStream, cfg FenceConfig) *Fence {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Lanes = max(cfg.Lanes, 1)
	f := &Fence{js: js, cfg: cfg, log: cfg.Logger}
	subj := TermSubject(cfg.Format.SubjectPrefix)
	f.targets = []fenceTarget{{pub: subj, check: subj, stream: cfg.Stream}}
	return f
}

// Guard adds the stream named stream, whose term marker is published to
// pub and stored under check; from the next term on, its writes are fenced.
func (f *Fence) Guard(pub, check, stream string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = append(f.targets, fenceTarget{pub: pub, check: check, stream: stream})
}

// termMarker is a marker's body: the replica and when its term began.
type termMarker struct {
	Node string    `json:"node"`
	Time time.Time `json:"time"`
}

// Mark begins a term: it publishes a marker on every lane of every guarded
// stream and records their sequences. It must run once the lease is gained
// and before the term's first write; until it succeeds, every write is
// refused.
func (f *Fence) Mark(ctx context.Context) error {
	if f == nil {
		return nil
	}
	f.marking.Lock()
	defer f.marking.Unlock()
	f.End()
	seqs, err := f.lay(ctx)
	if err != nil {
		return err
	}
	f.install(seqs)
	return nil
}

// install opens the term to writes on the markers of seqs.
func (f *Fence) install(seqs map[string]uint64) {
	f.mu.Lock()
	f.seqs, f.tripped = seqs, false
	f.mu.Unlock()
}

// lay publishes the markers of a new term and returns their sequences by
// checked subject, without opening the term to writes.
func (f *Fence) lay(ctx context.Context) (map[string]uint64, error) {
	f.mu.Lock()
	targets := append([]fenceTarget(nil), f.targets...)
	f.mu.Unlock()
	now := time.Now().UTC()
	body, err := json.Marshal(termMarker{Node: f.cfg.Node, Time: now})
	if err != nil {
		return nil, err
	}
	type marking struct {
		check string
		fut   jetstream.PubAckFuture
	}
	var sent []marking
	for i, t := range targets {
		for lane := range f.markerLanes(ctx, t) {
			data := body
			if i == 0 {
				// On the event stream, a CloudEvent, as the checkpoints
				// are: a consumer that parses every message reads it and
				// ignores a type it does not know. Each lane's has an id
				// of its own (lane 0's without a suffix). No Nats-Msg-Id:
				// a marker is never a duplicate.
				id := laneSubject("term-"+f.cfg.Node+"-"+strconv.FormatInt(now.UnixNano(), 10), lane)
				if data, err = json.Marshal(CloudEvent{SpecVersion: "1.0", ID: id, Source: f.cfg.Format.Source,
					Type: TermType, Time: now.Format(time.RFC3339Nano), DataContentType: "application/json",
					Data: body}); err != nil {
					return nil, err
				}
			}
			m := &nats.Msg{Subject: laneSubject(t.pub, lane), Data: data}
			// The client's retries on no responders (a stream electing
			// its leader) are welcome here: a marker has no order to keep.
			fut, err := f.js.PublishMsgAsync(m)
			if err != nil {
				return nil, fmt.Errorf("publish the term marker on %s: %w", m.Subject, err)
			}
			sent = append(sent, marking{laneSubject(t.check, lane), fut})
		}
	}
	seqs := make(map[string]uint64, len(sent))
	for _, m := range sent {
		select {
		case ack := <-m.fut.Ok():
			seqs[m.check] = ack.Sequence
		case err := <-m.fut.Err():
			return nil, fmt.Errorf("publish the term marker on %s: %w", m.fut.Msg().Subject, err)
		case <-ctx.Done():
			return nil, fmt.Errorf("publish the term markers: %w", ctx.Err())
		}
	}
	f.log.Info("lease term marked", "node", f.cfg.Node, "markers", len(seqs), "lanes", f.cfg.Lanes,
		"stream_seq", seqs[targets[0].check])
	return seqs, nil
}

// markerLanes is how many lanes' markers a new term lays on the guarded
// stream t: its own lanes, or all ReplicatedLanes when an earlier term
// laid lane markers there. The lanes are each replica's own reckoning (the
// stream's replicas as it found them at start, its own [kv] replicas), and
// a deposed leader that writes on lane i is refused only when the newer
// term moved lane i's marker too. When it cannot tell, it lays them all;
// on a stream whose name it was not given, its own.
func (f *Fence) markerLanes(ctx context.Context, t fenceTarget) int {
	if f.cfg.Lanes >= ReplicatedLanes || t.stream == "" {
		return f.cfg.Lanes
	}
	s, err := f.js.Stream(ctx, t.stream)
	if err == nil {
		_, err = s.GetLastMsgForSubject(ctx, laneSubject(t.check, 1))
	}
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return f.cfg.Lanes
	}
	return ReplicatedLanes
}

// End ends the term: every write is refused before it is sent.
func (f *Fence) End() {
	if f == nil {
		return
	}
	f.mu.Lock()
	f.seqs = nil
	f.mu.Unlock()
}

// Stamp makes m a write of the current term on lane 0 of the stream whose
// marker is stored under check (see StampLane). A single write holds lane
// 0 from its stamp to its answer: see Hold.
func (f *Fence) Stamp(m *nats.Msg, check string) error { return f.StampLane(m, check, 0) }

// StampLane makes m a write of the current term on the given lane of the
// stream whose marker is stored under check: the server stores it only
// while that lane's marker is the newest on its subject. ErrFenced outside
// a term, or after a write of the term was refused.
func (f *Fence) StampLane(m *nats.Msg, check string, lane int) error {
	if f == nil {
		return nil
	}
	subj := laneSubject(check, lane)
	f.mu.Lock()
	seq, ok := f.seqs[subj]
	f.mu.Unlock()
	if !ok {
		return ErrFenced
	}
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	// Canonical keys already: set directly, as Format.Message does.
	m.Header["Nats-Expected-Last-Subject-Sequence"] = []string{strconv.FormatUint(seq, 10)}
	m.Header["Nats-Expected-Last-Subject-Sequence-Subject"] = []string{subj}
	return nil
}

// StampEvent stamps m, a message of the event stream, on lane 0.
func (f *Fence) StampEvent(m *nats.Msg) error {
	if f == nil {
		return nil
	}
	return f.Stamp(m, TermSubject(f.cfg.Format.SubjectPrefix))
}

// Hold takes lane 0 for one single write, from before its stamp until its
// answer, and returns its release. Without a fence, or with one lane (an
// unreplicated stream takes concurrent conditional writes), it holds
// nothing.
func (f *Fence) Hold() (release func()) {
	if f == nil || f.cfg.Lanes == 1 {
		return func() {}
	}
	f.single.Lock()
	return f.single.Unlock
}

// leftInFlight holds the writes a pipelined writer stopped waiting for
// (its pass was cancelled): until they are answered, their lanes may still
// be taken on the server, where a new write on one is refused (10164). The
// writer's next writes wait for them first, at most abandonWait.
type leftInFlight struct {
	mu   sync.Mutex
	futs []jetstream.PubAckFuture
}

// abandonWait bounds how long a writer waits for the writes it left in
// flight before it writes again.
const abandonWait = 5 * time.Second

func (l *leftInFlight) add(futs ...jetstream.PubAckFuture) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.futs = append(l.futs, futs...)
}

// drain waits for the writes left in flight to be answered, at most
// abandonWait in all, and forgets them.
func (l *leftInFlight) drain(ctx context.Context) {
	l.mu.Lock()
	futs := l.futs
	l.futs = nil
	l.mu.Unlock()
	if len(futs) == 0 {
		return
	}
	deadline := time.NewTimer(abandonWait)
	defer deadline.Stop()
	for _, f := range futs {
		select {
		case <-f.Ok():
		case <-f.Err():
		case <-deadline.C:
			return
		case <-ctx.Done():
			return
		}
	}
}

// Pipeline is how a pipelined writer spreads its writes over the lanes.
// A nil *Pipeline (of a fence with one lane, or of none) puts every write
// on lane 0 with no limit.
type Pipeline struct {
	lanes int
	next  map[string]int
}

// Pipeline returns a pipelined writer's lanes: 1 to n-1 in turn, for at
// most Depth writes in flight (n-1-laneSlack).
func (f *Fence) Pipeline() *Pipeline {
	if f == nil || f.cfg.Lanes == 1 {
		return nil
	}
	return &Pipeline{lanes: f.cfg.Lanes, next: map[string]int{}}
}

// Depth is the most writes the pipeline may have in flight: 0 for no
// limit. It leaves laneSlack lanes unused between a lane's writes:
// nats-server answers a write before it forgets that the write's lane is
// in process (jetstream_cluster.go applies, then clears), so a write sent
// on a lane the moment its previous write is answered can be refused
// (10164), as the relay's test saw under load.
func (p *Pipeline) Depth() int {
	if p == nil {
		return 0
	}
	return max(p.lanes-1-laneSlack, 0)
}

// laneSlack is how many lanes a pipeline leaves between a lane's writes.
const laneSlack = 4

// Lane is the lane of the next write to the stream whose marker is stored
// under check. With no more than Depth writes in flight, answered in the
// order they were sent (as JetStream answers one connection's publishes
// to one stream), the previous write on that lane has been answered.
func (p *Pipeline) Lane(check string) int {
	if p == nil {
		return 0
	}
	n := p.next[check]
	p.next[check] = (n + 1) % (p.lanes - 1)
	return 1 + n
}

// InTerm reports whether a term is open for writes: a write that costs
// much before it can be fenced (a snapshot's upload) is not begun outside.
func (f *Fence) InTerm() bool {
	if f == nil {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.seqs != nil
}

// Refused is how many writes the server refused since the fence was made.
func (f *Fence) Refused() int64 {
	if f == nil {
		return 0
	}
	return f.refused.Load()
}

// Check reports whether err is the server's refusal of a fenced write (or
// ErrFenced). A refusal is counted; the first of a term ends the term,
// is logged at WARN and calls OnFenced, so that the replica steps down
// and nothing of this term is sent again.
//
// sent, when given, is the refused message: its stamp names the marker
// subject it was conditional on, whose sequence alone tells this term's
// own marker from a newer term's (sequences of different streams are
// different counts, and may be equal).
func (f *Fence) Check(err error, sent ...*nats.Msg) bool {
	if f == nil || err == nil {
		return false
	}
	if errors.Is(err, ErrFenced) {
		return true // refused here, never sent: nothing to count
	}
	// Only 10071 says that the marker is no longer the newest. A
	// replicated stream answers 10164 (JSErrCodeStreamWrongLastSequenceConstant)
	// to a conditional write while another on the same lane awaits its
	// quorum: a conflict, not a newer term (see "Lanes").
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		return false
	}
	f.refused.Add(1)
	f.mu.Lock()
	if f.seqs == nil {
		// Outside a term, or while its markers are laid (again): an
		// answer to a write of before, with nothing left to end.
		f.mu.Unlock()
		return true
	}
	newest, named := newestSeq(apiErr)
	if named && newest != 0 && f.ownMarker(newest, sent) {
		// A write sent before this term's markers were laid again, refused
		// for the marker now newest: this term's own, no newer term's.
		f.mu.Unlock()
		return true
	}
	if named && f.remark != nil && (newest == 0 || f.markerGone(newest, sent)) {
		// The stream holds no message at all on the marker's subject, or
		// only older ones than this term's marker: no newer term's marker,
		// which would be there, but this term's gone (aged out with
		// max_age, purged, or lost with the stream's tail when the server
		// restarted without its last writes). The write failed and its
		// writer tries again; meanwhile the term is marked again, if the
		// lease is still this replica's (remark confirms it: after a lost
		// tail, a newer term's marker can be the older one named here).
		f.mu.Unlock()
		f.markAgainOnce("this term's marker is no longer on the stream (a write conditional on it failed); "+
			"marking the term again", "err", err)
		return true
	}
	firstRefusal, seqs := !f.tripped && f.seqs != nil, f.seqs
	f.tripped, f.seqs = true, nil
	f.mu.Unlock()
	if firstRefusal {
		f.log.Warn(
			"a write was refused: another replica's lease term began after this one's; stepping down",
			"node",
			f.cfg.Node,
			"err",
			err,
		)
		if f.cfg.OnFenced != nil {
			f.cfg.OnFenced()
		}
		go f.explain(seqs)
	}
	return true
}

// markerGone reports whether newest, the sequence a refusal names as the
// newest on the checked subject, is below this term's marker there: the
// marker is gone from the stream, which now counts an older message as the
// subject's newest. The subject is the refused message's when it is
// known, else newest must be below every marker of the term. Under f.mu.
func (f *Fence) markerGone(newest uint64, sent []*nats.Msg) bool {
	if len(sent) > 0 && sent[0] != nil {
		if subj := sent[0].Header.Get("Nats-Expected-Last-Subject-Sequence-Subject"); subj != "" {
			seq, ok := f.seqs[subj]
			return ok && newest < seq
		}
	}
	if len(f.seqs) == 0 {
		return false
	}
	for _, seq := range f.seqs {
		if newest >= seq {
			return false
		}
	}
	return true
}

// Doubt ends the term's writes at once when what they are conditional on
// can no longer be trusted (why): a stream that gave a sequence again that
// it gave before (it lost its last writes) may hold another term's marker
// at this term's marker's sequence, so that the server would take this
// term's writes after a newer term began. The term is marked again once
// the lease is confirmed (SetRemark), or, without a remark, ended as if a
// newer term began.
func (f *Fence) Doubt(why string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	if f.remarking.Load() {
		f.again = true // the remark under way lays the markers once more
		f.mu.Unlock()
		return
	}
	if f.seqs == nil {
		f.mu.Unlock()
		return // outside a term, or a Mark under way lays new markers
	}
	if f.remark != nil {
		f.seqs = nil // no write goes out until the remark confirms the lease
		f.remarking.Store(true)
		f.mu.Unlock()
		f.log.Warn("this term's markers are in doubt; marking the term again", "node", f.cfg.Node, "why", why)
		go f.markAgain()
		return
	}
	seqs := f.seqs
	f.tripped, f.seqs = true, nil
	f.mu.Unlock()
	f.log.Warn("this term's markers are in doubt; stepping down", "node", f.cfg.Node, "why", why)
	if f.cfg.OnFenced != nil {
		f.cfg.OnFenced()
	}
	go f.explain(seqs)
}

// markAgainOnce starts marking the term again (markAgain) unless that is
// under way already, and logs why at WARN.
func (f *Fence) markAgainOnce(why string, args ...any) {
	if f.remarking.CompareAndSwap(false, true) {
		f.log.Warn(why, append([]any{"node", f.cfg.Node}, args...)...)
		go f.markAgain()
	}
}

// ownMarker reports whether newest, the sequence a refusal names as the
// newest on the checked subject, is this term's marker there: of the
// subject the refused message was stamped with when it is known, else of
// any of the term's markers. Under f.mu.
func (f *Fence) ownMarker(newest uint64, sent []*nats.Msg) bool {
	if len(sent) > 0 && sent[0] != nil {
		if subj := sent[0].Header.Get("Nats-Expected-Last-Subject-Sequence-Subject"); subj != "" {
			seq, ok := f.seqs[subj]
			return ok && seq == newest
		}
	}
	return slices.Contains(slices.Collect(maps.Values(f.seqs)), newest)
}

// SetRemark has a write refused for a marker the stream no longer holds
// mark the term again, once at a time: remark must confirm that the lease
// is still this replica's, call lay (which lays the markers without
// opening the term to writes), and confirm the lease again; only then are
// the writes let through on the new markers. Until then every write is
// refused before it is sent. When remark fails, the term ends and the
// replica steps down (OnFenced). Without a remark, such a refusal ends the
// term like a newer term's.
func (f *Fence) SetRemark(remark func(ctx context.Context, lay func(context.Context) error) error) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.remark = remark
}

// markAgain lays the term's markers again through the remark function,
// and ends the term when it fails.
func (f *Fence) markAgain() {
	f.marking.Lock()
	defer f.marking.Unlock()
	f.mu.Lock()
	remark := f.remark
	f.mu.Unlock()
	for {
		f.End() // nothing is sent until the lease is confirmed after the markers
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		var seqs map[string]uint64
		err := remark(ctx, func(ctx context.Context) error {
			var err error
			seqs, err = f.lay(ctx)
			return err
		})
		cancel()
		f.mu.Lock()
		if err != nil {
			f.tripped, f.seqs, f.again = true, nil, false
			f.remarking.Store(false)
			f.mu.Unlock()
			f.log.Warn("marking the term again failed; stepping down", "node", f.cfg.Node, "err", err)
			if f.cfg.OnFenced != nil {
				f.cfg.OnFenced()
			}
			return
		}
		if f.again {
			// Doubted while the markers were laid: lay them once more.
			f.again = false
			f.mu.Unlock()
			continue
		}
		// Installed, and the remark ended, under one lock: a Doubt sees
		// either the remark under way or the term open.
		f.seqs, f.tripped = seqs, false
		f.remarking.Store(false)
		f.mu.Unlock()
		return
	}
}

// LaneConflict reports whether err is a replicated stream's refusal of a
// write whose lane another write still held on the server (10164): the
// same write may go again at once, on another lane.
func LaneConflict(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant
}

// newestSeq is the sequence a 10071 names as the newest message on the
// checked subject ("wrong last sequence: N", 0 when it holds none); false
// when it names none.
func newestSeq(err *jetstream.APIError) (uint64, bool) {
	n, ok := strings.CutPrefix(err.Description, "wrong last sequence: ")
	if !ok {
		return 0, false
	}
	seq, perr := strconv.ParseUint(n, 10, 64)
	return seq, perr == nil
}

// explain logs which of the term's markers (seqs, by checked subject) a
// newer one followed, as the streams have them now: all of them after a
// newer term's markers, none when the server refused a write although
// this term's markers are still the newest.
func (f *Fence) explain(seqs map[string]uint64) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var moved, same, unread []string
	for subj, seq := range seqs {
		name, err := f.js.StreamNameBySubject(ctx, subj)
		var s jetstream.Stream
		if err == nil {
			s, err = f.js.Stream(ctx, name)
		}
		var m *jetstream.RawStreamMsg
		if err == nil {
			m, err = s.GetLastMsgForSubject(ctx, subj)
		}
		switch {
		case err != nil:
			unread = append(unread, subj+": "+err.Error())
		case m.Sequence == seq:
			same = append(same, subj)
		default:
			moved = append(moved, fmt.Sprintf("%s %d->%d", subj, seq, m.Sequence))
		}
	}
	slices.Sort(moved)
	f.log.Warn("the refused term's markers as the streams hold them now", "node", f.cfg.Node, "moved", len(moved),
		"unchanged", len(same), "unread", len(unread), "first_moved", first(moved), "first_unread", first(unread))
}

// first is the first of ss, or "".
func first(ss []string) string {
	if len(ss) == 0 {
		return ""
	}
	return ss[0]
}

// SnapshotToken is the subject token of snapshot records on the event
// stream, and SnapshotType their CloudEvents type.
const (
	SnapshotToken = "_snapshot"
	SnapshotType  = TypePrefix + "snapshot"
)

// SnapshotRecord is the body of a snapshot record: the leader's word that
// the snapshot was written in its term.
type SnapshotRecord struct {
	Node      string    `json:"node"`
	Name      string    `json:"name"`
	StreamSeq uint64    `json:"stream_seq"`
	Time      time.Time `json:"time"`
}

// RecordSnapshot publishes the record of a snapshot just written, as a
// write of the current term, on <subject_prefix>._snapshot. The object
// store takes no headers, so a snapshot cannot be fenced itself: it is
// fenced by its record, after it. An error that Check (or errors.Is
// ErrFenced) reports as fenced means another replica leads, and the
// snapshot must be deleted.
func (f *Fence) RecordSnapshot(ctx context.Context, name string, streamSeq uint64) error {
	if f == nil {
		return nil
	}
	now := time.Now().UTC()
	data, err := json.Marshal(SnapshotRecord{Node: f.cfg.Node, Name: name, StreamSeq: streamSeq, Time: now})
	if err != nil {
		return err
	}
	ce, err := json.Marshal(
		CloudEvent{SpecVersion: "1.0", ID: "snapshot-" + name, Source: f.cfg.Format.Source, Type: SnapshotType,
			Time: now.Format(time.RFC3339Nano), DataContentType: "application/json", Data: data},
	)
	if err != nil {
		return err
	}
	m := &nats.Msg{Subject: f.cfg.Format.SubjectPrefix + "." + SnapshotToken, Data: ce}
	defer f.Hold()()
	if err := f.StampEvent(m); err != nil {
		return fmt.Errorf("record snapshot %s: %w", name, err)
	}
	if _, err := f.js.PublishMsg(ctx, m); err != nil {
		if f.Check(err, m) {
			err = fmt.Errorf("%w: %w", ErrFenced, err)
		}
		return fmt.Errorf("record snapshot %s: %w", name, err)
	}
	return nil
}

// LanesFor is the number of lanes a term needs on streams of these
// replica counts: one when none is replicated, ReplicatedLanes otherwise.
func LanesFor(replicas ...int) int {
	for _, r := range replicas {
		if r > 1 {
			return ReplicatedLanes
		}
	}
	return 1
}
