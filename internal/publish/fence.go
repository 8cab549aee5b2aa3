package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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

// TermToken is the subject token of term markers on the event stream.
const TermToken = "_term"

// TermKey is the key of the term marker in every KV bucket: '=' followed
// by anything but two hex digits is no key EscapeKeyToken makes, so no
// resource's key can be it.
const TermKey = "=term"

// TermType is a term marker's CloudEvents type on the event stream.
const TermType = TypePrefix + "term"

// TermSubject is where the term markers of the event stream go.
func TermSubject(prefix string) string { return prefix + "." + TermToken }

// Reserved reports whether subject is one of syncd's control records on the
// event stream rather than a resource's event: a last token that begins
// with "_" (checkpoints, term markers, snapshot records), which no
// resource's event subject has.
func Reserved(subject string) bool {
	i := strings.LastIndexByte(subject, '.')
	return strings.HasPrefix(subject[i+1:], "_")
}

// ErrFenced is the error of a write the fence refused: another replica's
// term began after this one's, or this replica's term ended.
var ErrFenced = errors.New("fenced: another replica leads (a newer lease term's marker is on the stream)")

// FenceConfig configures a Fence.
type FenceConfig struct {
	// Node names the replica in its markers.
	Node   string
	Format Format
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
	refused atomic.Int64
}

// fenceTarget is one stream's marker: pub is the subject it is published
// to, check the subject of the stream it is stored under (they differ for
// a KV bucket mirrored from another domain).
type fenceTarget struct{ pub, check string }

// NewFence returns a fence of the event stream of cfg.Format; Guard adds
// the KV buckets.
func NewFence(js jetstream.JetStream, cfg FenceConfig) *Fence {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Fence{js: js, cfg: cfg, log: cfg.Logger}
	subj := TermSubject(cfg.Format.SubjectPrefix)
	f.targets = []fenceTarget{{pub: subj, check: subj}}
	return f
}

// Guard adds a stream whose term marker is published to pub and stored
// under check; from the next term on, its writes are fenced.
func (f *Fence) Guard(pub, check string) {
	if f == nil {
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.targets = append(f.targets, fenceTarget{pub: pub, check: check})
}

// termMarker is a marker's body: the replica and when its term began.
type termMarker struct {
	Node string    `json:"node"`
	Time time.Time `json:"time"`
}

// Mark begins a term: it publishes a marker on every guarded stream and
// records their sequences. It must run once the lease is gained and before
// the term's first write; until it succeeds, every write is refused.
func (f *Fence) Mark(ctx context.Context) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	targets := append([]fenceTarget(nil), f.targets...)
	f.seqs, f.tripped = nil, false
	f.mu.Unlock()
	now := time.Now().UTC()
	body, err := json.Marshal(termMarker{Node: f.cfg.Node, Time: now})
	if err != nil {
		return err
	}
	seqs := make(map[string]uint64, len(targets))
	for i, t := range targets {
		data := body
		if i == 0 {
			// On the event stream, a CloudEvent, as the checkpoints are:
			// a consumer that parses every message reads it and ignores
			// a type it does not know. No Nats-Msg-Id: a marker is never
			// a duplicate.
			id := "term-" + f.cfg.Node + "-" + strconv.FormatInt(now.UnixNano(), 10)
			if data, err = json.Marshal(CloudEvent{SpecVersion: "1.0", ID: id, Source: f.cfg.Format.Source, Type: TermType,
				Time: now.Format(time.RFC3339Nano), DataContentType: "application/json", Data: body}); err != nil {
				return err
			}
		}
		ack, err := f.js.PublishMsg(ctx, &nats.Msg{Subject: t.pub, Data: data})
		if err != nil {
			return fmt.Errorf("publish the term marker on %s: %w", t.pub, err)
		}
		seqs[t.check] = ack.Sequence
	}
	f.mu.Lock()
	f.seqs = seqs
	f.mu.Unlock()
	f.log.Info("lease term marked", "node", f.cfg.Node, "markers", len(seqs), "stream_seq", seqs[targets[0].check])
	return nil
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

// Stamp makes m a write of the current term on the stream whose marker is
// stored under check: the server stores it only while that marker is the
// stream's newest. ErrFenced outside a term, or after a write of the term
// was refused.
func (f *Fence) Stamp(m *nats.Msg, check string) error {
	if f == nil {
		return nil
	}
	f.mu.Lock()
	seq, ok := f.seqs[check]
	f.mu.Unlock()
	if !ok {
		return ErrFenced
	}
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	// Canonical keys already: set directly, as Format.Message does.
	m.Header["Nats-Expected-Last-Subject-Sequence"] = []string{strconv.FormatUint(seq, 10)}
	m.Header["Nats-Expected-Last-Subject-Sequence-Subject"] = []string{check}
	return nil
}

// StampEvent stamps m, a message of the event stream.
func (f *Fence) StampEvent(m *nats.Msg) error {
	if f == nil {
		return nil
	}
	return f.Stamp(m, TermSubject(f.cfg.Format.SubjectPrefix))
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
func (f *Fence) Check(err error) bool {
	if f == nil || err == nil {
		return false
	}
	if errors.Is(err, ErrFenced) {
		return true // refused here, never sent: nothing to count
	}
	// Only 10071 says that the marker is no longer the newest. A
	// replicated stream answers 10164 (JSErrCodeStreamWrongLastSequenceConstant)
	// to a conditional write while another on the same subject awaits its
	// quorum: a conflict, not a newer term (see FenceSupported).
	var apiErr *jetstream.APIError
	if !errors.As(err, &apiErr) || apiErr.ErrorCode != jetstream.JSErrCodeStreamWrongLastSequence {
		return false
	}
	f.refused.Add(1)
	f.mu.Lock()
	first := !f.tripped && f.seqs != nil
	f.tripped, f.seqs = true, nil
	f.mu.Unlock()
	if first {
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
	}
	return true
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
	if err := f.StampEvent(m); err != nil {
		return fmt.Errorf("record snapshot %s: %w", name, err)
	}
	if _, err := f.js.PublishMsg(ctx, m); err != nil {
		if f.Check(err) {
			err = fmt.Errorf("%w: %w", ErrFenced, err)
		}
		return fmt.Errorf("record snapshot %s: %w", name, err)
	}
	return nil
}

// FenceSupported reports whether writes to streams of these replica
// counts can be fenced. A replicated stream (R>1, nats-server 2.15's
// checkMsgHeadersPreClusteredProposal) refuses a write conditional on a
// subject while another write conditional on it awaits its quorum, with
// 10164: every write of a term is conditional on one marker subject, so
// the relay's and the KV writer's pipelined writes would be refused but
// one at a time. Fencing is therefore used on unreplicated streams only.
func FenceSupported(replicas ...int) bool {
	for _, r := range replicas {
		if r > 1 {
			return false
		}
	}
	return true
}
