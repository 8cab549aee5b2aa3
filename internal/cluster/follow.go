package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/signing"
	"github.com/syncd-dev/syncd/internal/store"
)

// Mirror is what a follower needs of the store.
type Mirror interface {
	// ApplyStream applies evs, setting aside those it cannot apply.
	ApplyStream(ctx context.Context, evs []store.StreamEvent) (store.StreamResult, error)
	// ReplicaDigest is compared with the leader's at each checkpoint.
	ReplicaDigest(ctx context.Context) (store.ReplicaDigest, error)
}

// FollowerConfig configures a Follower.
type FollowerConfig struct {
	Stream        string
	SubjectPrefix string
	// Consumer is the durable consumer's name; one per mirror.
	Consumer string
	// Batch is how many messages are applied in one transaction; default
	// 1000: a transaction's and a fetch's own costs matter little then.
	Batch int
	// MaxWait is how long a fetch waits for messages; default 1s.
	MaxWait time.Duration
	// MaxBytes bounds the bytes of one fetch, so that a batch of large
	// messages cannot take the follower's memory; default 8 MiB, or two of
	// the server's largest messages if more. It must exceed the largest
	// message: one larger is never delivered.
	MaxBytes int
	// OnReject, when set, is called with the reason of every message
	// set aside (see Rejection reasons); it must be safe for concurrent use.
	OnReject func(reason string)
	Logger   *slog.Logger
	// OnBatch, when set, is called after every fetch with how many events
	// were applied and how many messages the consumer still has pending.
	OnBatch func(applied int, pending uint64)
	// Meta, when set, records the pending count as follow_lag whenever it
	// changes, where "syncd status" reads it.
	Meta Meta
	// SnapshotBucket is the Object Store bucket of the leader's snapshots;
	// empty: the follower never restores one. Restore says when it does
	// (the mirror must then be Restorable), SnapshotDir where the download
	// goes (beside the mirror; default the system's temporary directory).
	SnapshotBucket string
	Restore        RestoreMode
	SnapshotDir    string
	// MaxRestoreBytes bounds the size a snapshot may decompress to; 0:
	// 64 times its compressed size, at least 256 MiB.
	MaxRestoreBytes int64
	// Adopted, when set, is the snapshot whose file the mirror is
	// (AdoptSnapshot, before the mirror was opened).
	Adopted *SnapshotInfo
	// Verifier, when set, is the leader's keys: a message on the stream
	// that is unsigned or not signed by one of them is terminated, never
	// applied (see internal/signing). Nil: every message is taken.
	Verifier *signing.Verifier
	// OnRejected, when set, is called with the reason of every message
	// Verifier rejected (signing.ReasonUnsigned, ReasonBadSignature).
	OnRejected func(reason string)
}

// Follower applies the event stream to a mirror through a durable
// JetStream consumer: a new consumer starts at the first message the stream
// holds, a known one where it left off. Messages are acknowledged after the
// transaction that applied them committed, so a crash redelivers them, and
// the mirror ignores those it already holds.
type Follower struct {
	js     jetstream.JetStream
	mirror Mirror
	cfg    FollowerConfig
	log    *slog.Logger
	lag    atomic.Uint64
	// state is why Run is not following (a *followState); its err is nil
	// while fetches succeed.
	state atomic.Pointer[followState]
	// cons is created on first use; Run and CatchUp are never called
	// concurrently, so it and recorded need no lock.
	cons jetstream.Consumer
	// lost: the consumer was found gone under a running follower (see
	// consumerGone), and is made again from where the mirror stands.
	lost bool
	// streamCreated is when the stream the consumer was made on was
	// created: another time, found when the consumer is lost, is another
	// stream, counting its sequences from 1 again.
	streamCreated time.Time
	// recorded is the lag last recorded in Meta; -1: none yet.
	recorded int64
	// restored is the snapshot this follower restored; nil: none. Run
	// sets it, Restored reads it from other goroutines.
	restored atomic.Pointer[SnapshotInfo]
	// ahead is the batch fetched while the last one was applied; nil:
	// none. Like cons, only Run or CatchUp touches it.
	ahead *pulled
	// next is the stream sequence after the last one applied; 0: not
	// known yet. Like cons, only Run or CatchUp touches it.
	next uint64
	// diverged is why the mirror differs from the leader's at the last
	// checkpoint compared (nil: it did not); repairs counts the repairs
	// started; repair asks the next fetch to restore the newest snapshot.
	diverged atomic.Pointer[string]
	repairs  atomic.Uint64
	repair   bool
	// lastRepair is when the last repair was started; retryRepairAt, when
	// set, when a repair that found no snapshot is tried again.
	lastRepair, retryRepairAt time.Time
	// checked is the outcome of the last checkpoint compared.
	checked atomic.Pointer[CheckpointResult]
	// complete: the mirror was restored from a snapshot or matched a
	// checkpoint, so it holds the history the stream does not carry.
	complete atomic.Bool
	// rejected holds the stream sequences of the messages rejected for
	// their signature (see reject), under rejectedMu: the collecting
	// goroutine and the gap reader both reject.
	rejectedMu sync.Mutex
	rejected   map[uint64]struct{}
	// deferChecked: the mirror was asked to defer its indexes, once its
	// consumer (and restore) was set up; indexesDeferred: it did, and the
	// first fetch of Run that leaves nothing pending builds them, or
	// FinishCatchUp. Like cons, only Run, CatchUp or FinishCatchUp touches
	// them.
	deferChecked, indexesDeferred bool
}

// IndexDeferrer is a mirror that can go without its history indexes while
// a follower catches up from the stream's start, and build them once it
// has: the stream's first messages carry the leader's whole baseline.
type IndexDeferrer interface {
	// DeferIndexesForCatchUp drops the indexes if the mirror is empty,
	// and reports whether it goes without them.
	DeferIndexesForCatchUp(ctx context.Context) (bool, error)
	// BuildIndexes builds them again.
	BuildIndexes(ctx context.Context) error
}

// Positioned is a mirror that knows the stream sequence it reflects.
type Positioned interface {
	StreamPosition(ctx context.Context) (seq uint64, unpublished int, err error)
	SetStreamSeq(ctx context.Context, seq uint64) error
}

// CheckpointResult is the outcome of comparing the mirror with a checkpoint.
type CheckpointResult struct {
	// Seq is the checkpoint's stream sequence; Leader who wrote it.
	Seq    uint64
	Leader string
	Time   time.Time
	// Diff names the first table that differs; "" when the digests match.
	Diff string
}

// NewFollower returns a follower of js's stream into mirror.
func NewFollower(js jetstream.JetStream, mirror Mirror, cfg FollowerConfig) *Follower {
	if cfg.Batch <= 0 {
		cfg.Batch = 1000
	}
	if cfg.MaxWait <= 0 {
		cfg.MaxWait = time.Second
	}
	if cfg.MaxBytes <= 0 {
		cfg.MaxBytes = defaultFetchBytes
		if nc := js.Conn(); nc != nil {
			// A message larger than the limit would never be delivered.
			cfg.MaxBytes = max(cfg.MaxBytes, 2*int(nc.MaxPayload()))
		}
	}
	if cfg.OnReject == nil {
		cfg.OnReject = func(string) {}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	f := &Follower{js: js, mirror: mirror, cfg: cfg, log: cfg.Logger, recorded: -1}
	f.state.Store(&followState{errors.New("not following yet: no fetch has completed")})
	return f
}

// defaultFetchBytes is FollowerConfig.MaxBytes' default: a batch of a
// thousand events of a few KiB each fits.
const defaultFetchBytes = 8 << 20

// Rejection reasons: why a message read back from NATS was set aside, as
// syncd_rejected_messages_total{reason} counts them.
const (
	// RejectDecode: not a syncd event or checkpoint.
	RejectDecode = "decode"
	// RejectApply: an event that decodes but cannot be applied.
	RejectApply = "apply"
	// RejectPosition: a tag.moved event whose history position is neither
	// in its data nor found among the positions tried.
	RejectPosition = "position"
	// RejectSnapshot: a snapshot that failed a check before its restore.
	RejectSnapshot = "snapshot"
)

// followState is the outcome of Run's last fetch.
type followState struct{ err error }

// Err is nil while Run follows the stream: its last fetch succeeded and
// the mirror matched the last checkpoint it compared. Otherwise it is why
// not, for a readiness check: the last fetch's error, such as a stream
// that does not exist yet, or the divergence being repaired.
func (f *Follower) Err() error {
	if d := f.diverged.Load(); d != nil {
		return errors.New(*d)
	}
	return f.state.Load().err
}

// Diverged reports whether the mirror differed from the leader's at the
// last checkpoint compared.
func (f *Follower) Diverged() bool { return f.diverged.Load() != nil }

// Repairs is how many repairs of a divergence were started.
func (f *Follower) Repairs() uint64 { return f.repairs.Load() }

// LastCheckpoint is the outcome of the last checkpoint compared; false
// before the first.
func (f *Follower) LastCheckpoint() (CheckpointResult, bool) {
	r := f.checked.Load()
	if r == nil {
		return CheckpointResult{}, false
	}
	return *r, true
}

// Lag is how many messages the consumer had pending after the last fetch.
func (f *Follower) Lag() uint64 { return f.lag.Load() }

// Restored is the snapshot this follower started its mirror from; zero
// when it did not restore one.
func (f *Follower) Restored() SnapshotInfo {
	if info := f.restored.Load(); info != nil {
		return *info
	}
	return SnapshotInfo{}
}

// consumer creates the durable consumer, or finds it, once the mirror was
// restored from a snapshot if it is due.
func (f *Follower) consumer(ctx context.Context) (jetstream.Consumer, error) {
	if f.cons != nil {
		return f.cons, nil
	}
	var after uint64
	if f.lost && !f.repair && f.next > 0 {
		// The consumer was lost under a running follower: it is made
		// again where the mirror stands, nothing restored.
		after = f.next - 1
	} else {
		var err error
		if after, err = f.prepare(ctx); err != nil {
			return nil, err
		}
	}
	// The mirror's position counts the stream it was taken in: if the
	// stream was lost and created again since (counting from 1), the
	// consumer starts at the new stream's first message.
	fromStart, err := f.otherStream(ctx, after)
	if err != nil {
		return nil, err
	}
	if fromStart {
		after, f.next = 0, 0
	}
	cc := jetstream.ConsumerConfig{
		Durable:       f.cfg.Consumer,
		Description:   "syncd follower mirror",
		DeliverPolicy: jetstream.DeliverAllPolicy,
		AckPolicy:     jetstream.AckExplicitPolicy,
		AckWait:       30 * time.Second,
		FilterSubject: f.cfg.SubjectPrefix + ".>",
		// A batch applied while the next is fetched, in order:
		// per-resource order holds unless a message is redelivered, and
		// applying is idempotent.
		MaxAckPending: 4 * f.cfg.Batch,
	}
	if after > 0 {
		// The same on every start of a restored mirror: a durable
		// consumer's start cannot change.
		cc.DeliverPolicy, cc.OptStartSeq = jetstream.DeliverByStartSequencePolicy, after+1
	}
	cons, err := f.js.CreateOrUpdateConsumer(ctx, f.cfg.Stream, cc)
	if startFixed(err) {
		// A consumer of this name was created with settings that cannot
		// be updated (its start, its deliver policy): one left from
		// before a restore whose deletion did not reach the stream (the
		// request was lost in a partition). It is this follower's own;
		// the mirror's position, not the consumer's, says where to read
		// (see fetch), so it is replaced. Left, every attempt to follow
		// or to lead failed the same way until the test's minute ran out.
		if err := f.replaceConsumer(ctx, cc, err); err != nil {
			return nil, err
		}
		cons, err = f.js.CreateOrUpdateConsumer(ctx, f.cfg.Stream, cc)
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil, fmt.Errorf(
			"stream %q does not exist (yet): the syncd leader creates it when it starts: %w",
			f.cfg.Stream,
			err,
		)
	}
	if err != nil {
		return nil, fmt.Errorf("create or update consumer %s on stream %s: %w", f.cfg.Consumer, f.cfg.Stream, err)
	}
	f.cons, f.lost = cons, false
	f.lag.Store(cons.CachedInfo().NumPending)
	if f.next == 0 && !fromStart {
		// Where the mirror stands, so that messages lost on their way
		// before the first that arrives are read from the stream (see
		// fetch): a durable consumer resumes where its acknowledgements
		// stopped, at or before it.
		if m, ok := f.mirror.(Positioned); ok {
			if pos, _, err := m.StreamPosition(ctx); err == nil && pos > 0 {
				f.next = pos + 1
			}
		}
	}
	if f.next == 0 {
		// A mirror that has applied nothing: the consumer's start (the
		// server sets its ack floor just before it), so that messages of
		// the very first fetch lost on their way (a fetch cut short by its
		// wait) are read from the stream too. Before, they came only
		// after the AckWait, behind the later ones, and a catch-up that
		// ended first went without them.
		f.next = cons.CachedInfo().AckFloor.Stream + 1
	}
	return cons, nil
}

// Incarnated is a mirror that records which stream its positions count
// (store.SetStreamIncarnation).
type Incarnated interface {
	SetStreamIncarnation(ctx context.Context, created time.Time, last uint64) (moved bool, err error)
}

// otherStream reports whether the stream is not the one the mirror's
// position after (and f.next) counts: created again since (another
// creation time than the mirror recorded, or than the consumer was made
// on), or with its last sequence below the position (its tail lost). The
// mirror then records the stream, its positions 0.
func (f *Follower) otherStream(ctx context.Context, after uint64) (bool, error) {
	s, err := f.js.Stream(ctx, f.cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return false, nil // the consumer's creation says so
	}
	if err != nil {
		// Not known which stream it is (a stream just lost electing its
		// leader answers nothing): a consumer made at the position might
		// pass over the new stream's messages, so none is made yet.
		return false, fmt.Errorf("look up stream %s before making the consumer: %w", f.cfg.Stream, err)
	}
	info := s.CachedInfo()
	pos := max(after, max(f.next, 1)-1)
	other := (!f.streamCreated.IsZero() && !info.Created.Equal(f.streamCreated)) || info.State.LastSeq < pos
	if m, ok := f.mirror.(Incarnated); ok {
		moved, err := m.SetStreamIncarnation(ctx, info.Created, info.State.LastSeq)
		if err != nil {
			return false, err
		}
		other = other || moved
	}
	f.streamCreated = info.Created // the stream the consumer is made on
	if other {
		f.log.Warn("the stream is not the one the mirror's position counts (created again, or its tail lost): "+
			"following it from its first message",
			"stream", f.cfg.Stream, "created", info.Created, "last_seq", info.State.LastSeq, "was_at", pos)
	}
	return other, nil
}

// replaceConsumer deletes the durable consumer that refused cc (refused),
// unless it is not a follower's or another client is pulling from it:
// then two processes share the consumer's name ([cluster] consumer, or the
// same node_id), and deleting it would only start the other one over.
func (f *Follower) replaceConsumer(ctx context.Context, cc jetstream.ConsumerConfig, refused error) error {
	old, err := f.js.Consumer(ctx, f.cfg.Stream, f.cfg.Consumer)
	if err != nil && !errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("replace consumer %s on stream %s: %w", f.cfg.Consumer, f.cfg.Stream, errors.Join(refused, err))
	}
	if err == nil {
		if info := old.CachedInfo(); info.Config.Description != cc.Description || info.NumWaiting > 0 {
			return fmt.Errorf(
				"consumer %s on stream %s cannot be updated to this mirror's start, and is not this follower's to replace "+
					"(description %q, %d pulls waiting): is another process using the same consumer name? %w",
				f.cfg.Consumer, f.cfg.Stream, info.Config.Description, info.NumWaiting, refused)
		}
	}
	f.log.Warn("the follower's consumer was created with another start than the mirror's; replacing it",
		"consumer", f.cfg.Consumer, "start_seq", cc.OptStartSeq, "err", refused)
	if err := f.js.DeleteConsumer(ctx, f.cfg.Stream, f.cfg.Consumer); err != nil &&
		!errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("replace consumer %s on stream %s: %w", f.cfg.Consumer, f.cfg.Stream, errors.Join(refused, err))
	}
	return nil
}

// startFixed reports whether err is the server's refusal to change a
// durable consumer's settings that cannot be updated (JSConsumerCreateErrF,
// 10012: "start sequence can not be updated", "deliver policy can not be
// updated", ...).
func startFixed(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && api.ErrorCode == 10012 && strings.Contains(api.Description, "can not be updated")
}

// prepare restores the newest snapshot into the mirror when cfg.Restore
// says so, and returns the stream sequence the mirror's snapshot covers
// (0: the mirror follows the stream from its start).
func (f *Follower) prepare(ctx context.Context) (uint64, error) {
	m, ok := f.mirror.(Restorable)
	if !ok || f.cfg.SnapshotBucket == "" {
		return 0, nil
	}
	if a := f.cfg.Adopted; a != nil && f.restored.Load() == nil && !f.repair {
		// The mirror's file is the snapshot's (AdoptSnapshot).
		if err := f.startFrom(ctx, *a, true); err != nil {
			return 0, err
		}
	}
	due := f.cfg.Restore == RestoreAlways && f.restored.Load() == nil || f.repair
	if f.cfg.Restore == RestoreWhenEmpty && !f.repair {
		empty, err := m.Empty(ctx)
		if err != nil {
			return 0, err
		}
		due = empty
	}
	if due {
		info, found, refused, err := f.restorer().restore(ctx, m)
		if err != nil {
			return 0, err
		}
		defer func() { f.repair = false }()
		switch {
		case found:
			if err := f.startFrom(ctx, info, false); err != nil {
				return 0, err
			}
		case f.repair:
			f.log.Error(
				"cannot repair the mirror: no snapshot to restore yet; following on, and trying again in "+repairRetry.String(),
				"bucket",
				f.cfg.SnapshotBucket,
			)
			f.retryRepairAt = time.Now().Add(repairRetry)
		case f.cfg.Restore == RestoreAlways && refused == 0:
			return 0, fmt.Errorf("no snapshot in bucket %s to restore the mirror from", f.cfg.SnapshotBucket)
		case refused > 0:
			// A failed restore never stops the follower.
			f.log.Error(
				"no snapshot passed its checks; following the stream from its first message",
				"bucket",
				f.cfg.SnapshotBucket,
				"refused",
				refused,
			)
		default:
			f.log.Info("no snapshot to start from; following the stream from its first message", "bucket", f.cfg.SnapshotBucket)
		}
	}
	seq, err := m.SnapshotSeq(ctx)
	if err != nil {
		return 0, err
	}
	f.checkGap(ctx, seq)
	return seq, nil
}

// restorer finds, downloads and checks the snapshots of cfg.SnapshotBucket.
func (f *Follower) restorer() restorer {
	return restorer{
		js:         f.js,
		bucket:     f.cfg.SnapshotBucket,
		stream:     f.cfg.Stream,
		prefix:     f.cfg.SubjectPrefix,
		dir:        f.cfg.SnapshotDir,
		consumer:   f.cfg.Consumer,
		maxBytes:   f.cfg.MaxRestoreBytes,
		log:        f.log,
		onReject:   f.cfg.OnReject,
		verifier:   f.cfg.Verifier,
		onUnsigned: f.rejectSnapshot,
	}
}

// startFrom records that the mirror is the snapshot info now (restored,
// or its file adopted: AdoptSnapshot), and deletes the consumer left from
// before it.
func (f *Follower) startFrom(ctx context.Context, info SnapshotInfo, adopted bool) error {
	f.complete.Store(true)
	// Recorded as soon as the restore committed, before anything else can
	// fail: the mirror is at the snapshot's sequence now, wherever it was
	// before (a repair goes back). Recorded after the consumer's deletion,
	// a failed deletion left a restored mirror that said it was not (and,
	// not empty any more, was never restored again to say so).
	f.restored.Store(&info)
	f.next = info.After + 1
	if f.repair {
		// The mirror is the leader's as of the snapshot: the next
		// checkpoint after it proves the repair, or marks the mirror
		// diverged again.
		f.lastRepair, f.retryRepairAt = time.Now(), time.Time{}
		f.repairs.Add(1)
		f.diverged.Store(nil)
	}
	f.log.Info(
		"restored the mirror from a snapshot",
		"bucket",
		f.cfg.SnapshotBucket,
		"name",
		info.Name,
		"stream_seq",
		info.Seq,
		"follows_after",
		info.After,
		"bytes",
		info.Bytes,
		"raw_bytes",
		info.RawBytes,
		"took",
		info.Took.Round(time.Millisecond).String(),
		"download",
		info.Download.Round(time.Millisecond).String(),
		"file_adopted",
		adopted,
	)
	// A consumer of this name left from before would resume at its own
	// position, which has nothing to do with the snapshot (one whose
	// deletion fails is replaced when it is created: consumer).
	if err := f.js.DeleteConsumer(ctx, f.cfg.Stream, f.cfg.Consumer); err != nil &&
		!errors.Is(err, jetstream.ErrConsumerNotFound) {
		return fmt.Errorf("delete consumer %s before following from the snapshot: %w", f.cfg.Consumer, err)
	}
	return nil
}

// checkGap warns when the stream no longer holds the first message the
// mirror needs: the events in between are in neither.
func (f *Follower) checkGap(ctx context.Context, after uint64) {
	s, err := f.js.Stream(ctx, f.cfg.Stream)
	if err != nil {
		return // the consumer's creation reports it
	}
	first := s.CachedInfo().State.FirstSeq
	if n := s.CachedInfo().State.Msgs; n > 0 && first > after+1 {
		f.log.Error(
			"the stream no longer holds events this mirror needs: resources changed only then are missing or stale until they change again; "+
				"write snapshots more often than [nats] max_age ([snapshot] every), or restore a newer one",
			"needed_from",
			after+1,
			"stream_first",
			first,
			"snapshot_stream_seq",
			after,
		)
	}
}

// Run applies the stream until ctx is done. Errors of NATS or the mirror,
// a stream that does not exist yet among them, are logged, kept for Err and
// retried with backoff; only ctx ends it.
func (f *Follower) Run(ctx context.Context) error {
	defer f.dropAhead()
	const firstBackoff = 100 * time.Millisecond
	backoff := firstBackoff
	for ctx.Err() == nil {
		_, _, err := f.fetch(ctx, false)
		if ctx.Err() != nil {
			break
		}
		f.state.Store(&followState{err})
		if err == nil {
			if backoff > firstBackoff {
				f.log.Info("following the stream again", "stream", f.cfg.Stream)
			}
			backoff = firstBackoff
			continue
		}
		f.log.Warn("following the stream failed; retrying", "err", err, "in", backoff.String())
		select {
		case <-ctx.Done():
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 10*time.Second)
	}
	return nil
}

// Complete makes sure a standby about to lead holds what the stream does
// not carry (the history the old leader's baseline read): a mirror built
// from the stream alone that no checkpoint has proved yet, and that was
// never restored from a snapshot, restores the newest snapshot now. Left
// as it was, the new leader would never read that history again. So does
// a mirror a checkpoint found diverged (RepairDue), whose repair was still
// to come: a leader crawls only what changes, and would keep what it
// lacks.
func (f *Follower) Complete(ctx context.Context) error {
	if f.repair {
		f.log.Warn("the mirror diverged from the leader's: restoring the newest snapshot before leading")
		return f.restart(ctx)
	}
	m, ok := f.mirror.(Restorable)
	if !ok || f.cfg.SnapshotBucket == "" || f.complete.Load() {
		return nil
	}
	if restored, err := wasRestored(ctx, m); err != nil || restored {
		f.complete.Store(err == nil)
		return err
	}
	if empty, err := m.Empty(ctx); err != nil || empty {
		return err // nothing to complete: the crawl reads it all
	}
	f.log.Warn(
		"the mirror was built from the stream alone and no checkpoint proved it: restoring the newest snapshot before leading",
	)
	f.repair = true
	return f.restart(ctx)
}

// wasRestored reports whether m was restored from a snapshot: its
// snapshot sequence, or the store's record of it (Restored), which a
// snapshot of a stream since created again leaves at sequence 0.
func wasRestored(ctx context.Context, m Restorable) (bool, error) {
	if r, ok := m.(interface {
		Restored(ctx context.Context) (bool, error)
	}); ok {
		return r.Restored(ctx)
	}
	seq, err := m.SnapshotSeq(ctx)
	return seq > 0, err
}

// restart drops what was fetched ahead and makes the consumer again, which
// restores the newest snapshot first when a repair is due.
func (f *Follower) restart(ctx context.Context) error {
	f.dropAhead()
	f.cons = nil
	_, err := f.consumer(ctx)
	return err
}

// RepairDue reports whether a checkpoint found the mirror diverged and its
// repair from the newest snapshot has not been made yet.
func (f *Follower) RepairDue() bool { return f.repair }

// Forfeiting is a mirror that can give up the events it recorded while
// its replica led and never published.
type Forfeiting interface {
	DropUnpublished(ctx context.Context) (n int, first, last int64, err error)
}

// Unpublished is how many events the mirror recorded and never published,
// as far as it can tell; 0 when it cannot.
func (f *Follower) Unpublished(ctx context.Context) int {
	m, ok := f.mirror.(Positioned)
	if !ok {
		return 0
	}
	_, n, err := m.StreamPosition(ctx)
	if err != nil {
		return 0
	}
	return n
}

// Forfeit is called when another replica leads and Run is not running:
// the events this mirror recorded while its replica led, and never
// published, are dropped (the new leader records those changes again from
// its own crawl, under its own ids and times), and the mirror, which
// reflects them, is repaired from the newest snapshot before it follows
// on. Kept, they would never reach the stream, and the mirror, with
// events the stream does not hold, could never be compared with a
// checkpoint: it would stay different from the leader's unnoticed.
func (f *Follower) Forfeit(ctx context.Context, leader string) error {
	m, ok := f.mirror.(Forfeiting)
	if !ok {
		return nil
	}
	n, first, last, err := m.DropUnpublished(ctx)
	if err != nil || n == 0 {
		return err
	}
	_, restorable := f.mirror.(Restorable)
	repair := restorable && f.cfg.SnapshotBucket != ""
	f.log.Warn(
		"another replica leads: dropped the events this replica recorded while it led and never published; the new leader records those changes again",
		"leader",
		leader,
		"events",
		n,
		"first_seq",
		first,
		"last_seq",
		last,
		"repair_from_snapshot",
		repair,
	)
	if repair {
		f.repair = true
		f.dropAhead()
		f.cons = nil
	}
	return nil
}

// CatchUp applies what the stream holds until nothing is pending, so that a
// standby about to lead has every event the old leader published.
func (f *Follower) CatchUp(ctx context.Context) error {
	defer f.dropAhead()
	for {
		_, pending, err := f.fetch(ctx, true)
		if err != nil {
			return err
		}
		if pending == 0 {
			return f.catchUpTail(ctx)
		}
	}
}

// catchUpTail applies the stream's last messages when the consumer has
// none pending but the mirror lacks them: delivered, and lost on their
// way (see withMissing), with nothing after them to show the gap.
func (f *Follower) catchUpTail(ctx context.Context) error {
	if f.next == 0 {
		return nil
	}
	stream, err := f.js.Stream(ctx, f.cfg.Stream)
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", f.cfg.Stream, err)
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return fmt.Errorf("stream %s info: %w", f.cfg.Stream, err)
	}
	return f.applyThrough(ctx, info.State.LastSeq)
}

// applyThrough applies the events of the stream's sequences from the one
// after the last applied through last, read from the stream directly, and
// moves the position past last. A gap of maxMissing or more is left to
// the consumer.
func (f *Follower) applyThrough(ctx context.Context, last uint64) error {
	if f.next == 0 || last < f.next || last-f.next >= maxMissing {
		return nil
	}
	evs, checks, err := f.readRange(ctx, f.next, last)
	if err != nil {
		return err
	}
	applied, rejected, err := f.applyChecked(ctx, evs, checks)
	if err != nil {
		return err
	}
	f.reject(rejected, nil)
	if applied > 0 {
		f.log.Info("events the consumer skipped were read from the stream", "from", f.next, "to", last, "events", applied)
	}
	f.next = last + 1
	return nil
}

// consumerGone reports whether a fetch's err says that its consumer no
// longer exists: deleted (by an operator, or with its stream, which NATS
// can lose whole). A fetch nobody answered (as during the election of
// the consumer's leader too) counts only if the server says the
// consumer is not there.
func (f *Follower) consumerGone(ctx context.Context, err error) bool {
	if errors.Is(err, jetstream.ErrConsumerDeleted) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return true
	}
	if !errors.Is(err, nats.ErrNoResponders) {
		return false
	}
	_, err = f.js.Consumer(ctx, f.cfg.Stream, f.cfg.Consumer)
	return errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrStreamNotFound)
}

// gapBefore reports whether the consumer skipped messages before the
// stream sequence first (0: not known) that the follower has not read.
func (f *Follower) gapBefore(first uint64) bool {
	return f.next > 0 && first > f.next
}

// fetch applies one batch and returns how many events it applied and how
// many messages are still pending. catchingUp: a consumer with nothing
// pending is not fetched from, since a fetch with nothing to
// deliver comes back only after MaxWait (1 s by default), a wait a
// catch-up that ends there (a promotion, a restored mirror's start) does
// not need.
//
// While the consumer has more pending, the next batch is fetched before
// this one is applied, so that fetching and applying overlap. A fetch while
// messages are pending does not wait for a full batch: the last batch of a
// catch-up would otherwise wait out MaxWait.
func (f *Follower) fetch(ctx context.Context, catchingUp bool) (int, uint64, error) {
	if !f.retryRepairAt.IsZero() && time.Now().After(f.retryRepairAt) && f.Diverged() {
		// The first snapshot may exist by now (a follower that joined
		// before it differs at the first checkpoint, and the next may be
		// a while away).
		f.retryRepairAt, f.repair = time.Time{}, true
		f.dropAhead()
		f.cons = nil
	}
	cons, err := f.consumer(ctx)
	if err != nil {
		return 0, 0, err
	}
	if err := f.deferIndexes(ctx); err != nil {
		return 0, 0, err
	}
	b := f.ahead
	f.ahead = nil
	pending := f.lag.Load()
	if b == nil && catchingUp {
		info, err := cons.Info(ctx)
		if err != nil {
			return 0, pending, fmt.Errorf("consumer %s info: %w", f.cfg.Consumer, err)
		}
		// The fetch asks for what is pending, not a whole batch, which
		// it would wait MaxWait for.
		pending = info.NumPending
		if info.NumPending == 0 {
			// Taken as an empty fetch: what the consumer delivered and
			// never had acknowledged (to a fetch that is gone, as a
			// follower's stopped to lead) is read from the stream below,
			// its checkpoints compared.
			b = &pulled{done: make(chan struct{})}
			close(b.done)
		}
	}
	if b == nil {
		b = f.pull(ctx, cons, pending)
	}
	if err := b.wait(); err != nil {
		// What did arrive comes again at once, not after the AckWait.
		b.nak()
		if f.consumerGone(ctx, err) {
			// Deleted, or lost with its stream: fetched from again, it
			// would answer nothing forever. The next fetch makes it anew,
			// from where the mirror stands.
			f.dropAhead()
			f.cons, f.lost = nil, true
		}
		return 0, 0, fmt.Errorf("fetch from consumer %s: %w", f.cfg.Consumer, err)
	}
	if b.known && b.pending > 0 {
		f.ahead = f.pull(ctx, cons, b.pending)
	}
	applied := 0
	if len(b.msgs) > 0 {
		var rejected []store.RejectedEvent
		// A batch of control records alone (a new term's markers, a
		// snapshot's record) applies nothing, but the events the consumer
		// skipped before it are read all the same: the position moves
		// past the batch below.
		if len(b.evs) > 0 || len(b.checks) > 0 || f.gapBefore(b.seqs[0]) {
			var err error
			if applied, rejected, err = f.apply(ctx, b); err != nil {
				// Redelivered in order: this batch, then the one fetched
				// ahead of it.
				b.nak()
				f.dropAhead()
				return 0, 0, err
			}
		}
		termed := f.reject(rejected, b)
		for _, m := range b.msgs {
			if termed[m] {
				continue
			}
			if err := m.Ack(); err != nil {
				f.log.Debug("ack failed; the message comes again and changes nothing", "err", err)
			}
		}
		f.next = max(f.next, slices.Max(b.seqs)+1)
		if f.repair {
			// The next fetch restores the newest snapshot first, and
			// follows the stream from after it on a new consumer.
			f.dropAhead()
			f.cons = nil
		}
	}
	if b.maxSeq > 0 {
		// The rejected messages are terminated: none of them is missing.
		// What the consumer skipped before them, in a batch of them alone,
		// is read first.
		if len(b.msgs) == 0 && f.gapBefore(b.minSeq) {
			if err := f.applyThrough(ctx, b.minSeq-1); err != nil {
				return applied, 0, err
			}
		}
		f.next = max(f.next, b.maxSeq+1)
	}
	pending = b.pending
	if !b.known {
		// An empty fetch carries no metadata; ask the consumer.
		info, err := cons.Info(ctx)
		if err != nil {
			return applied, f.lag.Load(), fmt.Errorf("consumer %s info: %w", f.cfg.Consumer, err)
		}
		pending = info.NumPending
		if info.NumAckPending > 0 {
			// Messages the consumer delivered and this follower never
			// received: a fetch whose wait ended as they arrived drops
			// them, and the consumer sends them again only after the
			// AckWait, nothing after them showing the gap (withMissing).
			// Everything received was acknowledged or given back by now.
			if err := f.applyThrough(ctx, info.Delivered.Stream); err != nil {
				return applied, pending, err
			}
		}
	}
	if pending == 0 && f.indexesDeferred && !catchingUp {
		if err := f.buildIndexes(ctx); err != nil {
			return applied, pending, err
		}
	}
	f.lag.Store(pending)
	f.recordLag(pending)
	if f.cfg.OnBatch != nil {
		f.cfg.OnBatch(applied, pending)
	}
	return applied, pending, nil
}

// deferIndexes asks a mirror that can (IndexDeferrer) to go without its
// history indexes, once: only an empty one does.
func (f *Follower) deferIndexes(ctx context.Context) error {
	d, ok := f.mirror.(IndexDeferrer)
	if !ok || f.deferChecked {
		return nil
	}
	deferred, err := d.DeferIndexesForCatchUp(ctx)
	if err != nil {
		return err
	}
	f.deferChecked, f.indexesDeferred = true, deferred
	return nil
}

// FinishCatchUp builds the history indexes a catch-up from nothing went
// without (IndexDeferrer), if any; CatchUp does not. A promotion's
// catch-up is bounded by the lease's TTL and tried again when it runs out,
// and a build cut short keeps nothing: one that takes longer than the TTL
// (a few million history rows) would start over at every attempt, and the
// replica never lead. A follower that is following builds them itself
// once nothing is pending.
func (f *Follower) FinishCatchUp(ctx context.Context) error {
	if !f.indexesDeferred {
		return nil
	}
	return f.buildIndexes(ctx)
}

// buildIndexes builds the indexes deferIndexes had the mirror go without,
// now that nothing is pending.
func (f *Follower) buildIndexes(ctx context.Context) error {
	start := time.Now()
	if err := f.mirror.(IndexDeferrer).BuildIndexes(ctx); err != nil {
		return err
	}
	f.indexesDeferred = false
	f.log.Info("caught up with the stream: built the history indexes", "took",
		time.Since(start).Round(time.Millisecond).String())
	return nil
}

// apply applies b's events, comparing the mirror with each checkpoint
// among them once the events before it are applied, and returns how many
// events it applied.
func (f *Follower) apply(ctx context.Context, b *pulled) (int, []store.RejectedEvent, error) {
	evs, checks := b.evs, b.checks
	if len(b.seqs) > 0 {
		// A batch of checkpoints alone needs the events skipped before it
		// too, or it is compared without them.
		missing, gapChecks, err := f.withMissing(ctx, b)
		if err != nil {
			return 0, nil, err
		}
		// The gap read from the stream comes before b's first event.
		evs, checks = append(missing, b.evs...), gapChecks
		for _, c := range b.checks {
			c.at += len(missing)
			checks = append(checks, c)
		}
	}
	return f.applyChecked(ctx, evs, checks)
}

// applyChecked applies evs, comparing the mirror with each of checks once
// the events before it (its at) are applied, and returns how many events
// it applied and those it set aside.
func (f *Follower) applyChecked(ctx context.Context, evs []store.StreamEvent, checks []pendingCheck) (
	int, []store.RejectedEvent, error) {
	applied, from := 0, 0
	var rejected []store.RejectedEvent
	for _, c := range checks {
		res, err := f.applyEvents(ctx, evs[from:c.at])
		applied, rejected = applied+res.Applied, append(rejected, res.Rejected...)
		if err != nil {
			return applied, rejected, err
		}
		from = c.at
		if err := f.compare(ctx, c); err != nil {
			return applied, rejected, err
		}
	}
	res, err := f.applyEvents(ctx, evs[from:])
	return applied + res.Applied, append(rejected, res.Rejected...), err
}

func (f *Follower) applyEvents(ctx context.Context, evs []store.StreamEvent) (store.StreamResult, error) {
	if len(evs) == 0 {
		return store.StreamResult{}, nil
	}
	return f.mirror.ApplyStream(ctx, evs)
}

// reject sets aside the events the mirror could not apply: each is
// logged with its stream sequence and why, counted, and its message, when
// it is one of b's, terminated, never to come again (a redelivery would
// fail the same way, for ever). It returns the messages it terminated.
// An event read from the stream directly (see withMissing) has no message
// here: it is terminated when the consumer delivers it.
func (f *Follower) reject(rejected []store.RejectedEvent, b *pulled) map[jetstream.Msg]bool {
	if len(rejected) == 0 {
		return nil
	}
	bySeq := map[uint64]jetstream.Msg{}
	if b != nil {
		for i, m := range b.msgs {
			if b.seqs[i] > 0 {
				bySeq[b.seqs[i]] = m
			}
		}
	}
	termed := map[jetstream.Msg]bool{}
	for _, r := range rejected {
		m, ok := bySeq[r.Event.Seq]
		if !ok || r.Event.Seq == 0 {
			f.log.Debug(
				"an event read from the stream cannot be applied; set aside when the consumer delivers it",
				"stream_seq",
				r.Event.Seq,
				"err",
				r.Err,
			)
			continue
		}
		reason := RejectApply
		if errors.Is(r.Err, store.ErrUnknownPosition) {
			reason = RejectPosition
		}
		f.log.Warn("an event on the stream cannot be applied; set aside, never to be retried", "stream_seq", r.Event.Seq,
			"reason", reason, "type", r.Event.Type, "id", r.Event.ID, "err", r.Err)
		f.cfg.OnReject(reason)
		if err := m.TermWithReason("syncd: " + reason); err != nil {
			f.log.Warn(
				"terminate a message set aside; it may come again and be set aside again",
				"stream_seq",
				r.Event.Seq,
				"err",
				err,
			)
		}
		termed[m] = true
	}
	return termed
}

// compare compares the mirror, which holds every event before c on the
// stream, with c's digest: a difference marks the mirror diverged, to be
// repaired from the newest snapshot, and a match clears a divergence.
// A checkpoint tells nothing about a mirror that reflects later messages
// already (a redelivery after a crash, a restored snapshot, a standby
// that led: its stream position is at or past c), nor about one with
// events of its own the stream does not hold yet (an old leader's
// outbox): such a checkpoint is passed over.
func (f *Follower) compare(ctx context.Context, c pendingCheck) error {
	if m, ok := f.mirror.(Positioned); ok {
		pos, pending, err := m.StreamPosition(ctx)
		if err != nil {
			return err
		}
		defer func() {
			if err := m.SetStreamSeq(ctx, c.seq); err != nil {
				f.log.Warn("record the stream position", "err", err)
			}
		}()
		if pos >= c.seq || pending > 0 {
			f.log.Debug(
				"a checkpoint this mirror cannot be compared at",
				"stream_seq",
				c.seq,
				"position",
				pos,
				"unpublished",
				pending,
			)
			return nil
		}
	}
	want, err := c.cp.ReplicaDigest()
	if err != nil {
		return nil // DecodeCheckpoint checked it
	}
	have, err := f.mirror.ReplicaDigest(ctx)
	if err != nil {
		return err
	}
	res := CheckpointResult{Seq: c.seq, Leader: c.cp.Leader, Time: c.cp.Time, Diff: have.Diff(want)}
	f.checked.Store(&res)
	f.recordCheckpoint(res)
	if res.Diff == "" {
		f.complete.Store(true)
		if f.diverged.Swap(nil) != nil {
			f.log.Info("the mirror matches the leader's checkpoint again", "stream_seq", c.seq)
		}
		return nil
	}
	why := fmt.Sprintf(
		"the mirror differs from the leader's checkpoint at stream sequence %d, first in table %s",
		c.seq,
		res.Diff,
	)
	f.diverged.Store(&why)
	f.log.Error("the mirror diverged from the leader's; repairing it from the newest snapshot", "stream_seq", c.seq,
		"table", res.Diff, "leader", c.cp.Leader)
	switch {
	case f.cfg.SnapshotBucket == "":
	case time.Since(f.lastRepair) < minRepairInterval:
		// A mirror that differs again right after a repair, or a stream
		// of checkpoints it cannot match, must not cost a restore each.
		f.log.Warn(
			"the mirror differs again within "+minRepairInterval.String()+" of its last repair; repairing it later",
			"stream_seq",
			c.seq,
		)
	default:
		f.repair = true
	}
	return nil
}

// minRepairInterval is the least time between two repairs; repairRetry
// the time before a repair that found no snapshot is tried again.
const (
	minRepairInterval = time.Minute
	repairRetry       = 5 * time.Second
)

// recordCheckpoint records res in Meta, where "syncd status" reads it.
func (f *Follower) recordCheckpoint(res CheckpointResult) {
	if f.cfg.Meta == nil {
		return
	}
	result := "match"
	if res.Diff != "" {
		result = "differs: " + res.Diff
	}
	for k, v := range map[string]string{"checkpoint_seq": strconv.FormatUint(res.Seq, 10), "checkpoint_result": result,
		"checkpoint_time": store.FormatTime(res.Time)} {
		if err := f.cfg.Meta.SetMeta(context.Background(), k, v); err != nil {
			f.log.Warn("record the checkpoint compared", "err", err)
		}
	}
}

// pull starts fetching a batch of at most MaxBytes: when messages are
// pending it asks for no more than those, which the server has at once,
// otherwise it waits up to MaxWait for a full batch. (A fetch without
// waiting takes no byte limit.) The messages are collected and decoded on
// a goroutine of their own, beside the batch being applied.
func (f *Follower) pull(ctx context.Context, cons jetstream.Consumer, pending uint64) *pulled {
	b := &pulled{done: make(chan struct{})}
	if err := ctx.Err(); err != nil {
		// Stopping (or a catch-up's time is up): a fetch sent now would
		// be delivered to nobody, its messages held until they were naked.
		b.err = err
		close(b.done)
		return b
	}
	n := f.cfg.Batch
	if pending > 0 {
		n = int(min(pending, uint64(n)))
	}
	// The server bounds the wait (FetchMaxWait): it ends the request after
	// MaxWait, behind the messages it sent, so that none is dropped on its
	// way. A fetch ended by the client's context instead (FetchContext)
	// dropped those still coming: a batch that took longer than MaxWait to
	// arrive (a slow link, a busy machine, a large batch) lost its tail
	// every time, to be read again from the stream a message at a time.
	// The context only gives up a batch that ends neither way
	// (publish.Fetched), and ends the collecting at shutdown.
	fctx, cancel := context.WithTimeout(ctx, f.cfg.MaxWait)
	batch, err := cons.Fetch(n, jetstream.FetchMaxWait(f.cfg.MaxWait), jetstream.FetchMaxBytes(f.cfg.MaxBytes))
	b.err = err
	go func() {
		defer close(b.done)
		defer cancel()
		if b.err == nil {
			b.err = b.collect(fctx, batch, f)
		}
	}()
	return b
}

// maxMissing bounds the events withMissing reads from the stream itself;
// a longer gap is left to the consumer's redelivery.
const maxMissing = 10_000

// withMissing returns b's events after those the consumer skipped: the
// messages between the last one applied and b's first. A message the
// consumer delivered but this follower never received (its fetch lost to
// a stream leader's failure) comes again only after the AckWait, after the
// messages that followed it, and not at all before a promotion's catch-up
// ends; so the gap is read from the stream directly, in order. The
// message, when it comes again, changes nothing: its event is applied.
func (f *Follower) withMissing(ctx context.Context, b *pulled) ([]store.StreamEvent, []pendingCheck, error) {
	first := b.seqs[0]
	if f.next == 0 || first <= f.next || first-f.next > maxMissing {
		return nil, nil, nil
	}
	missing, checks, err := f.readRange(ctx, f.next, first-1)
	if err != nil {
		return nil, nil, err
	}
	if len(missing) > 0 {
		f.log.Info(
			"events the consumer skipped were read from the stream",
			"from",
			f.next,
			"to",
			first-1,
			"events",
			len(missing),
		)
	}
	return missing, checks, nil
}

// readRange reads the syncd events of the stream's sequences from..to,
// and its checkpoints, each at the events before it.
func (f *Follower) readRange(ctx context.Context, from, to uint64) ([]store.StreamEvent, []pendingCheck, error) {
	stream, err := f.js.Stream(ctx, f.cfg.Stream)
	if err != nil {
		return nil, nil, fmt.Errorf("look up stream %s: %w", f.cfg.Stream, err)
	}
	// Each read is of the first syncd message at or after seq, so that the
	// messages of other subjects a shared stream holds are not read.
	subject := f.cfg.SubjectPrefix + ".>"
	var evs []store.StreamEvent
	var checks []pendingCheck
	for seq := from; seq <= to; {
		m, err := stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return nil, nil, fmt.Errorf("read stream %s from message %d: %w", f.cfg.Stream, seq, err)
		}
		if m.Sequence > to {
			break
		}
		seq = m.Sequence + 1
		checkpoint := m.Subject == publish.CheckpointSubject(f.cfg.SubjectPrefix)
		if publish.Reserved(f.cfg.SubjectPrefix, m.Subject) && !checkpoint {
			continue // term markers and snapshot records apply nothing
		}
		if err := f.verify(m.Subject, m.Header, m.Data); err != nil {
			// Counted now: the consumer's delivery of it was lost, and
			// comes again only after the AckWait (it terminates it then).
			f.rejectUnsigned(m.Sequence, m.Subject, err)
			continue
		}
		if checkpoint {
			// Compared where it stands, as one the consumer delivered:
			// read here, it was lost on its way (a promotion's catch-up
			// that read the stream's tail went without comparing it).
			if cp, err := publish.DecodeCheckpoint(m.Data); err == nil {
				checks = append(checks, pendingCheck{at: len(evs), seq: m.Sequence, cp: cp})
			}
			continue
		}
		ev, err := publish.Decode(m.Data)
		if err != nil {
			continue // the consumer terminates it when it comes
		}
		ev.Seq, ev.Stored = m.Sequence, m.Time
		evs = append(evs, ev)
	}
	return evs, checks, nil
}

// dropAhead gives back the batch fetched ahead, if any, for redelivery.
func (f *Follower) dropAhead() {
	if f.ahead == nil {
		return
	}
	b := f.ahead
	f.ahead = nil
	b.wait() // what arrived before an error comes again too
	b.nak()
}

// pulled is a fetch under way, and once done, its messages.
type pulled struct {
	done chan struct{}
	err  error

	msgs []jetstream.Msg
	evs  []store.StreamEvent
	seqs []uint64 // the messages' stream sequences (0: not known)
	// checks are the batch's checkpoints, each after the events before it.
	checks []pendingCheck
	// pending is what the consumer had pending after the last message;
	// known: there was a message to tell.
	pending uint64
	known   bool
	// minSeq and maxSeq are the lowest and highest stream sequences of the
	// messages rejected for their signature (0: none).
	minSeq, maxSeq uint64
}

// wait waits for the fetch to end and returns its error.
func (b *pulled) wait() error {
	<-b.done
	return b.err
}

// fetchGrace is how long a fetch's messages may go on after its context
// ended before the fetch is given up (errFetchStuck).
var fetchGrace = 2 * time.Second

// errFetchStuck is a fetch whose messages did not end with its context
// (publish.Fetched); the next fetch reads a gap the messages not taken
// leave from the stream itself (withMissing).
var errFetchStuck = errors.New("the fetch's messages did not end with its context")

// pendingCheck is a checkpoint of a batch: at is how many of the batch's
// events come before it, seq its stream sequence.
type pendingCheck struct {
	at  int
	seq uint64
	cp  publish.Checkpoint
}

// collect takes the batch's messages, decoding them; a message that is not
// a syncd event or checkpoint, or not signed by the leader when f verifies
// signatures, is terminated, never to come again.
func (b *pulled) collect(ctx context.Context, batch jetstream.MessageBatch, f *Follower) error {
	log, onReject := f.log, f.cfg.OnReject
	stuck := false
	defer func() {
		if stuck {
			log.Warn("a fetch did not end with its context; fetching again", "grace", fetchGrace.String())
		}
	}()
	for m := range publish.Fetched(ctx, batch, fetchGrace, &stuck) {
		var seq uint64
		var stored time.Time
		if md, err := m.Metadata(); err == nil {
			b.pending, b.known, seq, stored = md.NumPending, true, md.Sequence.Stream, md.Timestamp
		}
		checkpoint := m.Subject() == publish.CheckpointSubject(f.cfg.SubjectPrefix)
		if !checkpoint && publish.Reserved(f.cfg.SubjectPrefix, m.Subject()) {
			// A lease term's marker or a snapshot's record: nothing to
			// apply, so nothing to verify (the leader does not sign
			// them); acknowledged with the batch.
			b.msgs, b.seqs = append(b.msgs, m), append(b.seqs, seq)
			continue
		}
		if err := f.verify(m.Subject(), m.Headers(), m.Data()); err != nil {
			f.rejectUnsigned(seq, m.Subject(), err)
			b.maxSeq = max(b.maxSeq, seq)
			if b.minSeq == 0 || seq < b.minSeq {
				b.minSeq = seq
			}
			if err := m.TermWithReason("syncd: " + signing.Reason(err)); err != nil {
				log.Warn("terminate rejected message", "err", err)
			}
			continue
		}
		if checkpoint {
			cp, err := publish.DecodeCheckpoint(m.Data())
			if err != nil || seq == 0 {
				log.Warn("not a syncd checkpoint; set aside, never to be retried", "stream_seq", seq, "subject", m.Subject(),
					"reason", RejectDecode, "err", err)
				onReject(RejectDecode)
				if err := m.TermWithReason("syncd: " + RejectDecode); err != nil {
					log.Warn("terminate undecodable message", "err", err)
				}
				continue
			}
			b.checks = append(b.checks, pendingCheck{at: len(b.evs), seq: seq, cp: cp})
			b.msgs, b.seqs = append(b.msgs, m), append(b.seqs, seq)
			continue
		}
		ev, err := publish.Decode(m.Data())
		if err != nil {
			// Never redelivered: it would fail the same way forever.
			log.Warn("not a syncd event; set aside, never to be retried", "stream_seq", seq, "subject", m.Subject(),
				"reason", RejectDecode, "err", err)
			onReject(RejectDecode)
			if err := m.TermWithReason("syncd: " + RejectDecode); err != nil {
				log.Warn("terminate undecodable message", "err", err)
			}
			continue
		}
		ev.Seq, ev.Stored = seq, stored
		ev.Predecode() // here, beside the batch being applied
		b.msgs, b.evs, b.seqs = append(b.msgs, m), append(b.evs, ev), append(b.seqs, seq)
	}
	// A fetch with a byte limit that got its count of messages before its
	// bytes ends with a "409 Batch Completed" status, which the library
	// reports as an error: the batch is whole.
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) &&
		!errors.Is(err, jetstream.ErrNoMessages) &&
		!errors.Is(err, jetstream.ErrBatchCompleted) {
		return err
	}
	if stuck {
		return errFetchStuck
	}
	return nil
}

// rejectSnapshot logs and counts a snapshot passed over for its signature.
func (f *Follower) rejectSnapshot(info SnapshotInfo, err error) {
	reason := signing.Reason(err)
	f.log.Warn("a snapshot not signed by the leader; passing it over", "bucket", f.cfg.SnapshotBucket, "name", info.Name,
		"stream_seq", info.Seq, "reason", reason, "err", err)
	if f.cfg.OnRejected != nil {
		f.cfg.OnRejected(reason)
	}
}

// rejectUnsigned logs and counts the message at stream sequence seq that verify
// rejected, once: the gap reader (readRange) and the consumer may both
// meet it.
func (f *Follower) rejectUnsigned(seq uint64, subject string, err error) {
	f.rejectedMu.Lock()
	_, seen := f.rejected[seq]
	if !seen {
		if f.rejected == nil || len(f.rejected) >= maxRejectedSeen {
			f.rejected = make(map[uint64]struct{}) // at worst one is counted twice
		}
		f.rejected[seq] = struct{}{}
	}
	f.rejectedMu.Unlock()
	if seen {
		return
	}
	reason := signing.Reason(err)
	f.log.Warn("a message on the stream not signed by the leader; rejected it", "stream_seq", seq, "subject", subject,
		"reason", reason, "err", err)
	if f.cfg.OnRejected != nil {
		f.cfg.OnRejected(reason)
	}
}

// maxRejectedSeen bounds the stream sequences of rejected messages a
// follower remembers so as to count each once.
const maxRejectedSeen = 4096

// verify checks a message's signature when the follower has a Verifier.
func (f *Follower) verify(subject string, h nats.Header, data []byte) error {
	if f.cfg.Verifier == nil {
		return nil
	}
	return f.cfg.Verifier.Verify(subject, h, data)
}

// nak asks for the batch's messages again.
func (b *pulled) nak() {
	for _, m := range b.msgs {
		m.Nak()
	}
}

// recordLag records the lag in Meta when it changed.
func (f *Follower) recordLag(pending uint64) {
	if f.cfg.Meta == nil || int64(pending) == f.recorded {
		return
	}
	f.recorded = int64(pending)
	if err := f.cfg.Meta.SetMeta(context.Background(), "follow_lag", strconv.FormatUint(pending, 10)); err != nil {
		f.log.Warn("record follower lag", "err", err)
	}
}

// Applied is the stream sequence of the last message applied; 0: none yet
// in this process. Like next, read it only from Run's or CatchUp's
// goroutine, as OnBatch is called.
func (f *Follower) Applied() uint64 { return max(f.next, 1) - 1 }
