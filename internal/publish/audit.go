package publish

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/signing"
	"github.com/syncd-dev/syncd/internal/store"
)

// The stream audit. JetStream can lose messages it acknowledged (an OS
// crash before its fsync, a damaged file, an operator's DeleteMsg), and
// the relay marked those events published when the acknowledgement came:
// nobody would publish them again. So the leader reads the stream back and
// publishes again, under the same id, every event of its log the stream
// lacks.
//
// Only events published more than the stream's duplicate window ago are
// audited: within it, JetStream still remembers the id of a message it
// lost (a DeleteMsg does not forget it) and drops a re-publish as a
// duplicate. A re-publish it drops all the same (its clock or window
// differ from what the audit read) is not counted as repaired: the audit
// holds that event (meta audit_held) and tries again at the next audit.
// So does it hold an event it repaired: its copy, and the later events
// moved behind it, are at the stream's tail, which a crash before the
// server's next fsync loses, and the next audit must find them there.
//
// A re-published event lands after the later events of its resource, and
// a reader of the stream applies the last it reads: so the later events
// of the resource are deleted from the stream and published again behind
// it, which keeps every event on the stream once and each resource's in
// order. That needs every later event of the resource out of the window
// too; until then its repair waits (Deferred).

// AuditStore is what the audit needs of the mirror.
type AuditStore interface {
	AuditEvents(ctx context.Context, after int64, limit int) ([]store.AuditEvent, error)
	ResourceEvents(ctx context.Context, subject string, from int64) ([]store.AuditEvent, error)
	PreviousOwnEvent(ctx context.Context, subject string, before int64) (string, error)
	AuditPosition(ctx context.Context) (int64, error)
	AuditHeld(ctx context.Context) ([]store.HeldEvent, error)
	SetAuditPosition(ctx context.Context, seq int64, streamSeq uint64, held []store.HeldEvent) error
	AuditStream(ctx context.Context) (store.AuditStream, error)
	SetAuditStream(ctx context.Context, rec store.AuditStream, sweep bool) error
}

// AuditConfig configures an Auditor.
type AuditConfig struct {
	Stream, SubjectPrefix string
	// Every is the time between two audits.
	Every time.Duration
	// SweepEvery is the time between two sweeps, audits that go through
	// the whole log again from its start, for what the stream lost after
	// an audit found it there; zero: 24 hours; negative: only when the
	// stream's state shows a loss (see sweepReason).
	SweepEvery time.Duration
	// Margin is how much older than the stream's duplicate window an
	// event's publication must be to be audited, for the clocks of syncd
	// and the server and the server's timer; zero: half the window, at
	// most a minute.
	Margin time.Duration
	// Batch is how many events one read of the stream checks; zero: 20,000.
	Batch int
	// Yield, when set, is called before each read of the event log and
	// of the stream, so that the audit gives way to what matters more
	// (Relay.Idle): an error from it ends the audit.
	Yield func(ctx context.Context) error
	// Slack is how long before the publication of the first event it
	// looks for a read of the stream begins, for the clocks of syncd and
	// the server and the time between a message's acknowledgement and its
	// marking; zero: readSlack. Benchmarks shorten it with Every.
	Slack time.Duration
	// Now is the audit's clock; nil: time.Now.
	Now    func() time.Time
	Logger *slog.Logger
	// OnRepaired, when set, is called for every event the stream lacked
	// that was published again.
	OnRepaired func(store.Event)
	// OnSweep, when set, is called when an audit goes through the whole
	// log again, with why: SweepRecreated, SweepTailLost,
	// SweepMessagesGone or SweepScheduled.
	OnSweep func(reason string)
	// Fence, when set, stamps every re-publish with the lease term
	// (fence.go). The deletions that move later events behind a repaired
	// one cannot carry it: JetStream's delete request takes no condition.
	Fence *Fence
	// MsgID is the Nats-Msg-Id an event id is published under (see
	// signing.Signer.MsgID); nil: the event id itself.
	MsgID func(eventID string) string
	// RepairMessage, when set, encodes the copies a repair publishes of a
	// resource's own events, each naming the stream sequence of the
	// resource's own message just before it (Relay.RepairMessage,
	// RepairAttribute), so that a replica holding them applies them again
	// in the stream's order; nil: they are encoded as any message, and a
	// replica that read past the loss keeps the late event's state until a
	// snapshot repairs it.
	RepairMessage func(e store.Event, after uint64) *nats.Msg
}

// AuditReport is what an audit did.
type AuditReport struct {
	// Checked is how many events were looked for on the stream.
	Checked int
	// Repaired is how many of them the stream lacked and were published
	// again; Reordered, how many later events of their resources were
	// moved behind them.
	Repaired, Reordered int
	// Deferred is how many missing events wait for the later events of
	// their resource to leave the duplicate window; Duplicates, how many
	// re-publishes JetStream dropped as duplicates. Both are tried again
	// at the next audit.
	Deferred, Duplicates int
	// Position is the seq of the last event checked, and StreamSeq the
	// stream's last sequence when the audit began.
	Position  int64
	StreamSeq uint64
}

// Auditor audits the stream against the mirror's event log.
type Auditor struct {
	js      jetstream.JetStream
	st      AuditStore
	message func(store.Event) *nats.Msg
	cfg     AuditConfig
	log     *slog.Logger
	trigger chan struct{}
	last    atomic.Pointer[AuditReport]
	// mu makes audits take turns: two at once would publish the same
	// missing event twice.
	mu sync.Mutex
}

// readSlack widens the stream reads around a publication time, for the
// difference between syncd's clock and the server's and the time between a
// message's acknowledgement and its marking.
const readSlack = time.Minute

// NewAuditor returns an auditor of cfg.Stream against st; message encodes
// an event as the relay publishes it (Relay.Message).
func NewAuditor(js jetstream.JetStream, st AuditStore, message func(store.Event) *nats.Msg, cfg AuditConfig) *Auditor {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Batch <= 0 {
		cfg.Batch = 20000
	}
	if cfg.Slack <= 0 {
		cfg.Slack = readSlack
	}
	if cfg.SweepEvery == 0 {
		cfg.SweepEvery = 24 * time.Hour
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Auditor{js: js, st: st, message: message, cfg: cfg, log: log, trigger: make(chan struct{}, 1)}
}

// Run audits every Every until ctx is done, and when Trigger asks. A
// failed audit is logged and tried again at the next.
func (a *Auditor) Run(ctx context.Context) error {
	t := time.NewTicker(a.cfg.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-a.trigger:
		}
		if _, err := a.Audit(ctx); err != nil && ctx.Err() == nil {
			a.log.Warn("stream audit failed; trying again at the next", "err", err, "next_in", a.cfg.Every.String())
		}
	}
}

// Trigger has Run audit now (or after the audit under way).
func (a *Auditor) Trigger() {
	select {
	case a.trigger <- struct{}{}:
	default:
	}
}

// Last is the report of the last audit that finished; nil before any.
func (a *Auditor) Last() *AuditReport { return a.last.Load() }

// audit is the state of one audit.
type audit struct {
	a       *Auditor
	stream  jetstream.Stream
	window  time.Duration
	cutoff  time.Time         // events published after it are not audited yet
	retains time.Time         // events published before it are past what the stream retains
	held    []store.HeldEvent // events before the position a later audit looks at again
	// rechecked are the resources whose events this audit checked, every
	// one of them, from a held one (the recheck) or the first one a batch
	// found missing (a repair, or its wait): the later batches pass over
	// them, as a repair's copies are past the stream's end the batches
	// read to, and the events after it are held.
	rechecked map[string]bool
	rep       AuditReport
	info      *jetstream.StreamInfo // the stream at the audit's start
	seen      store.AuditStream     // what the last audit saw of it
	deleted   uint64                // the messages this audit deleted (moved behind a repair)
	// again: this audit held more events than maxHeldEvents; it holds
	// none, and the next audit sweeps.
	again bool
}

// sweepable reports whether the stream may be swept. Its operator's limit
// per subject (max_msgs_per_subject) drops older events of a subject from
// the middle of the stream, where a sweep would find them missing and
// publish them again, only to drop the newer ones: such a stream is
// audited once an event, without sweeps (and its held events are kept,
// however many).
func (au *audit) sweepable() bool { return au.info.Config.MaxMsgsPerSubject <= 0 }

// maxHeldEvents bounds the events an audit holds for the next (meta
// audit_held, rewritten after every batch): a sweep that repairs a
// stream lost whole would hold every resource. Past it the audit holds
// none, and the next audit sweeps again instead.
var maxHeldEvents = 100_000

// deleteMsg deletes the stream's message at seq (gone already: nothing
// to do), counting what it deleted.
func (au *audit) deleteMsg(ctx context.Context, seq uint64) error {
	err := au.stream.DeleteMsg(ctx, seq)
	if errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil
	}
	if err == nil {
		au.deleted++
	}
	return err
}

// Audit checks the events published since the last audit, from where it
// stopped, up to those published a duplicate window (and the margin) ago.
func (a *Auditor) Audit(ctx context.Context) (AuditReport, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	au, err := a.begin(ctx)
	if err != nil {
		return AuditReport{}, err
	}
	// The events before the position that an earlier audit held: their
	// repair waited, or their copies were to be found again.
	if len(au.held) > 0 {
		held, err := au.recheck(ctx, au.held)
		if err != nil {
			return au.rep, err
		}
		au.held = held
		if err := a.st.SetAuditPosition(ctx, au.rep.Position, au.rep.StreamSeq, au.held); err != nil {
			return au.rep, err
		}
	}
	for {
		if err := a.yield(ctx); err != nil {
			return au.rep, err
		}
		evs, err := a.st.AuditEvents(ctx, au.rep.Position, a.cfg.Batch)
		if err != nil {
			return au.rep, err
		}
		// The events from the position on that JetStream acknowledged
		// long enough ago; the first still in the outbox or too recent
		// ends them, as the position passes no event unchecked.
		n := 0
		for n < len(evs) && !evs[n].Published.IsZero() && !evs[n].Published.After(au.cutoff) {
			n++
		}
		if n == 0 {
			break
		}
		// The position moves past the events checked; those that a later
		// audit must look at again are held, so that one resource whose
		// repair waits does not keep the audit from every event after it.
		held, err := au.check(ctx, slices.DeleteFunc(slices.Clone(evs[:n]), func(e store.AuditEvent) bool {
			return au.rechecked[e.Subject]
		}))
		if err != nil {
			return au.rep, err
		}
		au.held = append(au.held, held...)
		for _, h := range held {
			au.rechecked[h.Subject] = true
		}
		if len(au.held) > maxHeldEvents && au.sweepable() {
			if !au.again {
				a.log.Warn("stream audit: more events to look at again than it keeps; the next audit checks the whole log again",
					"held", len(au.held), "max", maxHeldEvents)
				// Recorded before the held events are dropped: an audit
				// cut short after it still leaves the next one to sweep.
				au.seen.Again, au.again = true, true
				if err := a.st.SetAuditStream(ctx, au.seen, false); err != nil {
					return au.rep, err
				}
			}
			au.held = nil
		}
		au.rep.Position = evs[n-1].Seq
		if err := a.st.SetAuditPosition(ctx, au.rep.Position, au.rep.StreamSeq, au.held); err != nil {
			return au.rep, err
		}
		if n < len(evs) || len(evs) < a.cfg.Batch {
			break
		}
	}
	if err := au.end(ctx); err != nil {
		return au.rep, err
	}
	a.last.Store(&au.rep)
	if au.rep.Repaired+au.rep.Deferred+au.rep.Duplicates > 0 {
		a.log.Warn(
			"stream audited: the stream lacked events",
			"checked",
			au.rep.Checked,
			"repaired",
			au.rep.Repaired,
			"reordered",
			au.rep.Reordered,
			"deferred",
			au.rep.Deferred,
			"duplicates",
			au.rep.Duplicates,
			"position",
			au.rep.Position,
		)
	} else {
		a.log.Debug("stream audited", "checked", au.rep.Checked, "position", au.rep.Position, "stream_seq", au.rep.StreamSeq)
	}
	return au.rep, nil
}

// begin reads the stream's state and the audit's position.
func (a *Auditor) begin(ctx context.Context) (*audit, error) {
	pos, err := a.st.AuditPosition(ctx)
	if err != nil {
		return nil, err
	}
	held, err := a.st.AuditHeld(ctx)
	if err != nil {
		return nil, err
	}
	s, err := a.js.Stream(ctx, a.cfg.Stream)
	if err != nil {
		return nil, fmt.Errorf("audit: look up stream %s: %w", a.cfg.Stream, err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		return nil, fmt.Errorf("audit: stream %s info: %w", a.cfg.Stream, err)
	}
	seen, err := a.st.AuditStream(ctx)
	if err != nil {
		return nil, err
	}
	au := &audit{
		a:         a,
		stream:    s,
		window:    info.Config.Duplicates,
		held:      held,
		rechecked: map[string]bool{},
		rep:       AuditReport{Position: pos, StreamSeq: info.State.LastSeq},
		info:      info,
		seen:      seen,
	}
	margin := a.cfg.Margin
	if margin <= 0 {
		margin = min(au.window/2, time.Minute)
	}
	now := a.cfg.Now()
	au.cutoff = now.Add(-au.window - margin)
	// What the stream no longer holds because of its limits is not for
	// the audit to bring back. max_age, syncd's own limit, says which
	// events those are: the audit checks the events younger than it, so
	// that a head the stream lost (a damaged file, the stream lost whole
	// and created again, a purge: the audit cannot tell them apart) is
	// published again. A stream with a limit on its messages or bytes
	// (set by its operator, manage_stream = false) drops its head as it
	// fills, at times the audit cannot know: there it checks only the
	// events published after the stream's first message. An event is
	// marked after its message was stored, so one marked before the first
	// message was stored before it (the clocks of syncd and the server
	// agreeing); one stored before it but marked after (the same relay
	// pass) is published again.
	if c := info.Config; c.MaxMsgs > 0 || c.MaxBytes > 0 || c.MaxMsgsPerSubject > 0 {
		au.retains = now.Add(time.Hour) // an empty stream retains nothing
		if info.State.Msgs > 0 {
			// Publication times are kept to the millisecond.
			au.retains = info.State.FirstTime.Truncate(time.Millisecond)
		}
	}
	if age := info.Config.MaxAge; age > 0 {
		au.retains = later(au.retains, now.Add(-age+readSlack))
	}
	if reason, why := au.sweepReason(now); reason != "" {
		if err := au.sweep(ctx, now, reason, why); err != nil {
			return nil, err
		}
	}
	return au, nil
}

// Why a sweep began (AuditConfig.OnSweep, syncd_stream_sweeps_total).
const (
	SweepRecreated    = "recreated"
	SweepTailLost     = "tail_lost"
	SweepMessagesGone = "messages_gone"
	SweepScheduled    = "scheduled"
)

// sweepReason says why this audit must go through the whole log again,
// one of the Sweep reasons and in words, or "" if it need not. Each event
// is checked once, a duplicate window after its publication; what the
// stream loses after that (a damaged file, the stream lost whole: Jepsen
// found both in NATS 2.12.1) only a sweep finds. The stream's state says when it lost something the last
// audit saw there; the sweeps every SweepEvery find the rest (a lost
// head looks like the limits' work to the stream's state).
func (au *audit) sweepReason(now time.Time) (string, string) {
	seen, st := au.seen, streamState(au.info)
	if !au.sweepable() {
		return "", ""
	}
	first := seen.Created.IsZero() // no audit recorded the stream yet
	switch {
	case !first && !st.Created.Equal(seen.Created):
		return SweepRecreated, fmt.Sprintf("the stream was created again (at %s; the last audit saw one created at %s)",
			st.Created.UTC().Format(time.RFC3339Nano), seen.Created.UTC().Format(time.RFC3339Nano))
	case !first && st.LastSeq < seen.LastSeq:
		return SweepTailLost, fmt.Sprintf("the stream's last sequence went back from %d to %d: it lost its tail",
			seen.LastSeq, st.LastSeq)
	case !first && st.Deleted > seen.Deleted:
		return SweepMessagesGone, fmt.Sprintf(
			"%d messages between the stream's first and last are gone, %d when the last audit ended: "+
				"lost, or deleted by another than the audit",
			st.Deleted,
			seen.Deleted,
		)
	case seen.Refill:
		return SweepTailLost, "the mirror met the stream with messages it had counted gone (a lost tail, or the stream " +
			"created again)"
	case seen.Again:
		return SweepScheduled, "the last audit had more events to look at again than it keeps"
	case au.a.cfg.SweepEvery > 0 && (seen.Swept.IsZero() || !now.Before(seen.Swept.Add(au.a.cfg.SweepEvery))):
		return SweepScheduled, fmt.Sprintf("the last sweep began at %s, more than %s ago",
			seen.Swept.UTC().Format(time.RFC3339), au.a.cfg.SweepEvery)
	}
	return "", ""
}

// sweep moves the audit's position back to the log's start.
func (au *audit) sweep(ctx context.Context, now time.Time, reason, why string) error {
	// The stream as it is now goes with the position's move, so that a
	// sweep cut short (a crash, a lost lease) resumes from its position
	// rather than begins again.
	au.seen = streamState(au.info)
	au.seen.Swept = now
	if err := au.a.st.SetAuditStream(ctx, au.seen, true); err != nil {
		return err
	}
	if au.rep.Position > 0 {
		au.a.log.Info("stream audit: checking the whole event log again", "why", why, "from_position", au.rep.Position)
		if au.a.cfg.OnSweep != nil {
			au.a.cfg.OnSweep(reason)
		}
	}
	au.rep.Position = 0
	return nil
}

// end records what the audit saw of the stream at its end, its own
// deletions made, for the next audit's sweepReason. A stream that lost
// something while the audit ran (created again, its tail gone, more
// messages gone than the audit deleted) is recorded as it was at the
// audit's start, so that the next audit sweeps.
func (au *audit) end(ctx context.Context) error {
	info, err := au.stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("audit: stream %s info: %w", au.a.cfg.Stream, err)
	}
	state, start := streamState(info), streamState(au.info)
	if !state.Created.Equal(start.Created) || state.LastSeq < start.LastSeq || state.Deleted > start.Deleted+au.deleted {
		state = start
	}
	state.Swept, state.Again = au.seen.Swept, au.again
	au.seen = state
	return au.a.st.SetAuditStream(ctx, au.seen, false)
}

// streamState is what sweepReason compares of the stream info (Swept and
// Again left zero).
func streamState(info *jetstream.StreamInfo) store.AuditStream {
	return store.AuditStream{
		Created: info.Created,
		LastSeq: info.State.LastSeq,
		Deleted: uint64(max(info.State.NumDeleted, 0)),
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

// check looks for evs, in seq order, on the stream, repairs what it lacks
// and returns the events a later audit must look at again.
func (au *audit) check(ctx context.Context, evs []store.AuditEvent) ([]store.HeldEvent, error) {
	want := make(map[string]bool, len(evs))
	from := time.Time{}
	for _, e := range evs {
		if e.Published.Before(au.retains) {
			continue
		}
		want[e.ID] = true
		if from.IsZero() || e.Published.Before(from) {
			from = e.Published
		}
	}
	au.rep.Checked += len(want)
	if len(want) == 0 {
		return nil, nil
	}
	found, err := au.scan(ctx, byTime(from.Add(-au.a.cfg.Slack)), au.rep.StreamSeq, want)
	if err != nil {
		return nil, err
	}
	// The first missing event of each resource, in seq order.
	var first []store.AuditEvent
	seen := map[string]bool{}
	for _, e := range evs {
		if want[e.ID] && !found[e.ID].ok() && !seen[e.Subject] {
			seen[e.Subject] = true
			first = append(first, e)
		}
	}
	if len(first) == 0 {
		return nil, nil
	}
	return au.repair(ctx, first)
}

// repair publishes again the missing events of the resources of first
// (each resource's first missing event) and moves their later events
// behind them. It returns the events a later audit must look at again:
// those whose repair waits, and those it repaired, whose copies (and the
// later events it moved behind them) are at the stream's tail, which a
// crash before the server's next fsync loses.
func (au *audit) repair(ctx context.Context, first []store.AuditEvent) ([]store.HeldEvent, error) {
	// The resources' events from their first missing one on, looked for
	// from a duplicate window before it: a message stored then and
	// acknowledged again as a duplicate of itself is marked that late.
	tails := make([][]store.AuditEvent, len(first))
	// Each resource's own event before them: the stream's message of it
	// is where the chain of the copies begins (RepairAttribute).
	before := make([]string, len(first))
	want := map[string]bool{}
	from := first[0].Published
	for i, f := range first {
		evs, err := au.a.st.ResourceEvents(ctx, f.Subject, f.Seq)
		if err != nil {
			return nil, err
		}
		tails[i] = evs
		for _, e := range evs {
			want[e.ID] = true
		}
		prev, err := au.a.st.PreviousOwnEvent(ctx, f.Subject, f.Seq)
		if err != nil {
			return nil, err
		}
		if prev != "" {
			before[i], want[prev] = prev, true
		}
		if f.Published.Before(from) {
			from = f.Published
		}
	}
	found, err := au.scan(ctx, byTime(from.Add(-au.window-au.a.cfg.Slack)), au.rep.StreamSeq, want)
	if err != nil {
		return nil, err
	}
	var held []store.HeldEvent
	for i, tail := range tails {
		hold, err := au.repairResource(ctx, tail, found, found[before[i]].seq)
		if err != nil {
			return nil, err
		}
		if hold {
			held = append(held, store.HeldEvent{Seq: tail[0].Seq, Subject: tail[0].Subject})
		}
	}
	return held, nil
}

// recheck looks again at the held events, each with the later events of
// its resource, and returns those still held. The resources' events are
// checked together, with one read of the stream, as a batch is. A held
// event the log no longer has (pruned) is looked at from its resource's
// next event.
func (au *audit) recheck(ctx context.Context, held []store.HeldEvent) ([]store.HeldEvent, error) {
	var still []store.HeldEvent
	var evs []store.AuditEvent
	for _, h := range held {
		if au.rechecked[h.Subject] {
			continue // looked at with its resource
		}
		tail, err := au.a.st.ResourceEvents(ctx, h.Subject, h.Seq)
		if err != nil {
			return nil, err
		}
		if len(tail) == 0 {
			continue // pruned from the log, with every later event of it
		}
		au.rechecked[h.Subject] = true
		// A resource with events still too young to move behind a repair
		// stays held, without a read of the stream.
		if slices.ContainsFunc(tail, func(e store.AuditEvent) bool {
			return e.Published.IsZero() || e.Published.After(au.cutoff)
		}) {
			still = append(still, store.HeldEvent{Seq: tail[0].Seq, Subject: h.Subject})
			continue
		}
		evs = append(evs, tail...)
	}
	if len(evs) == 0 {
		return still, nil
	}
	slices.SortFunc(evs, func(a, b store.AuditEvent) int { return cmp.Compare(a.Seq, b.Seq) })
	again, err := au.check(ctx, evs)
	if err != nil {
		return nil, err
	}
	return append(still, again...), nil
}

// repairResource repairs one resource from its events tail (in seq order,
// from the first the first read missed), found being where the stream has
// them, and chainFrom the stream sequence of the message of the resource's
// own event before them (0: none found). It reports whether a later audit
// must look at the resource again from tail's first event (its repair
// waits, or its copies are to be found on the stream).
func (au *audit) repairResource(
	ctx context.Context,
	tail []store.AuditEvent,
	found map[string]streamPos,
	chainFrom uint64,
) (bool, error) {
	a := au.a
	start := -1
	for i, e := range tail {
		if !found[e.ID].ok() && !e.Published.IsZero() && !e.Published.Before(au.retains) {
			start = i
			break
		}
	}
	if start < 0 {
		return false, nil // on the stream after all, before the first read's start
	}
	// The copies of the resource's events each name the copy before them
	// (RepairAttribute), from the message the stream holds of its own
	// last event before the first missing one (chainFrom, or one of the
	// tail found after all): a repair an earlier audit began and could not
	// finish (a failed publish, a duplicate, copies the stream lost before
	// their fsync) goes on where it stopped, rather than begin a chain a
	// replica holding the rest cannot join.
	chainAt := chainFrom
	for _, e := range tail[:start] {
		if pos := found[e.ID]; pos.ok() && store.OwnResource(e.Resource) {
			chainAt = max(chainAt, pos.seq)
		}
	}
	tail = tail[start:]
	for _, e := range tail {
		if e.Published.IsZero() || e.Published.After(au.cutoff) {
			missing := 0
			for _, m := range tail {
				if !found[m.ID].ok() && !m.Published.IsZero() {
					missing++
				}
			}
			au.rep.Deferred += missing
			a.log.Warn(
				"stream lacks an event; publishing it again waits until its resource's later events are older than the duplicate window",
				"id",
				tail[0].ID,
				"type",
				tail[0].Type,
				"seq",
				tail[0].Seq,
				"resource",
				tail[0].Subject,
				"waits_for",
				e.ID,
			)
			return true, nil
		}
	}
	var lastCopy uint64
	for _, e := range tail {
		pos := found[e.ID]
		if pos.ok() {
			// Behind the repaired event goes every later one, once.
			if err := au.deleteMsg(ctx, pos.seq); err != nil {
				return false, fmt.Errorf(
					"audit: move %s %s (stream seq %d) behind the repaired events of %s: %w",
					e.Type,
					e.ID,
					pos.seq,
					e.Subject,
					err,
				)
			}
		}
		m := a.message(e.Event)
		if chainAt != 0 && store.OwnResource(e.Resource) && a.cfg.RepairMessage != nil {
			m = a.cfg.RepairMessage(e.Event, chainAt)
		}
		ack, err := a.republish(ctx, m)
		if err != nil {
			a.cfg.Fence.Check(err, m)
			return false, fmt.Errorf("audit: publish %s %s again: %w", e.Type, e.ID, err)
		}
		if ack.Duplicate {
			au.rep.Duplicates++
			a.log.Warn("stream lacks an event, but JetStream dropped it again as a duplicate; trying again at the next audit",
				"id", e.ID, "type", e.Type, "seq", e.Seq, "window", au.window.String())
			return true, nil
		}
		lastCopy = ack.Sequence
		if store.OwnResource(e.Resource) {
			chainAt = ack.Sequence
		}
		if pos.ok() {
			au.rep.Reordered++
			continue
		}
		au.rep.Repaired++
		a.log.Warn(
			"event missing from the stream published again",
			"id",
			e.ID,
			"type",
			e.Type,
			"seq",
			e.Seq,
			"stream_seq",
			ack.Sequence,
		)
		if a.cfg.OnRepaired != nil {
			a.cfg.OnRepaired(e.Event)
		}
	}
	// Held: the next audit finds the copies on the stream, or publishes
	// again what it lost of them.
	return true, au.behindCopies(ctx, tail[len(tail)-1], lastCopy)
}

// behindCopies deletes the events of last's resource recorded after last
// that reached the stream while the repair published its copies, and
// before the last of them (the relay publishes on): they are young, so
// they cannot be published again behind it now, and a later audit does,
// as it finds them missing.
func (au *audit) behindCopies(ctx context.Context, last store.AuditEvent, lastCopy uint64) error {
	newer, err := au.a.st.ResourceEvents(ctx, last.Subject, last.Seq+1)
	if err != nil || len(newer) == 0 {
		return err
	}
	want := make(map[string]bool, len(newer))
	for _, e := range newer {
		want[e.ID] = true
	}
	found, err := au.scan(ctx, bySeq(au.rep.StreamSeq+1), lastCopy, want)
	if err != nil {
		return err
	}
	for _, e := range newer {
		if pos := found[e.ID]; pos.ok() && pos.seq < lastCopy {
			if err := au.deleteMsg(ctx, pos.seq); err != nil {
				return fmt.Errorf("audit: delete %s %s, ahead of the repaired events of its resource: %w", e.Type, e.ID, err)
			}
			au.a.log.Warn(
				"an event published during the repair of its resource went ahead of it; deleted it from the stream for a later audit to publish again",
				"id",
				e.ID,
				"type",
				e.Type,
				"seq",
				e.Seq,
			)
		}
	}
	return nil
}

// eventID is the id of the event a message's Nats-Msg-Id names: by the
// ids this audit derives (byMsgID), or else as any key derives them
// (signing.EventID), for an event published under another signing key
// than today's, or unsigned (the key changed, or signing was turned on).
// Without that a sweep after a key's change took every event for missing
// and published it again, a second copy. (Whether a message is the
// leader's own is the followers' check: docs/cluster.md, "Signed
// messages".)
func eventID(byMsgID map[string]string, msgID string) (string, bool) {
	if id, ok := byMsgID[msgID]; ok {
		return id, true
	}
	return signing.EventID(msgID)
}

// yield gives way to what the audit's Yield names, if anything.
func (a *Auditor) yield(ctx context.Context) error {
	if a.cfg.Yield == nil {
		return nil
	}
	return a.cfg.Yield(ctx)
}

// msgID is the Nats-Msg-Id of the event whose id is id.
func (a *Auditor) msgID(id string) string {
	if a.cfg.MsgID == nil {
		return id
	}
	return a.cfg.MsgID(id)
}

// streamPos is where the stream holds a message; the zero value: nowhere.
type streamPos struct{ seq uint64 }

func (p streamPos) ok() bool { return p.seq > 0 }

// scanStart is where a read of the stream begins.
type scanStart func(*jetstream.ConsumerConfig)

func byTime(t time.Time) scanStart {
	return func(c *jetstream.ConsumerConfig) {
		c.DeliverPolicy, c.OptStartTime = jetstream.DeliverByStartTimePolicy, &t
	}
}

func bySeq(seq uint64) scanStart {
	return func(c *jetstream.ConsumerConfig) {
		c.DeliverPolicy, c.OptStartSeq = jetstream.DeliverByStartSequencePolicy, seq
	}
}

// scanBatch is how many messages one fetch of a stream read asks for.
const scanBatch = 1000

// scanFetchWait bounds one fetch of a stream read, after which it is given
// up if its messages have not ended a second later (Fetched).
const scanFetchWait = 10 * time.Second

// scan reads the stream's messages on the syncd subjects from start up to
// sequence until (or its end, or until it found all of want), headers
// only, through an ephemeral consumer, batch by batch, and returns where
// it found the events of want (by the Nats-Msg-Id each is published under).
// A message the read skipped (a lost fetch) fails
// it: the audit must never take a message for missing that it did not
// read.
func (au *audit) scan(
	ctx context.Context,
	start scanStart,
	until uint64,
	want map[string]bool,
) (map[string]streamPos, error) {
	a := au.a
	cfg := jetstream.ConsumerConfig{
		AckPolicy:         jetstream.AckNonePolicy,
		FilterSubject:     a.cfg.SubjectPrefix + ".>",
		HeadersOnly:       true,
		InactiveThreshold: time.Minute,
		MemoryStorage:     true,
		Replicas:          1,
	}
	start(&cfg)
	cons, err := au.stream.CreateConsumer(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("audit: read stream %s: create a consumer: %w", a.cfg.Stream, err)
	}
	defer func() {
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := au.stream.DeleteConsumer(dctx, cons.CachedInfo().Name); err != nil {
			a.log.Debug("delete the audit's consumer; it goes after a minute idle", "err", err)
		}
	}()
	found := make(map[string]streamPos)
	// The stream names messages by Nats-Msg-Id, the audit by event id.
	byMsgID := make(map[string]string, len(want))
	for id := range want {
		byMsgID[a.msgID(id)] = id
	}
	if cons.CachedInfo().NumPending == 0 {
		return found, nil
	}
	var next uint64 = 1 // the consumer sequence expected
	for empty := 0; ; {
		if err := a.yield(ctx); err != nil {
			return nil, err
		}
		// What is stored is there to take: no waiting for a full batch.
		batch, err := cons.FetchNoWait(scanBatch)
		if err != nil {
			return nil, fmt.Errorf("audit: read stream %s: %w", a.cfg.Stream, err)
		}
		n, done, stuck := 0, false, false
		// The batch ends a second after its last message (nats.go's own
		// timer); scanFetchWait bounds it should the library leave it open.
		fctx, cancel := context.WithTimeout(ctx, scanFetchWait)
		for m := range Fetched(fctx, batch, time.Second, &stuck) {
			n++
			md, err := m.Metadata()
			if err != nil {
				cancel()
				return nil, fmt.Errorf("audit: read stream %s: %w", a.cfg.Stream, err)
			}
			if md.Sequence.Consumer != next {
				cancel()
				return nil, fmt.Errorf(
					"audit: read stream %s: message %d of the read came as %d (lost on the way); reading again at the next audit",
					a.cfg.Stream,
					next,
					md.Sequence.Consumer,
				)
			}
			next++
			if id, ok := eventID(byMsgID, m.Headers().Get(jetstream.MsgIDHeader)); ok && want[id] {
				found[id] = streamPos{md.Sequence.Stream}
			}
			// Once all it looks for is found, the rest need not be read:
			// an audit whose events are all there stops at the last.
			if md.Sequence.Stream >= until || md.NumPending == 0 || len(found) == len(want) {
				done = true
			}
		}
		cancel()
		if stuck {
			return nil, fmt.Errorf(
				"audit: read stream %s: a fetch did not end %s after its wait; reading again at the next audit",
				a.cfg.Stream,
				scanFetchWait,
			)
		}
		if err := batch.Error(); err != nil && !errors.Is(err, nats.ErrTimeout) {
			return nil, fmt.Errorf("audit: read stream %s: %w", a.cfg.Stream, err)
		}
		if done {
			return found, nil
		}
		if n == 0 {
			info, err := cons.Info(ctx)
			if err != nil {
				return nil, fmt.Errorf("audit: read stream %s: %w", a.cfg.Stream, err)
			}
			if info.NumPending == 0 {
				return found, nil // the rest was removed while reading
			}
			if empty++; empty < 3 {
				continue
			}
			return nil, fmt.Errorf("audit: read stream %s: no message came with %d pending", a.cfg.Stream, info.NumPending)
		}
	}
}

// republish publishes m again as a single write of the fence's term.
func (a *Auditor) republish(ctx context.Context, m *nats.Msg) (*jetstream.PubAck, error) {
	defer a.cfg.Fence.Hold()()
	if err := a.cfg.Fence.StampEvent(m); err != nil {
		return nil, err
	}
	return a.js.PublishMsg(ctx, m, jetstream.WithExpectStream(a.cfg.Stream))
}
