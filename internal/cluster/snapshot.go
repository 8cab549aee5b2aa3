package cluster

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/signing"
	"github.com/syncd-dev/syncd/internal/store"
)

// Snapshots of the mirror in a JetStream Object Store bucket let a follower
// start after the stream has dropped its oldest events: it restores the
// newest snapshot and applies the stream from the sequence after the one
// the snapshot covers.
//
// The sequence a snapshot covers is the stream's last sequence read just
// before the copy of the mirror begins. Every message up to it was
// published before the copy began, and the leader publishes an event only
// after committing it, so the copy reflects all of them (a message from an
// earlier leader that this one did not apply reflects a change its own
// crawl records again, under the same id). The copy may hold more: events
// committed but not yet published. Those reach the stream after the
// sequence, and the follower skips them there by id; the snapshot is put
// only once they have (awaitPublished), so that a leader that dies first
// leaves no snapshot that counts them as published.

// Object metadata keys of a snapshot.
const (
	snapshotSeqKey     = "stream_seq"
	snapshotCreatedKey = "created"
	// snapshotStreamKey is the creation time of the stream whose
	// sequence stream_seq is (store.FormatStreamCreated): a stream
	// created again counts from 1, and a snapshot of the one before
	// covers no place in it.
	snapshotStreamKey = "stream_created"
	snapshotRawKey    = "raw_bytes"
	snapshotPrefix    = "mirror-"
	// snapshotChunk is the object's chunk size: larger than the library's
	// 128 KiB default, for fewer messages, and under NATS's default 1 MiB
	// maximum payload.
	snapshotChunk = 512 << 10
)

// SnapshotSource is what the snapshotter needs of the mirror.
type SnapshotSource interface {
	// Backup writes a consistent copy of the mirror to path.
	Backup(ctx context.Context, path string) error
	InBaseline(ctx context.Context) (bool, error)
	// UnpublishedThrough counts the events up to event sequence seq not
	// published yet.
	UnpublishedThrough(ctx context.Context, seq int64) (int, error)
}

// SnapshotConfig configures a Snapshotter.
type SnapshotConfig struct {
	// Bucket is the Object Store bucket, created with Replicas.
	Bucket   string
	Replicas int
	// Stream is the event stream whose last sequence tags a snapshot.
	Stream string
	// Every is the time between two snapshots.
	Every time.Duration
	// Keep is how many snapshots the bucket keeps: it never holds more
	// (but for Keep 1, while the one snapshot's successor is written).
	Keep int
	// Dir holds the temporary copy of the mirror: beside it, so that the
	// copy is on the same disk and as private. Mirror, the mirror file's
	// name, names the copy's directory, so that Run removes those a crash
	// left of this mirror's and no other's.
	Dir, Mirror string
	// Fence, when set, fences every snapshot by its record on the event
	// stream (publish.Fence.RecordSnapshot): a snapshot whose record the
	// server refused, since another replica leads, is deleted.
	Fence  *publish.Fence
	Logger *slog.Logger
	// Signer, when set, signs each snapshot's manifest (snapshot_sign.go).
	Signer *signing.Signer
	// PublishWait bounds the wait for the events a snapshot's copy holds
	// unpublished to be published before it is put; 0: 30 s.
	PublishWait time.Duration
}

// SnapshotInfo describes the newest snapshot.
type SnapshotInfo struct {
	Name string
	// Seq is the stream sequence the snapshot covers, of the stream
	// created at StreamCreated (zero: not recorded, a snapshot of an
	// older syncd).
	Seq           uint64
	StreamCreated time.Time
	// After is where a follower that restored it follows the stream
	// from: Seq, or 0 when the snapshot is of a stream since created
	// again (the current one is read from its first message).
	After   uint64
	Created time.Time
	// Stored is when the server stored the object: its own clock, which
	// a client cannot set, unlike Created.
	Stored time.Time
	// Bytes is the compressed size, RawBytes the size of the database.
	Bytes, RawBytes int64
	// Took is how long writing it took, or restoring it (checks,
	// download and copy into the mirror); zero when another process wrote
	// it.
	Took time.Duration
	// Download is the part of a restore's Took spent downloading the
	// snapshot and decompressing it to disk.
	Download time.Duration
	// manifest and the signatures are as listed, for verifySnapshot;
	// objectVerified says the compressed object's manifest verified.
	manifest                   manifest
	signature, objectSignature string
	streamSignature            string
	objectVerified             bool
}

// Snapshotter writes snapshots of the mirror on a schedule: a leader duty.
type Snapshotter struct {
	js  jetstream.JetStream
	src SnapshotSource
	cfg SnapshotConfig
	log *slog.Logger

	mu   sync.Mutex
	last SnapshotInfo
}

// NewSnapshotter returns a snapshotter of src into cfg.Bucket.
func NewSnapshotter(js jetstream.JetStream, src SnapshotSource, cfg SnapshotConfig) *Snapshotter {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Keep = max(cfg.Keep, 1)
	return &Snapshotter{js: js, src: src, cfg: cfg, log: cfg.Logger}
}

// Last is the newest snapshot known: written by this process, or found in
// the bucket when Run started; zero before either.
func (s *Snapshotter) Last() SnapshotInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// Run writes a snapshot once the baseline has ended and the newest one in
// the bucket is older than Every, and then every Every, until ctx is done.
// Failures are logged and retried; only ctx ends it, so that a NATS outage
// never stops the leader's other duties.
func (s *Snapshotter) Run(ctx context.Context) error {
	removeStale(s.cfg.Dir, s.tempPrefix(), s.log)
	poll := min(s.cfg.Every, 30*time.Second)
	var obj jetstream.ObjectStore
	next := time.Now()
	for {
		t := time.NewTimer(time.Until(next))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-t.C:
		}
		next = time.Now().Add(poll)
		if obj == nil {
			var err error
			if obj, err = s.bucket(ctx); err != nil {
				s.log.Warn("snapshot bucket unavailable; retrying", "bucket", s.cfg.Bucket, "err", err, "in", poll.String())
				continue
			}
			if err := s.prune(ctx, obj, s.cfg.Keep); err != nil {
				s.log.Warn("delete old snapshots", "err", err)
			}
			if newest, ok, err := s.newest(ctx, obj); err != nil {
				s.log.Warn("list snapshots", "err", err)
			} else if ok {
				s.setLast(newest)
				next = newest.Created.Add(s.cfg.Every)
				continue
			}
		}
		if in, err := s.src.InBaseline(ctx); err != nil || in {
			// A snapshot of part of the organization helps nobody; the
			// first is written as soon as the baseline ends, since a
			// follower gets the baseline's history from it alone.
			next = time.Now().Add(min(poll, time.Second))
			continue
		}
		if s.cfg.Keep > 1 && s.cfg.Fence.InTerm() {
			// Room for the new snapshot first, so that the bucket never
			// holds more than Keep. Deleted after the write, the oldest
			// stayed beside its successor for as long as the listing took
			// (a listing that misses its last entry waits listAttempt),
			// and a bucket sized for Keep snapshots could refuse the
			// write. With Keep 1 the only snapshot stays until its
			// successor is written: a follower starting meanwhile finds it.
			if err := s.prune(ctx, obj, s.cfg.Keep-1); err != nil {
				s.log.Warn("delete old snapshots before writing one", "err", err)
			}
		}
		info, err := s.Write(ctx, obj)
		if ctx.Err() != nil {
			return nil
		}
		if err != nil {
			s.log.Warn("writing a snapshot failed; retrying", "err", err, "in", poll.String())
			continue
		}
		s.log.Info("wrote a snapshot of the mirror", "bucket", s.cfg.Bucket, "name", info.Name, "stream_seq", info.Seq,
			"bytes", info.Bytes, "raw_bytes", info.RawBytes, "took", info.Took.Round(time.Millisecond).String())
		if err := s.prune(ctx, obj, s.cfg.Keep); err != nil {
			s.log.Warn("delete old snapshots", "err", err)
		}
		next = time.Now().Add(s.cfg.Every)
	}
}

// bucket creates the Object Store bucket or updates it to the config.
func (s *Snapshotter) bucket(ctx context.Context) (jetstream.ObjectStore, error) {
	obj, err := s.js.CreateOrUpdateObjectStore(ctx, jetstream.ObjectStoreConfig{Bucket: s.cfg.Bucket,
		Description: "syncd mirror snapshots", Storage: jetstream.FileStorage, Replicas: max(s.cfg.Replicas, 1)})
	if err != nil {
		return nil, fmt.Errorf("create or update object store %s: %w", s.cfg.Bucket, err)
	}
	return obj, nil
}

func (s *Snapshotter) setLast(info SnapshotInfo) {
	s.mu.Lock()
	s.last = info
	s.mu.Unlock()
}

// Write writes one snapshot now into obj (the bucket, when nil).
func (s *Snapshotter) Write(ctx context.Context, obj jetstream.ObjectStore) (SnapshotInfo, error) {
	start := time.Now()
	if !s.cfg.Fence.InTerm() {
		return SnapshotInfo{}, publish.ErrFenced
	}
	if obj == nil {
		var err error
		if obj, err = s.bucket(ctx); err != nil {
			return SnapshotInfo{}, err
		}
	}
	stream, err := s.js.Stream(ctx, s.cfg.Stream)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("look up stream %s: %w", s.cfg.Stream, err)
	}
	si, err := stream.Info(ctx)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("stream %s info: %w", s.cfg.Stream, err)
	}
	seq, streamCreated := si.State.LastSeq, si.Created
	dir, err := os.MkdirTemp(s.cfg.Dir, s.tempPrefix())
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("temporary directory for the snapshot: %w", err)
	}
	defer os.RemoveAll(dir)
	path := filepath.Join(dir, "mirror.db")
	if err := store.CreateEmpty(path); err != nil {
		return SnapshotInfo{}, fmt.Errorf("create the snapshot file: %w", err)
	}
	if err := s.src.Backup(ctx, path); err != nil {
		return SnapshotInfo{}, err
	}
	if err := s.awaitPublished(ctx, path); err != nil {
		return SnapshotInfo{}, err
	}
	f, err := os.Open(path)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("open the snapshot file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("stat the snapshot file: %w", err)
	}
	created := time.Now().UTC()
	name := snapshotPrefix + created.Format("20060102T150405.000Z")
	md := map[string]string{
		snapshotSeqKey:     strconv.FormatUint(seq, 10),
		snapshotStreamKey:  store.FormatStreamCreated(streamCreated),
		snapshotCreatedKey: created.Format(time.RFC3339Nano),
		snapshotRawKey:     strconv.FormatInt(fi.Size(), 10),
	}
	// Compressed to a file beside it first: the signed manifest names the
	// object's digest, which must be known before the Put.
	z, err := os.OpenFile(path+".zst", os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("create the compressed snapshot file: %w", err)
	}
	defer z.Close()
	raw, object := sha256.New(), sha256.New()
	if err := compress(io.MultiWriter(z, object), io.TeeReader(ctxReader{ctx, f}, raw)); err != nil {
		return SnapshotInfo{}, err
	}
	if _, err := z.Seek(0, io.SeekStart); err != nil {
		return SnapshotInfo{}, fmt.Errorf("read the compressed snapshot file: %w", err)
	}
	if s.cfg.Signer != nil {
		signManifest(name, md, hex.EncodeToString(raw.Sum(nil)), jetstream.GetObjectDigestValue(object), s.cfg.Signer)
	}
	oi, err := obj.Put(ctx, jetstream.ObjectMeta{Name: name, Description: "syncd mirror, zstd-compressed SQLite database",
		Metadata: md,
		Opts:     &jetstream.ObjectMetaOptions{ChunkSize: snapshotChunk}}, z)
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("put snapshot %s into %s: %w", name, s.cfg.Bucket, err)
	}
	if want := md[snapshotObjectKey]; want != "" && oi.Digest != want {
		return SnapshotInfo{}, s.unrecorded(ctx, obj, name, fmt.Errorf(
			"snapshot %s: the object store's digest %s is not the compressed file's %s", name, oi.Digest, want))
	}
	if err := s.cfg.Fence.RecordSnapshot(ctx, name, seq); err != nil {
		return SnapshotInfo{}, s.unrecorded(ctx, obj, name, err)
	}
	info := SnapshotInfo{
		Name:          name,
		Seq:           seq,
		StreamCreated: streamCreated,
		Created:       created,
		Bytes:         int64(oi.Size),
		RawBytes:      fi.Size(),
		Took:          time.Since(start),
	}
	s.setLast(info)
	return info, nil
}

// ErrUnpublished is a snapshot not put because events its copy holds were
// not published in time.
var ErrUnpublished = errors.New("the snapshot's copy holds events not published yet")

// awaitPublished waits until every event the copy at path holds in its
// outbox has been published by this mirror, at most PublishWait. A restore
// counts a snapshot's events as published (the leader publishes them after
// the sequence the snapshot covers, and the follower meets them there), so
// a snapshot put before they were would lose them if its leader died first:
// a replica that restored it in a failover took b's unpublished moves as
// published, and they never reached the stream (TestCluster_ThreeNodes,
// once in about fifteen runs).
func (s *Snapshotter) awaitPublished(ctx context.Context, path string) error {
	highest, err := store.OutboxHighest(ctx, path)
	if err != nil || highest == 0 {
		return err
	}
	wait := cmp.Or(s.cfg.PublishWait, 30*time.Second)
	deadline := time.Now().Add(wait)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := s.src.UnpublishedThrough(ctx, highest)
		if err != nil || n == 0 {
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w: %d of them after %s", ErrUnpublished, n, wait)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-tick.C:
		}
	}
}

// tempPrefix begins the name of the directory a snapshot is written in.
func (s *Snapshotter) tempPrefix() string { return ".snapshot-" + safeName(s.cfg.Mirror) + "-" }

// safeName is name with no path separator, for a file name.
func safeName(name string) string { return strings.NewReplacer("/", "_", `\`, "_").Replace(name) }

// removeStale removes the directories in dir (the system's temporary
// directory when "") that os.MkdirTemp made with prefix: prefix and its
// random digits, no more; the temporary files of a write or a restore a
// crash ended.
func removeStale(dir, prefix string, log *slog.Logger) {
	if dir == "" {
		dir = os.TempDir()
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	var removed []string
	for _, e := range entries {
		rest, ok := strings.CutPrefix(e.Name(), prefix)
		if !ok || !e.IsDir() || rest == "" || strings.Trim(rest, "0123456789") != "" {
			continue
		}
		d := filepath.Join(dir, e.Name())
		if err := os.RemoveAll(d); err != nil {
			log.Warn("removing what a crash left", "dir", d, "err", err)
			continue
		}
		removed = append(removed, d)
	}
	if len(removed) > 0 {
		log.Info("removed what writes or restores that did not finish left", "dirs", removed)
	}
}

// unrecorded deletes snapshot name, whose record err kept off the stream:
// written by a replica that may no longer lead, it must not be restored.
func (s *Snapshotter) unrecorded(ctx context.Context, obj jetstream.ObjectStore, name string, err error) error {
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer cancel()
	if derr := obj.Delete(dctx, name); derr != nil {
		return fmt.Errorf("%w; and deleting the unrecorded snapshot failed: %w", err, derr)
	}
	return fmt.Errorf("%w; the snapshot was deleted", err)
}

// ctxReader reads r until ctx ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

// compress writes f to w with zstd.
func compress(w io.Writer, f io.Reader) error {
	enc, err := zstd.NewWriter(w, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		return err
	}
	if _, err := io.Copy(enc, f); err != nil {
		enc.Close()
		return fmt.Errorf("compress the snapshot: %w", err)
	}
	return enc.Close()
}

// prune deletes the snapshots beyond the newest keep. Only plausible
// snapshots count (see plausible): a planted object that claims to be
// newer than all never pushes a genuine one out. The implausible are left
// alone, and logged.
func (s *Snapshotter) prune(ctx context.Context, obj jetstream.ObjectStore, keep int) error {
	all, err := s.plausible(ctx, obj)
	if err != nil {
		return err
	}
	var errs []error
	for _, old := range all[min(keep, len(all)):] {
		if err := obj.Delete(ctx, old.Name); err != nil {
			errs = append(errs, fmt.Errorf("delete snapshot %s: %w", old.Name, err))
		}
	}
	return errors.Join(errs...)
}

// newest is the newest plausible snapshot in obj; false when it has none.
func (s *Snapshotter) newest(ctx context.Context, obj jetstream.ObjectStore) (SnapshotInfo, bool, error) {
	all, err := s.plausible(ctx, obj)
	if err != nil || len(all) == 0 {
		return SnapshotInfo{}, false, err
	}
	return all[0], true, nil
}

// plausible lists obj's plausible snapshots, newest first, and logs the
// others.
func (s *Snapshotter) plausible(ctx context.Context, obj jetstream.ObjectStore) ([]SnapshotInfo, error) {
	all, err := listSnapshots(ctx, obj)
	if err != nil || len(all) == 0 {
		return nil, err
	}
	cur, err := currentStream(ctx, s.js, s.cfg.Stream)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := all[:0:0]
	for _, info := range all {
		if err := plausible(info, now, cur); err != nil {
			s.log.Warn(
				"a snapshot in the bucket is not one this leader can have written; ignoring it",
				"bucket",
				s.cfg.Bucket,
				"name",
				info.Name,
				"err",
				err,
			)
			continue
		}
		out = append(out, info)
	}
	return out, nil
}

// maxSnapshotSkew is how far in the future, by this host's clock, a
// snapshot's created time may be.
const maxSnapshotSkew = time.Minute

// plausible checks what a snapshot's metadata claims, which any client of
// the account can write: created no later than now (within
// maxSnapshotSkew), and a stream sequence the stream has reached, when
// the snapshot is of this stream (cur; see after). A snapshot claiming
// 2099 would otherwise make the leader wait until then for its next one,
// and one claiming a sequence beyond the stream would make a follower skip
// every event up to it.
//
// created is compared with this host's clock, not the server's time of
// storing the object: the leader's own snapshots always pass on the
// leader, whatever the skew between its clock and the server's (they
// failed on each check, the leader wrote one at every poll and pruned
// none). A follower whose clock is behind the leader's by more than
// maxSnapshotSkew passes over the newest snapshots for older ones.
func plausible(info SnapshotInfo, now time.Time, cur streamNow) error {
	switch {
	case info.Created.After(now.Add(maxSnapshotSkew)):
		return fmt.Errorf(
			"snapshot %s claims to be created at %s, in the future",
			info.Name,
			info.Created.Format(time.RFC3339),
		)
	case info.after(cur) > cur.last:
		return fmt.Errorf(
			"snapshot %s claims to cover stream sequence %d, beyond the stream's last, %d",
			info.Name,
			info.Seq,
			cur.last,
		)
	}
	return nil
}

// streamNow is the stream as a snapshot is checked against it: its last
// sequence, and when it was created.
type streamNow struct {
	last    uint64
	created time.Time
}

// currentStream looks stream up.
func currentStream(ctx context.Context, js jetstream.JetStream, stream string) (streamNow, error) {
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return streamNow{}, fmt.Errorf("look up stream %s: %w", stream, err)
	}
	si, err := st.Info(ctx)
	if err != nil {
		return streamNow{}, fmt.Errorf("stream %s info: %w", stream, err)
	}
	return streamNow{last: si.State.LastSeq, created: si.Created}, nil
}

// after is where a follower that restores info follows cur from: the
// sequence the snapshot covers, or 0 when the snapshot is of another
// stream of the same name, which cur counts nothing of (NATS lost the
// stream whole, or an operator deleted it, and it was created again).
// A snapshot whose stream is not recorded (written by an older syncd, or
// its metadata stripped) is taken for cur's unless it was created before
// cur was, or within maxSnapshotSkew after: its time is the writer's
// clock, cur's the server's, and the margin makes a skew between them err
// towards reading cur from its start, which only costs time.
func (info SnapshotInfo) after(cur streamNow) uint64 {
	switch {
	case cur.created.IsZero():
		return info.Seq
	case !info.StreamCreated.IsZero() && !info.StreamCreated.Equal(cur.created):
		return 0
	case info.StreamCreated.IsZero() && info.Created.Before(cur.created.Add(maxSnapshotSkew)):
		return 0
	}
	return info.Seq
}

// listSnapshots lists the bucket's snapshots, newest first by the
// server's time of storing them.
func listSnapshots(ctx context.Context, obj jetstream.ObjectStore) ([]SnapshotInfo, error) {
	// An empty bucket is not listed. A listing learns that a bucket has
	// no object from a lookup that a just-created replicated bucket may
	// not answer (no responders yet): it then waited its whole deadline
	// (listAttempt), and a new leader's first snapshot with it, so that a
	// standby started meanwhile found none. The bucket's size comes from
	// its stream's leader.
	if st, err := obj.Status(ctx); err == nil && st.Size() == 0 {
		return nil, nil
	}
	objs, err := listObjects(ctx, obj)
	if errors.Is(err, jetstream.ErrNoObjectsFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list snapshots: %w", err)
	}
	var out []SnapshotInfo
	for _, o := range objs {
		if !strings.HasPrefix(o.Name, snapshotPrefix) || o.Deleted {
			continue
		}
		info := SnapshotInfo{
			Name:            o.Name,
			Bytes:           int64(o.Size),
			Created:         o.ModTime,
			Stored:          o.ModTime,
			manifest:        manifestOf(o),
			signature:       o.Metadata[snapshotSigKey],
			objectSignature: o.Metadata[snapshotObjectSigKey],
			streamSignature: o.Metadata[snapshotStreamSigKey],
		}
		info.Seq, _ = strconv.ParseUint(o.Metadata[snapshotSeqKey], 10, 64)
		if t, err := time.Parse(time.RFC3339Nano, o.Metadata[snapshotStreamKey]); err == nil {
			info.StreamCreated = t
		}
		info.RawBytes, _ = strconv.ParseInt(o.Metadata[snapshotRawKey], 10, 64)
		if t, err := time.Parse(time.RFC3339Nano, o.Metadata[snapshotCreatedKey]); err == nil {
			info.Created = t
		}
		out = append(out, info)
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].Stored.After(out[j].Stored) })
	return out, nil
}

// listAttempt bounds one listing of a bucket. A listing is a watcher that
// returns once it has been handed the last object's entry, and it can miss
// that hand-over (a test saw one wait 8 minutes while a snapshot was
// deleted beside it): so each attempt has a deadline, and a fresh watcher
// tries again.
var listAttempt = 10 * time.Second

const listAttempts = 3

// listObjects lists obj's objects, listAttempts times at most.
func listObjects(ctx context.Context, obj jetstream.ObjectStore) ([]*jetstream.ObjectInfo, error) {
	var err error
	for range listAttempts {
		actx, cancel := context.WithTimeout(ctx, listAttempt)
		var objs []*jetstream.ObjectInfo
		objs, err = obj.List(actx)
		cancel()
		if !errors.Is(err, context.DeadlineExceeded) || ctx.Err() != nil {
			return objs, err
		}
	}
	return nil, fmt.Errorf("no answer in %d attempts of %s: %w", listAttempts, listAttempt, err)
}

// Restorable is what a follower needs of a mirror to start it from a
// snapshot.
type Restorable interface {
	Empty(ctx context.Context) (bool, error)
	Restore(ctx context.Context, path string, at store.SnapshotAt, from store.Provenance) error
	SnapshotSeq(ctx context.Context) (uint64, error)
}

// The follower finds Restorable by a type assertion: a change of the
// store's methods must fail here, not leave followers without restores.
var _ Restorable = (*store.Store)(nil)

// AdoptSnapshot makes the newest snapshot of cfg.SnapshotBucket that
// passes its checks, signed by one of cfg.Verifier's keys, the mirror file
// at path, which does not exist yet (store.AdoptFile): a new follower's
// quickest start, before it opens its mirror. opts are the options the
// mirror will be opened with. found is false when nothing was adopted:
// cfg says not to (no bucket, no Verifier, RestoreNever), or the bucket
// holds no snapshot that passed; the follower then starts from an empty
// mirror, as it would have. Set the result as cfg.Adopted of the
// mirror's Follower.
func AdoptSnapshot(
	ctx context.Context,
	js jetstream.JetStream,
	cfg FollowerConfig,
	path string,
	opts store.Options,
) (_ SnapshotInfo, found bool, _ error) {
	if cfg.SnapshotBucket == "" || cfg.Verifier == nil || cfg.Restore == RestoreNever {
		return SnapshotInfo{}, false, nil
	}
	if cfg.SnapshotDir == "" {
		cfg.SnapshotDir = filepath.Dir(path) // the rename's
	}
	info, found, _, err := NewFollower(js, nil, cfg).restorer().restore(ctx, fileAdopter{path: path, opts: opts})
	return info, found, err
}

// fileAdopter is the Restorable of a mirror that does not exist yet: a
// restore makes the snapshot its file.
type fileAdopter struct {
	path string
	opts store.Options
}

func (fileAdopter) Empty(context.Context) (bool, error)         { return true, nil }
func (fileAdopter) SnapshotSeq(context.Context) (uint64, error) { return 0, nil }

func (a fileAdopter) Restore(ctx context.Context, snap string, at store.SnapshotAt, from store.Provenance) error {
	if from != store.Verified {
		return errors.New("only a snapshot verified as the leader's is adopted as the mirror's file")
	}
	err := store.AdoptFile(ctx, snap, a.path, at, a.opts)
	if err != nil && !errors.Is(err, store.ErrBadSnapshot) {
		// Not the snapshot's failure (a full disk, a rename across
		// devices): an older one would fail the same way.
		return fmt.Errorf("%w: %w", errAdoptFile, err)
	}
	return err
}

// errAdoptFile marks a failure of AdoptFile that is not the snapshot's.
var errAdoptFile = errors.New("the snapshot could not become the mirror's file")

// RestoreMode says when a follower starts its mirror from a snapshot.
type RestoreMode int

const (
	// RestoreWhenEmpty restores the newest snapshot into an empty mirror,
	// and follows the stream from its start when the bucket has none.
	RestoreWhenEmpty RestoreMode = iota
	// RestoreNever follows the stream from its start.
	RestoreNever
	// RestoreAlways replaces the mirror's contents with the newest
	// snapshot, and fails when the bucket has none.
	RestoreAlways
)

// restorer restores a mirror from the newest snapshot that passes every
// check, trying older ones after one that fails.
type restorer struct {
	js     jetstream.JetStream
	bucket string
	stream string
	// prefix is the event stream's subject prefix, under which the
	// snapshots' records are ("" for none: see recorded).
	prefix string
	// dir holds the download.
	dir string
	// maxBytes bounds a download's decompressed size; 0: maxRestoreRatio
	// times the object's size, at least minRestoreBound.
	maxBytes int64
	log      *slog.Logger
	onReject func(reason string)
	// consumer is the follower's consumer, which names its downloads.
	consumer string
	// verifier, when set, is the leader's keys: a snapshot whose manifest
	// is not signed by one of them is passed over (onUnsigned is told),
	// and a download must match its signed SHA-256.
	verifier   *signing.Verifier
	onUnsigned func(SnapshotInfo, error)
}

// Decompression bounds: the size a snapshot may decompress to when none
// is configured, and the zstd decoder's window (the writer's is 8 MiB).
const (
	maxRestoreRatio  = 64
	minRestoreBound  = 256 << 20
	maxRestoreWindow = 32 << 20
)

// errSnapshotRefused marks a snapshot's own failure: the next older one is
// tried.
var errSnapshotRefused = errors.New("snapshot refused")

// restore downloads the newest snapshot that passes its checks, restores
// it into m and returns it; false when the bucket has none, or none
// passed (refused says how many were refused: the follower then follows
// the stream from its start). A snapshot that fails a check (plausible
// metadata, a bounded download, store.CheckSnapshot, the restore itself)
// is logged, counted and passed over for the next older one.
func (r restorer) restore(ctx context.Context, m Restorable) (_ SnapshotInfo, found bool, refused int, _ error) {
	// A crash in a restore left its download behind.
	removeStale(r.dir, r.tempPrefix(), r.log)
	obj, err := r.js.ObjectStore(ctx, r.bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return SnapshotInfo{}, false, 0, nil
	}
	if err != nil {
		return SnapshotInfo{}, false, 0, fmt.Errorf("look up snapshot bucket %s: %w", r.bucket, err)
	}
	all, err := listSnapshots(ctx, obj)
	if err != nil || len(all) == 0 {
		return SnapshotInfo{}, false, 0, err
	}
	cur, err := currentStream(ctx, r.js, r.stream)
	if err != nil {
		return SnapshotInfo{}, false, 0, err
	}
	records, err := r.records(ctx)
	if err != nil {
		return SnapshotInfo{}, false, 0, err
	}
	for _, info := range all {
		if r.verifier != nil {
			var err error
			if info.objectVerified, err = verifySnapshot(r.verifier, info); err != nil {
				r.onUnsigned(info, err)
				refused++
				continue
			}
		}
		start := time.Now()
		err := plausible(info, start, cur)
		if err == nil && records != nil {
			err = records.check(ctx, info)
		}
		info.After = info.after(cur)
		if err != nil {
			err = fmt.Errorf("%w: %w", errSnapshotRefused, err)
		} else if info.Download, err = r.restoreOne(ctx, obj, info, cur, m); err == nil {
			info.Took = time.Since(start)
			return info, true, refused, nil
		}
		if ctx.Err() != nil || !errors.Is(err, errSnapshotRefused) {
			return SnapshotInfo{}, false, refused, err
		}
		r.log.Warn(
			"a snapshot failed its checks; trying the next older one",
			"bucket",
			r.bucket,
			"name",
			info.Name,
			"reason",
			RejectSnapshot,
			"err",
			err,
		)
		r.onReject(RejectSnapshot)
		refused++
	}
	r.log.Error("no snapshot in the bucket passed its checks", "bucket", r.bucket, "snapshots", len(all))
	return SnapshotInfo{}, false, refused, nil
}

// tempPrefix begins the name of a directory that holds a download, one
// of this follower's (its consumer's name): a crash leaves it, and the next
// restore removes it (another follower's beside it is left alone).
func (r restorer) tempPrefix() string {
	return ".restore-" + safeName(r.consumer) + "-"
}

// snapshotRecords finds the records of snapshots on the event stream: a
// fenced leader publishes one after each snapshot it writes, in its lease
// term (publish.Fence.RecordSnapshot).
type snapshotRecords struct {
	stream  jetstream.Stream
	subject string
}

// maxRecordsScanned bounds the records read to find one snapshot's: the
// leader records each snapshot soon after the sequence it covers, and
// keeps only a few.
const maxRecordsScanned = 64

// records returns the finder of the stream's snapshot records; nil when
// the stream holds none (single mode writes none, and an unfenced leader
// before fencing wrote none), and then snapshots are not checked for one.
func (r restorer) records(ctx context.Context) (*snapshotRecords, error) {
	if r.prefix == "" {
		return nil, nil
	}
	st, err := r.js.Stream(ctx, r.stream)
	if err != nil {
		return nil, fmt.Errorf("look up stream %s: %w", r.stream, err)
	}
	subject := r.prefix + "." + publish.SnapshotToken
	if _, err := st.GetLastMsgForSubject(ctx, subject); errors.Is(err, jetstream.ErrMsgNotFound) {
		return nil, nil
	} else if err != nil {
		return nil, fmt.Errorf("read the snapshot records of stream %s: %w", r.stream, err)
	}
	return &snapshotRecords{stream: st, subject: subject}, nil
}

// check refuses a snapshot without its record on the stream after the
// sequence it covers: one whose record was refused (a deposed leader's,
// which also deletes it), or whose lease term's writes the stream lost
// (nats-server lost acknowledged writes in a minority partition:
// docs/cluster.md); restoring it would put events the stream does not hold
// into the mirror.
func (rs *snapshotRecords) check(ctx context.Context, info SnapshotInfo) error {
	seq := info.Seq + 1
	for range maxRecordsScanned {
		m, err := rs.stream.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(rs.subject))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the record of snapshot %s: %w", info.Name, err)
		}
		if rec, ok := decodeSnapshotRecord(m.Data); ok && rec.Name == info.Name {
			return nil
		}
		seq = m.Sequence + 1
	}
	return fmt.Errorf("%w: snapshot %s has no record on the stream after sequence %d: written outside a lease term, "+
		"or in one whose writes the stream no longer holds", errSnapshotRefused, info.Name, info.Seq)
}

// decodeSnapshotRecord reads a snapshot record's CloudEvent.
func decodeSnapshotRecord(data []byte) (publish.SnapshotRecord, bool) {
	var ce struct {
		Type string                 `json:"type"`
		Data publish.SnapshotRecord `json:"data"`
	}
	if err := json.Unmarshal(data, &ce); err != nil || ce.Type != publish.SnapshotType {
		return publish.SnapshotRecord{}, false
	}
	return ce.Data, true
}

// restoreOne downloads info into a directory of its own and restores it;
// it returns how long the download took.
func (r restorer) restoreOne(
	ctx context.Context,
	obj jetstream.ObjectStore,
	info SnapshotInfo,
	cur streamNow,
	m Restorable,
) (took time.Duration, err error) {
	tmp, err := os.MkdirTemp(r.dir, r.tempPrefix())
	if err != nil {
		return 0, fmt.Errorf("temporary directory for the snapshot: %w", err)
	}
	defer os.RemoveAll(tmp)
	path := filepath.Join(tmp, "mirror.db")
	bound := r.maxBytes
	if bound <= 0 {
		bound = max(maxRestoreRatio*info.Bytes, minRestoreBound)
	}
	start := time.Now()
	// The compressed object's signed digest is checked as the object is
	// read, and the file is to have the signed size; otherwise the file
	// is hashed here, when there is a signed digest to compare it with.
	object, hash := "", r.verifier != nil
	if info.objectVerified {
		raw, perr := strconv.ParseInt(info.manifest.raw, 10, 64)
		if perr != nil || raw <= 0 {
			return 0, fmt.Errorf("%w: snapshot %s: signed raw_bytes %q", errSnapshotRefused, info.Name, info.manifest.raw)
		}
		object, hash, bound = info.manifest.object, false, raw
	}
	if err := r.checkChunks(ctx, obj, info.Name); err != nil {
		return 0, err
	}
	sum, err := downloadWatched(ctx, obj, info.Name, path, info.Bytes, bound, object, hash)
	if err != nil {
		return 0, err
	}
	took = time.Since(start)
	// A signed snapshot whose object or file has the signed digest is the
	// leader's own: an empty mirror adopts it (store.Verified).
	from := store.Unverified
	if r.verifier != nil {
		if object == "" && sum != info.manifest.digest {
			return took, fmt.Errorf("%w: snapshot %s: the content does not have the signed digest", errSnapshotRefused,
				info.Name)
		}
		from = store.Verified
	}
	// The mirror's position is its place in the current stream.
	at := store.SnapshotAt{Seq: info.After, StreamCreated: cur.created}
	if err := m.Restore(ctx, path, at, from); err != nil {
		if errors.Is(err, store.ErrRestoreUnfinished) || errors.Is(err, store.ErrMirrorExists) ||
			errors.Is(err, errAdoptFile) {
			return took, fmt.Errorf("restore snapshot %s: %w", info.Name, err)
		}
		// The mirror is as it was (the restore is one transaction):
		// whatever failed, trying the same snapshot again would too.
		return took, fmt.Errorf("%w: restore snapshot %s: %w", errSnapshotRefused, info.Name, err)
	}
	return took, nil
}

// checkChunks refuses (errSnapshotRefused) the object name of obj when its
// bucket's stream holds none of its chunks, or fewer than its description
// counts: an object whose chunks were lost or purged, or a description
// planted without them. Its download would wait for a first chunk that
// never comes, and be given up as the link's failure (errDownloadFailed),
// not the snapshot's: every attempt would stop at it, never trying the
// older snapshot, and a follower with an empty mirror never followed the
// stream. (An object missing only some chunks ends early, and fails its
// digest.) A lookup that fails is the download's failure, as before.
func (r restorer) checkChunks(ctx context.Context, obj jetstream.ObjectStore, name string) error {
	oi, err := obj.GetInfo(ctx, name)
	if err != nil {
		return downloadErr(ctx, fmt.Errorf("snapshot %s: %w", name, err))
	}
	if oi.Size == 0 {
		return nil // nothing to read; CheckSnapshot refuses an empty file
	}
	stream, subject := "OBJ_"+r.bucket, "$O."+r.bucket+".C."+oi.NUID
	st, err := r.js.Stream(ctx, stream)
	var si *jetstream.StreamInfo
	if err == nil {
		si, err = st.Info(ctx, jetstream.WithSubjectFilter(subject))
	}
	if err != nil {
		return downloadErr(ctx, fmt.Errorf("snapshot %s: count its chunks: %w", name, err))
	}
	if n := si.State.Subjects[subject]; n == 0 || n < uint64(oi.Chunks) {
		return fmt.Errorf("%w: snapshot %s: the bucket holds %d of its %d chunks (%d bytes)", errSnapshotRefused, name,
			n, oi.Chunks, oi.Size)
	}
	return nil
}

// download writes the decompressed object name of obj to path, 0600, and
// returns its SHA-256 (hex); with object, the digest the object must have
// (ObjectInfo.Digest, which the object store's client checks against what
// it reads), the file is not hashed, and "" is returned. It refuses
// (errSnapshotRefused) an object that has another digest, decompresses to
// more than bound bytes (having written no more than that), or does not
// decompress.
func download(ctx context.Context, obj jetstream.ObjectStore, name, path string, size, bound int64,
	object string, hash bool) (string, error) {
	// The whole download has a deadline of its own: without one, nats.go
	// gives the object's read 5 s in all, which a full-size snapshot over
	// a link slower than about 300 Mbit/s does not make.
	pctx, cancel := context.WithTimeout(ctx, downloadDeadline(size))
	defer cancel()
	r, err := obj.Get(pctx, name)
	if err != nil {
		return "", downloadErr(ctx, fmt.Errorf("get snapshot %s: %w", name, err))
	}
	defer r.Close()
	if info, err := r.Info(); err != nil {
		return "", fmt.Errorf("get snapshot %s: %w", name, err)
	} else if object != "" && (info.Digest != object || info.Size == 0) {
		// An object of no size is read without its digest checked.
		return "", fmt.Errorf("%w: snapshot %s: the object (digest %s, %d bytes) is not the signed %s",
			errSnapshotRefused, name, info.Digest, info.Size, object)
	}
	dec, err := zstd.NewReader(r, zstd.WithDecoderConcurrency(1),
		zstd.WithDecoderMaxWindow(maxRestoreWindow),
		zstd.WithDecoderMaxMemory(maxRestoreWindow))
	if err != nil {
		return "", fmt.Errorf("decompress snapshot %s: %w", name, err)
	}
	defer dec.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return "", fmt.Errorf("create %s: %w", path, err)
	}
	var w io.Writer = localWriter{f}
	var h *hashWriter
	if hash {
		h = newHashWriter()
		w = io.MultiWriter(w, h)
	}
	_, err = io.CopyN(w, dec, bound)
	sum := ""
	if h != nil {
		sum = h.Sum()
	}
	if cerr := f.Close(); err == nil || errors.Is(err, io.EOF) {
		if err = cerr; err != nil {
			err = fmt.Errorf("%w: %w", errDownloadLocal, err)
		}
	}
	if err == nil {
		// Exactly bound bytes so far: one more, read but not written,
		// tells a snapshot that exceeds it.
		if n, _ := dec.Read(make([]byte, 1)); n > 0 {
			return "", fmt.Errorf("%w: snapshot %s decompresses to more than %d bytes", errSnapshotRefused, name, bound)
		}
		// The object read to its end: its digest was checked there
		// (jetstream.ErrDigestMismatch), whatever the decompressor read.
		_, err = io.Copy(io.Discard, r)
	}
	switch {
	case ctx.Err() != nil:
		return "", ctx.Err()
	case err == nil:
		return sum, nil
	case pctx.Err() != nil || errors.Is(err, nats.ErrTimeout) || errors.Is(err, errDownloadLocal):
		return "", downloadErr(ctx, fmt.Errorf("download snapshot %s: %w", name, err))
	}
	return "", fmt.Errorf("%w: download snapshot %s: %w", errSnapshotRefused, name, err)
}

// downloadWatched is download, given up when ctx ends or when no byte of
// the object has come for downloadStall: nats.go's reads of an object
// notice neither until the download's deadline, up to minutes for a large
// snapshot, and meanwhile a standby that gained the lease, or a process
// told to stop, waited on the download. The download given up goes on,
// on a goroutine of its own, until that deadline, and is then dropped;
// its file, in the caller's directory, is the caller's to remove.
func downloadWatched(ctx context.Context, obj jetstream.ObjectStore, name, path string, size, bound int64,
	object string, hash bool) (string, error) {
	type result struct {
		sum string
		err error
	}
	w := &watchedStore{ObjectStore: obj}
	w.last.Store(time.Now().UnixNano())
	// Cancelled when given up, so that the object's subscription ends and
	// nothing more of it is fetched or written, should the link come back
	// before the abandoned read's deadline.
	dctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan result, 1)
	go func() {
		sum, err := download(dctx, w, name, path, size, bound, object, hash)
		done <- result{sum, err}
	}()
	tick := time.NewTicker(downloadStall / 4)
	defer tick.Stop()
	for {
		select {
		case r := <-done:
			return r.sum, r.err
		case <-ctx.Done():
			return "", ctx.Err()
		case <-tick.C:
			if quiet := time.Since(time.Unix(0, w.last.Load())); quiet >= downloadStall {
				return "", fmt.Errorf("%w: snapshot %s: no byte came for %s", errDownloadFailed, name,
					quiet.Round(time.Second))
			}
		}
	}
}

// downloadStall is how long a download may go without a byte of its object
// before downloadWatched gives it up.
var downloadStall = 10 * time.Second

// watchedStore is an object store whose objects' reads record when they
// last returned bytes.
type watchedStore struct {
	jetstream.ObjectStore
	last atomic.Int64 // unix nanoseconds
}

func (s *watchedStore) Get(
	ctx context.Context,
	name string,
	opts ...jetstream.GetObjectOpt,
) (jetstream.ObjectResult, error) {
	r, err := s.ObjectStore.Get(ctx, name, opts...)
	if err != nil {
		return nil, err
	}
	s.last.Store(time.Now().UnixNano())
	return watchedResult{r, &s.last}, nil
}

type watchedResult struct {
	jetstream.ObjectResult
	last *atomic.Int64
}

func (r watchedResult) Read(p []byte) (int, error) {
	n, err := r.ObjectResult.Read(p)
	if n > 0 {
		r.last.Store(time.Now().UnixNano())
	}
	return n, err
}

// downloadFloor and downloadRate give a download its deadline: 10 s, and
// its object's time at 1 MiB/s on top (the full-size benchmark snapshot,
// 193 MB: 194 s in all). A download that misses it, or is refused by the
// disk, is given up as not the snapshot's failure (errDownloadFailed): an
// older snapshot would fare no better. nats.go's reads of the object wait
// for their next chunk until the deadline, so it is also how long a stalled
// download holds a repair up: with a floor of a minute, a standby whose
// download stalled in a partition missed the next checkpoint by far.
var (
	downloadFloor       = 10 * time.Second
	downloadRate  int64 = 1 << 20
)

// downloadDeadline is how long the download of an object of size bytes
// may take.
func downloadDeadline(size int64) time.Duration {
	return downloadFloor + time.Duration(max(size, 0)/downloadRate)*time.Second
}

// errDownloadFailed marks a download that failed for other reasons than
// the snapshot's own: too slow, or the disk's; errDownloadLocal, one the
// disk refused.
var (
	errDownloadFailed = errors.New("the snapshot's download did not finish")
	errDownloadLocal  = errors.New("writing the download")
)

// downloadErr is err as the download's failure (errDownloadFailed), or
// ctx's error when ctx ended.
func downloadErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return fmt.Errorf("%w: %w", errDownloadFailed, err)
}

// localWriter marks the errors of writing the download (errDownloadLocal).
type localWriter struct{ w io.Writer }

func (l localWriter) Write(p []byte) (int, error) {
	n, err := l.w.Write(p)
	if err != nil {
		err = fmt.Errorf("%w: %w", errDownloadLocal, err)
	}
	return n, err
}

// hashWriter computes the SHA-256 of what is written to it on a goroutine
// of its own, so that a download's file is hashed on the other core while
// it is decompressed: hashed after, the benchmark's 746 MB took 0.7 s more.
type hashWriter struct {
	h          hash.Hash
	buf        []byte
	full, free chan []byte
	done       chan struct{}
}

// hashBuffers is how many buffers of hashBufferSize a hashWriter cycles
// through: one filled while the others wait to be hashed.
const (
	hashBuffers    = 4
	hashBufferSize = 1 << 20
)

func newHashWriter() *hashWriter {
	w := &hashWriter{h: sha256.New(), full: make(chan []byte, hashBuffers), free: make(chan []byte, hashBuffers),
		done: make(chan struct{})}
	for range hashBuffers - 1 {
		w.free <- make([]byte, 0, hashBufferSize)
	}
	w.buf = make([]byte, 0, hashBufferSize)
	go func() {
		defer close(w.done)
		for b := range w.full {
			w.h.Write(b)
			w.free <- b[:0]
		}
	}()
	return w
}

func (w *hashWriter) Write(p []byte) (int, error) {
	n := len(p)
	for len(p) > 0 {
		k := copy(w.buf[len(w.buf):cap(w.buf)], p)
		w.buf, p = w.buf[:len(w.buf)+k], p[k:]
		if len(w.buf) == cap(w.buf) {
			w.full <- w.buf
			w.buf = <-w.free
		}
	}
	return n, nil
}

// Sum ends w (it takes no more writes) and returns the hex SHA-256 of all
// that was written.
func (w *hashWriter) Sum() string {
	if len(w.buf) > 0 {
		w.full <- w.buf
	}
	close(w.full)
	<-w.done
	return hex.EncodeToString(w.h.Sum(nil))
}

func (m RestoreMode) String() string {
	switch m {
	case RestoreNever:
		return "false"
	case RestoreAlways:
		return "true"
	}
	return "auto"
}

// Set reads a --from-snapshot value: true, false or auto.
func (m *RestoreMode) Set(s string) error {
	switch strings.ToLower(s) {
	case "auto", "":
		*m = RestoreWhenEmpty
	case "true", "1", "yes":
		*m = RestoreAlways
	case "false", "0", "no":
		*m = RestoreNever
	default:
		return fmt.Errorf("want true, false or auto, got %q", s)
	}
	return nil
}

// IsBoolFlag lets --from-snapshot stand alone for true.
func (m *RestoreMode) IsBoolFlag() bool { return true }
