package publish

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v4"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/signing"
	"github.com/syncd-dev/syncd/internal/store"
)

// Outbox is what the relay needs of the store.
type Outbox interface {
	// ReadUnpublished calls fn with the unpublished events after seq after,
	// in commit (seq) order and batches of up to batch, until the outbox
	// ends or fn returns an error, which it returns.
	ReadUnpublished(ctx context.Context, after int64, batch int, fn func([]store.Event) error) error
	MarkPublished(ctx context.Context, seqs []int64) error
	// Notify receives a value after every commit that added events; it
	// holds at most one. The relay reads the outbox again only after one,
	// so a store whose outbox grows must signal it (nil: it never grows).
	Notify() <-chan struct{}
}

// Defaults of the relay's pipeline. A thousand publishes in flight keep
// JetStream busy while the relay waits for acknowledgements; on a 2-core
// machine BenchmarkRelay/Store measured no gain from 2,048 or 4,096 in
// flight, nor from batches of 512 or 1,024.
const (
	DefaultBatch       = 256
	DefaultMaxInFlight = 1024
	// markBatch is how many acknowledged events are marked published in one
	// transaction; fewer, larger transactions keep the writer free for ingest.
	markBatch = 2000
)

// Relay publishes the outbox to JetStream.
type Relay struct {
	js jetstream.JetStream
	// stream is the configuration the stream is created again with, when
	// it is gone (see recreate).
	stream      Config
	outbox      Outbox
	format      Format
	log         *slog.Logger
	batch       int
	maxInFlight int
	// onPublished, when set, is called for every acknowledged event, from
	// the relay's goroutine.
	onPublished func(store.Event)
	// kv, when set, is written with the state of every event marked
	// published (see kv.go).
	kv *KV
	// state is the outcome of Run's last pass (a *passState).
	state atomic.Pointer[passState]
	// inFlight counts the publishes awaiting an answer, and progress is
	// when (unix nanoseconds) the last answer came or the first of them
	// went out: Err tells a stalled pass before it ends.
	inFlight, progress atomic.Int64
	// kvDropped: the last pass dropped KV writes its writer could not keep
	// up with, or skipped those of duplicates, so the next pass, which
	// reconciles the buckets, is due now.
	kvDropped bool
	// kvErr is the buckets' last failure (a reconciliation or a write),
	// nil once a reconciliation succeeded. A failed reconciliation is not
	// tried again before kvRetryAt, backing off with kvBackoff: the
	// passes in between publish without waiting on buckets that do not
	// answer (each attempt can take watchStall). Only the goroutine
	// running the passes touches these.
	kvErr     error
	kvRetryAt time.Time
	kvBackoff *backoff.ExponentialBackOff
	// cp, when set, is where checkpoints are read from (see checkpoint.go):
	// one is due every cpEvery, and at once after RequestCheckpoint.
	cp       CheckpointSource
	cpEvery  time.Duration
	cpLeader string
	cpKick   chan struct{}
	cpLast   time.Time
	// cpSent is the last checkpoint published (event seq and digest) and
	// when: one asked for after a quiet crawl, with nothing changed since,
	// waits for the next one due.
	cpSent     string
	cpSentTime time.Time
	// fence, when set, stamps every write with the lease term (fence.go);
	// lanes spreads the passes' publishes over its lanes, from one pass to
	// the next, and left holds the publishes a cancelled pass left in
	// flight, which the next pass waits for.
	fence *Fence
	lanes *Pipeline
	left  leftInFlight
	// signer, when set, signs every message the relay publishes and
	// derives its Nats-Msg-Id (see internal/signing).
	signer *signing.Signer
	// busy tells the passes under way (Idle).
	busy passGate
	// streamCreated is the creation time of the stream the mirror's
	// position was last recorded for, and streamSeq the highest sequence
	// recorded since (see noteStream); only the passes' goroutine touches
	// them.
	streamCreated time.Time
	streamSeq     uint64
}

// StreamPosition is a mirror that records the stream sequence it reflects
// up to (see store.SetStreamSeq).
type StreamPosition interface {
	SetStreamSeq(ctx context.Context, seq uint64) error
}

// StreamIncarnation is a mirror that records which stream its position
// counts (see store.SetStreamIncarnation): a stream created again counts
// from 1.
type StreamIncarnation interface {
	SetStreamIncarnation(ctx context.Context, created time.Time, last uint64) (moved bool, err error)
}

// noteStream records, before the mirror's position moves to seq, which
// stream seq counts: at the first position the relay records, and when a
// message stored anew (not a duplicate, which names its first copy's
// sequence) got a sequence at or below one recorded before, firstNew (0:
// none stored anew), it looks the stream up. A stream gives each new
// message a sequence above all before it; one at or below is another
// stream's (created again under the relay, by another or by recreate) or
// a stream that lost its tail. Otherwise the position would stay where
// the old stream's was, and a snapshot or a standby taking it would pass
// over the new stream's messages below it.
func (r *Relay) noteStream(ctx context.Context, seq, firstNew uint64) error {
	m, ok := r.outbox.(StreamIncarnation)
	if !ok || r.stream.Stream == "" {
		return nil
	}
	if !r.streamCreated.IsZero() && (firstNew == 0 || firstNew > r.streamSeq) {
		r.streamSeq = max(r.streamSeq, seq)
		return nil
	}
	reused := !r.streamCreated.IsZero()
	if reused {
		// The stream gives sequences again that it gave before: whatever
		// its writes were conditional on (this term's markers) may be gone
		// or stand for another term's now.
		r.fence.Doubt(fmt.Sprintf("the stream stored a message at sequence %d, at or below %d, which it had "+
			"acknowledged before (it lost its last writes, or was created again)", firstNew, r.streamSeq))
	}
	s, err := r.js.Stream(ctx, r.stream.Stream)
	if err != nil {
		// Looked up again at the next position or checkpoint: the position
		// recorded meanwhile is set to 0 then if the stream is another.
		r.log.Debug("look up the stream to record which one the position counts; at the next pass", "err", err)
		r.streamCreated = time.Time{}
		return nil
	}
	info := *s.CachedInfo()
	if firstNew > 0 && firstNew <= r.streamSeq {
		// Its sequences from firstNew on are new messages': a position
		// past firstNew-1 was of messages the stream lost (its tail), if
		// it is the same stream.
		info.State.LastSeq = min(info.State.LastSeq, firstNew-1)
	}
	_, err = r.recordStream(ctx, m, &info, seq, reused)
	if reused && err == nil {
		r.streamSeq = seq // counted from here: the sequences above were given again
	}
	return err
}

// recordStream records that the mirror's position counts the stream
// info, at seq; moved: the mirror's positions counted another (or passed
// the stream's last sequence), and are 0 now.
func (r *Relay) recordStream(ctx context.Context, m StreamIncarnation, info *jetstream.StreamInfo, seq uint64,
	doubted bool) (moved bool, err error) {
	moved, err = m.SetStreamIncarnation(ctx, info.Created, info.State.LastSeq)
	if err != nil {
		return false, err
	}
	if moved {
		r.log.Info("the stream is not the one the mirror's position counted (created again): recorded its position anew",
			"stream", r.stream.Stream, "created", info.Created, "stream_seq", seq)
		if !doubted {
			// Created again, or it lost its tail: this term's markers may
			// be gone, or another term's may stand at their sequences.
			r.fence.Doubt(fmt.Sprintf("the stream %s is behind the mirror's position: it lost its last writes, "+
				"or was created again", r.stream.Stream))
		}
	}
	if moved || !info.Created.Equal(r.streamCreated) {
		r.streamSeq = 0
	}
	r.streamCreated, r.streamSeq = info.Created, max(r.streamSeq, seq)
	return moved, nil
}

// CheckpointSource is what the relay reads a checkpoint from.
type CheckpointSource interface {
	CheckpointState(ctx context.Context) (store.CheckpointState, error)
}

// WithCheckpoints has the relay put a checkpoint of src's state on the
// stream every every (and when asked), each once the outbox is drained:
// leader names the replica in it.
func WithCheckpoints(src CheckpointSource, every time.Duration, leader string) RelayOption {
	return func(r *Relay) { r.cp, r.cpEvery, r.cpLeader = src, every, leader }
}

// RequestCheckpoint asks for a checkpoint as soon as the outbox is drained
// (after a crawl, say), without waiting for the next one due.
func (r *Relay) RequestCheckpoint() {
	select {
	case r.cpKick <- struct{}{}:
	default:
	}
}

// stallAfter is how long publishes may wait for an acknowledgement before
// Err reports the relay stalled: far above JetStream's usual milliseconds,
// far below the publish timeout (30s) after which the pass fails.
const stallAfter = 5 * time.Second

// goneCheckAfter is how long a pass's publishes wait before it looks
// whether the stream is gone (see relayPass.run): stallAfter.
var goneCheckAfter = stallAfter

// passState is the outcome of a pass: nil err when it published all it read.
type passState struct{ err error }

// Err is nil while the relay publishes: Run's last pass published every
// event it read (or Run has not passed yet). Otherwise it is why not, for
// a readiness check: JetStream does not acknowledge (no connection, or a
// stream that lost its quorum), and events wait in the outbox.
func (r *Relay) Err() error {
	if n := r.inFlight.Load(); n > 0 {
		if waited := time.Since(time.Unix(0, r.progress.Load())); waited > stallAfter {
			return fmt.Errorf(
				"%d publishes have waited %s for JetStream's acknowledgement (is the stream without a leader?)",
				n,
				waited.Round(time.Second),
			)
		}
	}
	if st := r.state.Load(); st != nil {
		return st.err
	}
	return nil
}

// RelayOption tunes a Relay.
type RelayOption func(*Relay)

// WithBatch sets how many events the relay reads from the outbox at a time.
func WithBatch(n int) RelayOption { return func(r *Relay) { r.batch = max(n, 1) } }

// WithMaxInFlight bounds the publishes awaiting an acknowledgement, and the
// events read but not yet acknowledged to four times as many.
func WithMaxInFlight(n int) RelayOption { return func(r *Relay) { r.maxInFlight = max(n, 1) } }

// WithOnPublished has fn called for every event JetStream acknowledged, from
// the relay's goroutine: the observer of what was published (metrics, logs).
func WithOnPublished(fn func(store.Event)) RelayOption {
	return func(r *Relay) { r.onPublished = fn }
}

// WithKV has the relay keep the state buckets of k: it writes the state
// every event sets once the event is marked published, and reconciles the
// buckets with the mirror when it starts and whenever they may lag.
func WithKV(k *KV) RelayOption { return func(r *Relay) { r.kv = k } }

// WithFence has every write of the relay (events, checkpoints, and the KV
// buckets' puts and deletes) go through f: once another replica's lease
// term began, the server refuses them.
func WithFence(f *Fence) RelayOption { return func(r *Relay) { r.fence = f } }

// WithSigner has the relay sign every event and checkpoint it publishes
// with s, under a Nats-Msg-Id derived with s (signing.Signer.Seal).
func WithSigner(s *signing.Signer) RelayOption { return func(r *Relay) { r.signer = s } }

// NewRelay returns a relay from outbox to js.
func NewRelay(js jetstream.JetStream, outbox Outbox, cfg Config, opts ...RelayOption) *Relay {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	r := &Relay{
		js:          js,
		stream:      cfg,
		outbox:      outbox,
		format:      cfg.Format(),
		log:         log,
		batch:       DefaultBatch,
		maxInFlight: DefaultMaxInFlight,
	}
	r.cpKick = make(chan struct{}, 1)
	for _, o := range opts {
		o(r)
	}
	r.batch = min(r.batch, r.maxInFlight)
	r.lanes = r.fence.Pipeline()
	if r.kv != nil {
		r.kv.setFence(r.fence)
		r.kvBackoff = backoff.NewExponentialBackOff(
			backoff.WithInitialInterval(kvRetryInitial),
			backoff.WithMaxInterval(kvRetryMax),
			backoff.WithMaxElapsedTime(0),
		)
	}
	return r
}

// kvRetryInitial and kvRetryMax bound the wait between reconciliations of
// buckets that failed to reconcile.
var (
	kvRetryInitial = time.Second
	kvRetryMax     = time.Minute
)

// Message encodes e as the JetStream message the relay publishes: signed,
// under a Nats-Msg-Id derived from its id, when the relay has a signer.
func (r *Relay) Message(e store.Event) *nats.Msg { return r.seal(r.format.Message(e)) }

// RepairMessage is Message for a copy the audit publishes again, naming the
// resource's own message at stream sequence after (Format.RepairMessage).
func (r *Relay) RepairMessage(e store.Event, after uint64) *nats.Msg {
	return r.seal(r.format.RepairMessage(e, after))
}

// seal signs m when the relay has a signer.
func (r *Relay) seal(m *nats.Msg) *nats.Msg {
	if r.signer == nil {
		return m
	}
	return r.signer.Seal(m)
}

// MsgID is the Nats-Msg-Id the relay publishes the event whose id is id
// under, for the stream audit.
func (r *Relay) MsgID(id string) string {
	if r.signer == nil {
		return id
	}
	return r.signer.MsgID(id)
}

// Run relays until ctx is done: it drains the outbox, then waits for the
// store to commit new events (or a minute, whichever is first). Failures
// back off and try again; nothing is marked published before JetStream
// acknowledged it.
func (r *Relay) Run(ctx context.Context) error {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(200*time.Millisecond),
		backoff.WithMaxInterval(10*time.Second),
		backoff.WithMaxElapsedTime(0),
	)
	for {
		n, err := r.pass(ctx)
		if ctx.Err() != nil {
			r.state.Store(nil) // not relaying: nothing to say
			return nil
		}
		r.state.Store(&passState{errors.Join(err, r.kvErr)})
		wait := time.Minute
		if err != nil {
			r.recreate(ctx, err)
			wait = b.NextBackOff()
			r.log.Warn(
				"publishing events failed; will retry",
				"published",
				n,
				"err",
				err,
				"retry_in",
				wait.Round(time.Millisecond).String(),
			)
		} else {
			b.Reset()
			if n > 0 {
				r.log.Debug("published events", "count", n)
				if r.committedSince() {
					continue
				}
			}
			if r.kvDropped {
				continue // the next pass reconciles the KV buckets
			}
			if until, ok := r.checkpointIn(); ok {
				if until <= 0 {
					r.checkpoint(ctx)
					// The next one due, or its retry (checkpoint): waited
					// a whole interval, a retry came only with the next
					// commit.
					until = max(time.Until(r.cpLast.Add(r.cpEvery)), 0)
				}
				wait = min(wait, until)
			}
			if r.kvErr != nil {
				wait = min(wait, max(time.Until(r.kvRetryAt), 0)) // a pass then reconciles
			}
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-r.cpKick:
			r.cpLast = time.Time{}
			t.Stop()
		case <-r.outbox.Notify():
			if err != nil {
				// A commit does not cure a broken connection: wait out the backoff.
				select {
				case <-ctx.Done():
				case <-t.C:
				}
			}
			t.Stop()
		case <-t.C:
		}
	}
}

// recreate creates the stream again when the pass failed with its
// publishes unanswered and the stream is gone: NATS can lose a stream
// whole (Jepsen's analysis of NATS 2.12.1 saw damaged snapshot files do
// it), or an operator deleted it. Until it is back every publish goes
// unanswered; the audit's next sweep publishes the event log again (see
// audit.go). With manage_stream = false it only says so.
func (r *Relay) recreate(ctx context.Context, err error) {
	if r.stream.Stream == "" || !(errors.Is(err, nats.ErrNoResponders) || errors.Is(err, jetstream.ErrNoStreamResponse) ||
		errors.Is(err, jetstream.ErrAsyncPublishTimeout) || errors.Is(err, errStreamGone)) {
		return // only publishes nobody answered, or that were dropped with the stream, say it may be gone
	}
	if _, err := r.js.Stream(ctx, r.stream.Stream); !errors.Is(err, jetstream.ErrStreamNotFound) {
		return // there, or not answering: the connection's trouble, not the stream's
	}
	if r.stream.CheckStreamOnly {
		if err := CheckStream(ctx, r.js, r.stream); err != nil {
			r.log.Error("the stream is gone: nothing is published until it is created again", "err", err)
		}
		return
	}
	s, err := ensureStream(ctx, r.js, r.stream)
	if err != nil {
		r.log.Warn("the stream is gone; creating it again failed", "stream", r.stream.Stream, "err", err)
		return
	}
	// A cluster member that has not loaded the stream yet (after its
	// restart) may answer "not found" for a stream that is there: the
	// creation then only updated it, and it holds its messages.
	if last := s.CachedInfo().State.LastSeq; last > 0 {
		r.log.Info("the stream looked gone, but is there", "stream", r.stream.Stream, "last_seq", last)
		return
	}
	if m, ok := r.outbox.(StreamIncarnation); ok {
		if _, err := r.recordStream(ctx, m, s.CachedInfo(), 0, false); err != nil {
			r.log.Warn("record the stream created again", "err", err)
		}
	}
	r.log.Warn(
		"the stream was gone (lost by NATS, or deleted); created it again: the next audit publishes the event log again",
		"stream", r.stream.Stream,
	)
}

// Flush publishes until the outbox is empty or an error stops it. It also
// returns the KV buckets' standing failure (ErrKV), if any, once it has
// published: a write that failed, or a reconciliation that failed (which
// Flush does not try again before its retry is due). The relay's next
// pass, or the next start's, reconciles the buckets.
func (r *Relay) Flush(ctx context.Context) error {
	for {
		n, err := r.pass(ctx)
		if err != nil {
			return errors.Join(err, r.kvErr)
		}
		if (n == 0 || !r.committedSince()) && !r.kvDropped {
			return r.kvErr
		}
	}
}

// ErrKV is what the KV buckets' failures (a reconciliation, a write) that
// Flush returns match with errors.Is: the events were published all the
// same.
var ErrKV = errors.New("the KV buckets failed")

// kvFailure is a failure of the KV buckets: its own text, and ErrKV.
type kvFailure struct{ error }

func (e kvFailure) Unwrap() error      { return e.error }
func (kvFailure) Is(target error) bool { return target == ErrKV }

// committedSince reports whether the store committed events since the last
// pass began, and so whether another pass may find any. A pass reads the
// outbox as of its start; without this, every pass that published something
// was followed by one that read nothing, and the read transaction it began
// after the marking commits started from an empty page cache.
func (r *Relay) committedSince() bool {
	select {
	case <-r.outbox.Notify():
		return true
	default:
		return false
	}
}

// pass reads the outbox once from its start to its end and publishes what
// it read, returning how many events JetStream acknowledged.
//
// Events of one resource (one store.Event.Subject) go one at a time, each
// after the previous one's acknowledgement, so that a failed publish can
// never let a later event of the same resource into the stream ahead of it.
// Different resources go in parallel, up to maxInFlight publishes awaiting
// acknowledgement. When a publish fails, the rest of its resource's events
// wait for the next pass; the other resources go on, unless the failure is
// one that every publish would meet (a lost connection, a stream that does
// not answer), in which case the pass stops reading and only waits for what
// is in flight.
func (r *Relay) pass(ctx context.Context) (int, error) {
	r.busy.begin()
	defer r.busy.end()
	// What is committed from here on, the pass may not see.
	r.committedSince()
	r.syncKV(ctx)
	p := &relayPass{
		r:       r,
		lanes:   make(map[string][]store.Event),
		blocked: make(map[string]bool),
		marks:   make(chan marking, 4),
		marked:  make(chan error, 1),
		fenced:  r.lanes,
		check:   TermSubject(r.format.SubjectPrefix),
	}
	r.left.drain(ctx)
	if r.kv != nil {
		p.kvw = r.kv.startWriter(ctx)
	}
	go p.markLoop(context.WithoutCancel(ctx))
	err := p.run(ctx)
	r.inFlight.Store(0) // what is left in flight is abandoned
	return p.finish(ctx, err)
}

// syncKV reconciles the state buckets when they may lag the published
// events. It runs at the start of a pass, when no write of the relay's is
// under way. A failure is kept in r.kvErr, and the pass publishes all the
// same (the writes of its events are skipped while the buckets are due a
// reconciliation); after a failure the next attempt waits for r.kvRetryAt.
func (r *Relay) syncKV(ctx context.Context) {
	if r.kv == nil {
		return
	}
	now := time.Now()
	if r.kvErr != nil && now.Before(r.kvRetryAt) {
		return
	}
	due, epoch, err := r.kv.due(ctx, now)
	if err == nil && (!due || epoch == "") {
		// Nothing to do, or a silent baseline to wait out: no failure
		// stands (and Run does not wake for a retry).
		r.clearKVFailure()
		return
	}
	var st ReconcileStats
	if err != nil {
		err = fmt.Errorf("check KV buckets: %w", err)
	} else {
		st, err = r.kv.Reconcile(ctx)
	}
	if err != nil {
		if ctx.Err() != nil {
			return // stopping: not the buckets' failure
		}
		r.kvErr = kvFailure{err}
		wait := r.kvBackoff.NextBackOff()
		r.kvRetryAt = time.Now().Add(wait)
		r.log.Warn("KV buckets could not be reconciled with the mirror; events are published meanwhile",
			"err", err, "retry_in", wait.Round(time.Millisecond).String())
		return
	}
	r.clearKVFailure()
	r.log.Info("KV buckets reconciled with the mirror", "put", st.Put, "deleted", st.Deleted, "unchanged", st.Unchanged)
}

// clearKVFailure forgets the buckets' failure and its retry.
func (r *Relay) clearKVFailure() {
	r.kvErr, r.kvRetryAt = nil, time.Time{}
	r.kvBackoff.Reset()
}

// relayPass is the state of one pass. Only the goroutine running pass
// touches it, except marks, which markLoop consumes.
type relayPass struct {
	r *Relay
	// streamSeq is the highest stream sequence JetStream acknowledged,
	// and firstNew the lowest of a message it stored anew (not a
	// duplicate; 0: none).
	streamSeq, firstNew uint64
	// inflight holds the publishes awaiting acknowledgement in publish
	// order, which is the order JetStream acknowledges them in, so waiting
	// on the oldest first costs nothing.
	inflight []flight
	// lanes has an entry for every resource with a publish in flight: the
	// resource's events read after it, to publish one by one.
	lanes   map[string][]store.Event
	queued  int             // events in lanes
	blocked map[string]bool // resources whose publish failed in this pass
	stop    bool            // stop reading: publishing is failing wholesale
	// fenced spreads the publishes over the fence's lanes of check, the
	// event stream's marker subject; waiting holds the events next in
	// their resource while as many publishes are in flight as it allows.
	fenced  *Pipeline
	check   string
	waiting []store.Event
	// conflicts counts, by event seq, the publishes refused for a lane
	// still held on the server (LaneConflict).
	conflicts map[int64]int
	errs      []error
	acked     []int64
	// ackedEvs are the events of acked, for the KV buckets (nil without),
	// less the duplicates: dupes counts those.
	ackedEvs []store.Event
	dupes    int
	total    int

	marks  chan marking
	marked chan error
	// kvw writes the state of marked events to the KV buckets (nil without).
	kvw *kvWriter
}

// marking is a batch of acknowledged events to mark published: their seqs,
// and the events themselves when the KV buckets are kept.
type marking struct {
	seqs []int64
	evs  []store.Event
}

type flight struct {
	e   store.Event
	fut jetstream.PubAckFuture
}

// run publishes what read sends until the outbox is exhausted or reading
// stops, and every publish has been answered. Reading runs in its own
// goroutine, a few batches ahead, so that publishing never waits for
// SQLite, whose one writer connection the marking of published events
// also needs.
func (p *relayPass) run(ctx context.Context) error {
	r := p.r
	rctx, cancel := context.WithCancel(ctx)
	batches := make(chan []store.Event, 2)
	readErr := make(chan error, 1)
	go func() { readErr <- p.read(rctx, batches) }()
	defer func() {
		cancel()
		for range batches {
		}
	}()
	src := batches
	// While publishes wait longer than stallAfter, the pass looks once a
	// stallAfter whether the stream is still there: publishes to a stream
	// deleted under them are dropped unanswered, and would hold the pass
	// for the client's whole publish timeout.
	stall := time.NewTicker(goneCheckAfter)
	defer stall.Stop()
	for {
		// Take a batch only while there is room for all of it in flight,
		// and for the events waiting behind busy resources.
		var in <-chan []store.Event
		if !p.stop && len(p.inflight)+len(p.waiting)+r.batch <= r.maxInFlight && p.queued < 4*r.maxInFlight {
			in = src
		}
		var failed <-chan error
		var acked <-chan *jetstream.PubAck
		if len(p.inflight) > 0 {
			// Publishes are acknowledged in the order they were sent, so
			// waiting on the oldest first costs nothing.
			acked, failed = p.inflight[0].fut.Ok(), p.inflight[0].fut.Err()
		} else if in == nil {
			break // nothing in flight and nothing more to read
		}
		select {
		case evs, open := <-in:
			if !open {
				src = nil
				if err := <-readErr; err != nil {
					return err
				}
				continue
			}
			for _, e := range evs {
				p.submit(e)
			}
		case ack := <-acked:
			p.acknowledged(p.pop(), ack)
			p.answered()
			p.resume()
		case err := <-failed:
			msg := p.inflight[0].fut.Msg()
			p.refused(p.pop(), err, msg)
			p.answered()
			p.resume()
		case <-stall.C:
			if len(p.inflight) == 0 || r.stream.Stream == "" ||
				time.Since(time.Unix(0, r.progress.Load())) < goneCheckAfter {
				continue
			}
			if _, err := r.js.Stream(ctx, r.stream.Stream); errors.Is(err, jetstream.ErrStreamNotFound) {
				p.leave()
				return fmt.Errorf("%d publishes waited %s for their acknowledgement: %w",
					len(p.inflight), goneCheckAfter, errStreamGone)
			}
		case <-ctx.Done():
			p.leave()
			return ctx.Err()
		}
	}
	return nil
}

// errStreamGone: the stream the pass publishes to does not exist.
var errStreamGone = errors.New("the stream is gone")

// leave gives up the publishes in flight: their events are published
// again next time, and JetStream drops the duplicates. On lanes, the next
// pass waits for them.
func (p *relayPass) leave() {
	if p.fenced.Depth() > 0 {
		for _, f := range p.inflight {
			p.r.left.add(f.fut)
		}
	}
}

// read sends the unpublished events to out, batch by batch in commit order,
// and closes out at the end of the outbox, on error, or when ctx is done.
func (p *relayPass) read(ctx context.Context, out chan<- []store.Event) error {
	defer close(out)
	err := p.r.outbox.ReadUnpublished(ctx, 0, p.r.batch, func(evs []store.Event) error {
		select {
		case out <- evs:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	if ctx.Err() != nil {
		return nil // the pass is over; its caller has the reason
	}
	if err != nil {
		return fmt.Errorf("read unpublished events: %w", err)
	}
	return nil
}

// answered takes in the answers that have arrived already, oldest first,
// without waiting: acknowledgements come in bursts, and taking a burst in
// one go spares the run loop a wakeup per publish.
func (p *relayPass) answered() {
	for len(p.inflight) > 0 {
		f := p.inflight[0].fut
		select {
		case ack := <-f.Ok():
			p.acknowledged(p.pop(), ack)
		case err := <-f.Err():
			msg := p.inflight[0].fut.Msg()
			p.refused(p.pop(), err, msg)
		default:
			return
		}
	}
}

// pop removes the oldest publish in flight and returns its event.
func (p *relayPass) pop() store.Event {
	e := p.inflight[0].e
	p.inflight[0] = flight{}
	p.inflight = p.inflight[1:]
	p.r.inFlight.Store(int64(len(p.inflight)))
	p.r.progress.Store(time.Now().UnixNano())
	return e
}

// submit publishes e now, or queues it behind its resource's publish in
// flight, or drops it from this pass when its resource is blocked.
func (p *relayPass) submit(e store.Event) {
	switch q, busy := p.lanes[e.Subject]; {
	case p.blocked[e.Subject]:
	case busy:
		p.lanes[e.Subject] = append(q, e)
		p.queued++
	default:
		p.lanes[e.Subject] = nil
		p.publish(e)
	}
}

// resume publishes the waiting events while the fence's lanes allow;
// once publishing fails wholesale, they wait for the next pass.
func (p *relayPass) resume() {
	if p.stop {
		clear(p.waiting)
		p.waiting = p.waiting[:0]
		return
	}
	n := 0
	for n < len(p.waiting) && len(p.inflight) < p.fenced.Depth() {
		p.publish(p.waiting[n])
		p.waiting[n] = store.Event{}
		n++
	}
	p.waiting = p.waiting[n:]
}

// publish sends e, whose resource is idle, and registers it as in flight;
// or has it wait while the fence's lanes are all in flight.
func (p *relayPass) publish(e store.Event) {
	if d := p.fenced.Depth(); d > 0 && len(p.inflight) >= d {
		p.waiting = append(p.waiting, e)
		return
	}
	m := p.r.Message(e)
	if err := p.r.fence.StampLane(m, p.check, p.fenced.Lane(p.check)); err != nil {
		p.failed(e, err)
		return
	}
	fut, err := p.r.js.PublishMsgAsync(m)
	if err != nil {
		p.failed(e, err)
		return
	}
	if len(p.inflight) == 0 {
		p.r.progress.Store(time.Now().UnixNano())
	}
	p.inflight = append(p.inflight, flight{e: e, fut: fut})
	p.r.inFlight.Store(int64(len(p.inflight)))
}

func (p *relayPass) acknowledged(e store.Event, ack *jetstream.PubAck) {
	if ack != nil {
		p.streamSeq = max(p.streamSeq, ack.Sequence)
		if !ack.Duplicate && (p.firstNew == 0 || ack.Sequence < p.firstNew) {
			p.firstNew = ack.Sequence
		}
		if p.r.log.Enabled(context.Background(), slog.LevelDebug) {
			// Where the stream says it holds the event: a duplicate's
			// sequence is its first copy's.
			p.r.log.Debug("acknowledged", "id", e.ID, "stream_seq", ack.Sequence, "duplicate", ack.Duplicate)
		}
	}
	p.acked = append(p.acked, e.Seq)
	switch {
	case p.r.kv == nil:
	case ack != nil && ack.Duplicate:
		// The stream had it already, and newer events of its resource
		// may have followed it there: a deposed leader's outbox, published
		// when it leads again, holds changes the other leader recorded
		// under the same ids and moved on from. Writing its state now
		// could put an older state over a newer one; the reconciliation
		// after the pass writes the mirror's instead.
		p.dupes++
	default:
		p.ackedEvs = append(p.ackedEvs, e)
	}
	p.total++
	if len(p.acked) >= markBatch {
		p.marks <- marking{p.acked, p.ackedEvs}
		p.acked = make([]int64, 0, markBatch)
		p.ackedEvs = nil
	}
	if p.r.onPublished != nil {
		p.r.onPublished(e)
	}
	if q := p.lanes[e.Subject]; len(q) > 0 {
		next := q[0]
		q[0] = store.Event{}
		p.lanes[e.Subject] = q[1:]
		p.queued--
		p.publish(next)
		return
	}
	delete(p.lanes, e.Subject)
}

// refused handles the refusal of e's publish: sent again at once, on the
// next lane, when its lane was still held on the server (a few times at
// most); otherwise failed.
func (p *relayPass) refused(e store.Event, err error, sent *nats.Msg) {
	if LaneConflict(err) && p.conflicts[e.Seq] < maxLaneConflicts {
		if p.conflicts == nil {
			p.conflicts = map[int64]int{}
		}
		p.conflicts[e.Seq]++
		p.publish(e) // still the head of its resource: nothing overtook it
		return
	}
	p.failed(e, err, sent)
}

// maxLaneConflicts bounds how often one event is sent again after a lane
// conflict in a pass.
const maxLaneConflicts = 3

// failed blocks e's resource for the rest of the pass: its later events must
// not overtake e.
func (p *relayPass) failed(e store.Event, err error, sent ...*nats.Msg) {
	p.queued -= len(p.lanes[e.Subject])
	delete(p.lanes, e.Subject)
	p.blocked[e.Subject] = true
	if len(p.errs) < 3 {
		p.errs = append(p.errs, fmt.Errorf("publish %s %s (seq %d): %w", e.Type, e.ID, e.Seq, err))
	}
	if wholesale(p.r.js.Conn(), err) || p.r.fence.Check(err, sent...) {
		p.stop = true
	}
}

// wholesale reports whether err is one that every publish would meet now,
// as opposed to one about this message (too large, rejected by the stream).
func wholesale(nc *nats.Conn, err error) bool {
	return !nc.IsConnected() || errors.Is(err, nats.ErrDisconnected) || errors.Is(err, nats.ErrConnectionClosed) ||
		errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionReconnecting) ||
		errors.Is(err, nats.ErrTimeout) || errors.Is(err, jetstream.ErrAsyncPublishTimeout) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, jetstream.ErrTooManyStalledMsgs) ||
		errors.Is(err, nats.ErrNoResponders) ||
		// A write to the server that timed out (Config.WriteTimeout), or
		// the socket it then closed.
		errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, net.ErrClosed)
}

// markLoop marks acknowledged events published, merging what queued up
// while the previous transaction ran, then hands them to the writer of
// the KV buckets: only then, so that the buckets never show a state the
// outbox would publish again, and without waiting for the writes (only
// for room in the writer's queue, see kvWriter.enqueue). It reports the
// first error on marked.
func (p *relayPass) markLoop(ctx context.Context) {
	var first error
	for m := range p.marks {
	merge:
		for {
			select {
			case more, ok := <-p.marks:
				if !ok {
					break merge
				}
				m.seqs = append(m.seqs, more.seqs...)
				m.evs = append(m.evs, more.evs...)
			default:
				break merge
			}
		}
		if err := p.r.outbox.MarkPublished(ctx, m.seqs); err != nil {
			if first == nil {
				first = fmt.Errorf("mark %d events published: %w", len(m.seqs), err)
			}
			continue // they go out again, and then to the buckets
		}
		if p.kvw != nil {
			// A full queue holds the marking, and through it the
			// publishing, until the writer takes it (see enqueue).
			p.kvw.enqueue(ctx, m.evs)
		}
	}
	p.marked <- first
}

// finish marks the rest of the acknowledged events published and returns
// the pass's outcome. A failed mark is not lost work: the events go out
// again and JetStream drops them as duplicates.
func (p *relayPass) finish(ctx context.Context, runErr error) (int, error) {
	if len(p.acked) > 0 {
		p.marks <- marking{p.acked, p.ackedEvs}
	}
	close(p.marks)
	markErr := <-p.marked
	if p.kvw != nil {
		// The writes go on while the pass publishes; this waits only for
		// the last of them. A failure has the next pass reconcile.
		dropped, err := p.kvw.close()
		if err != nil && ctx.Err() == nil {
			// The buckets are dirty: the next pass reconciles them (at
			// once unless a reconciliation failed already).
			p.r.kvErr = kvFailure{fmt.Errorf("write the state of published events to the KV buckets: %w", err)}
		}
		if p.dupes > 0 {
			p.r.kv.dirty.Store(true)
		}
		// A bucket that lost its last writes holds older states than the
		// events published, and would until the next commit: reconcile now.
		lost := p.r.kv.lostWrites.Swap(false)
		p.r.kvDropped = dropped > 0 || p.dupes > 0 || lost
		if dropped > 0 {
			p.r.log.Warn("KV writes fell behind the relay; dropped them, the buckets will be reconciled", "events", dropped)
		}
	}
	if ctx.Err() != nil {
		return p.total, ctx.Err()
	}
	if pos, ok := p.r.outbox.(StreamPosition); ok && p.streamSeq > 0 && markErr == nil {
		// The mirror reflects the stream up to here: a checkpoint before
		// it, met again as a standby, tells nothing about this mirror.
		if err := p.r.noteStream(ctx, p.streamSeq, p.firstNew); err != nil {
			markErr = err
		} else if err := pos.SetStreamSeq(ctx, p.streamSeq); err != nil {
			markErr = err
		}
	}
	errs := append([]error{runErr}, p.errs...)
	if n := len(p.blocked); n > len(p.errs) {
		errs = append(errs, fmt.Errorf("and %d more resources failed", n-len(p.errs)))
	}
	return p.total, errors.Join(append(errs, markErr)...)
}

// noChange is why no checkpoint is written when the last one still holds;
// checkpointRetry is when one that could not be written is tried again,
// and refillRetry one held off while the audit refills the stream (which
// takes a duplicate window at least: CheckpointState reads the state
// again each time).
const (
	noChange        = "nothing changed since the last checkpoint"
	checkpointRetry = 250 * time.Millisecond
	refillRetry     = time.Second
)

// checkpointIn is how long until the next checkpoint is due; false when
// the relay writes none.
func (r *Relay) checkpointIn() (time.Duration, bool) {
	if r.cp == nil || r.cpEvery <= 0 {
		return 0, false
	}
	select {
	case <-r.cpKick:
		return 0, true
	default:
	}
	return time.Until(r.cpLast.Add(r.cpEvery)), true
}

// checkpoint publishes a checkpoint when it can be one now; one that
// cannot is tried at the next one due.
func (r *Relay) checkpoint(ctx context.Context) {
	r.cpLast = time.Now()
	seq, why, err := r.PublishCheckpoint(ctx)
	switch {
	case err != nil:
		r.log.Warn("publish a checkpoint; the next one is due in "+r.cpEvery.String(), "err", err)
	case why != "":
		r.log.Debug("no checkpoint now", "why", why)
		switch {
		case r.cp == nil || why == noChange:
		case strings.HasPrefix(why, store.WhyRefill):
			// Soon after the audit ends the refill, not at the next one
			// due: the followers have compared nothing since the stream
			// was lost.
			r.cpLast = time.Now().Add(refillRetry - r.cpEvery)
		default:
			// Events wait (data that changes all the time leaves the
			// outbox empty only now and then): try again soon rather
			// than at the next one due.
			r.cpLast = time.Now().Add(checkpointRetry - r.cpEvery)
		}
	default:
		r.log.Debug("published a checkpoint", "stream_seq", seq)
	}
}

// PublishCheckpoint publishes a checkpoint of the mirror's state and
// returns its stream sequence, if it can be one now: with nothing in the
// outbox, every event the digest covers is on the stream before it, and
// the relay publishes nothing else meanwhile (it must not be called beside
// Run). Otherwise it returns why not.
func (r *Relay) PublishCheckpoint(ctx context.Context) (uint64, string, error) {
	if r.cp == nil {
		return 0, "the relay writes no checkpoints", nil
	}
	st, err := r.cp.CheckpointState(ctx)
	if err != nil || !st.Ready {
		return 0, st.Why, err
	}
	// A quiet leader learns of a stream created again here, before its
	// checkpoint would be the first message of the new stream.
	if m, ok := r.outbox.(StreamIncarnation); ok && r.stream.Stream != "" {
		s, err := r.js.Stream(ctx, r.stream.Stream)
		if err != nil {
			return 0, "", fmt.Errorf("publish checkpoint: look up stream %s: %w", r.stream.Stream, err)
		}
		moved, err := r.recordStream(ctx, m, s.CachedInfo(), 0, false)
		if err != nil {
			return 0, "", err
		}
		if moved {
			if st, err = r.cp.CheckpointState(ctx); err != nil || !st.Ready {
				return 0, st.Why, err
			}
		}
	}
	same := fmt.Sprint(st.EventSeq, st.Digest)
	if same == r.cpSent && time.Since(r.cpSentTime) < r.cpEvery {
		return 0, noChange, nil
	}
	msg, err := NewCheckpoint(
		r.cpLeader,
		st.EventSeq,
		time.Now(),
		st.Digest,
	).Message(r.format.SubjectPrefix, r.format.Source)
	if err != nil {
		return 0, "", err
	}
	defer r.fence.Hold()()
	if err := r.fence.StampEvent(msg); err != nil {
		return 0, "", fmt.Errorf("publish checkpoint: %w", err)
	}
	// Published as the events are, so that whoever watches the
	// acknowledgements (the query service's position) sees it too.
	fut, err := r.js.PublishMsgAsync(r.seal(msg))
	if err != nil {
		return 0, "", fmt.Errorf("publish checkpoint: %w", err)
	}
	var ack *jetstream.PubAck
	select {
	case ack = <-fut.Ok():
	case err := <-fut.Err():
		r.fence.Check(err, fut.Msg())
		return 0, "", fmt.Errorf("publish checkpoint: %w", err)
	case <-ctx.Done():
		return 0, "", ctx.Err()
	}
	if ack.Duplicate {
		return 0, "the same checkpoint is on the stream already", nil
	}
	r.cpSent, r.cpSentTime = same, time.Now()
	if pos, ok := r.outbox.(StreamPosition); ok {
		if err := r.noteStream(ctx, ack.Sequence, ack.Sequence); err != nil {
			return ack.Sequence, "", err
		}
		if err := pos.SetStreamSeq(ctx, ack.Sequence); err != nil {
			return ack.Sequence, "", err
		}
	}
	return ack.Sequence, "", nil
}
