package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go/jetstream"

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
// sequence, and the follower skips them there by id.

// Object metadata keys of a snapshot.
const (
	snapshotSeqKey     = "stream_seq"
	snapshotCreatedKey = "created"
	snapshotRawKey     = "raw_bytes"
	snapshotPrefix     = "mirror-"
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
	// Keep is how many snapshots the bucket keeps.
	Keep int
	// Dir holds the temporary copy of the mirror: beside it, so that the
	// copy is on the same disk and as private.
	Dir    string
	Logger *slog.Logger
	// Signer, when set, signs each snapshot's manifest (snapshot_sign.go).
	Signer *signing.Signer
}

// SnapshotInfo describes the newest snapshot.
type SnapshotInfo struct {
	Name string
	// Seq is the stream sequence the snapshot covers.
	Seq     uint64
	Created time.Time
	// Bytes is the compressed size, RawBytes the size of the database.
	Bytes, RawBytes int64
	// Took is how long writing it took; zero when another process wrote it.
	Took time.Duration
	// manifest and signature are as listed, for verifySnapshot.
	manifest  manifest
	signature string
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
			if err := s.prune(ctx, obj); err != nil {
				s.log.Warn("delete old snapshots", "err", err)
			}
			if newest, ok, err := newestSnapshot(ctx, obj); err != nil {
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
		if err := s.prune(ctx, obj); err != nil {
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
	seq := si.State.LastSeq
	dir, err := os.MkdirTemp(s.cfg.Dir, ".snapshot-")
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
	md := map[string]string{snapshotSeqKey: strconv.FormatUint(seq, 10), snapshotCreatedKey: created.Format(time.RFC3339Nano),
		snapshotRawKey: strconv.FormatInt(fi.Size(), 10)}
	if s.cfg.Signer != nil {
		if err := signManifest(f, name, md, s.cfg.Signer); err != nil {
			return SnapshotInfo{}, err
		}
	}
	pr, pw := io.Pipe()
	compressed := make(chan struct{})
	go func() {
		defer close(compressed)
		pw.CloseWithError(compress(pw, f))
	}()
	oi, err := obj.Put(ctx, jetstream.ObjectMeta{Name: name, Description: "syncd mirror, zstd-compressed SQLite database",
		Metadata: md,
		Opts:     &jetstream.ObjectMetaOptions{ChunkSize: snapshotChunk}}, pr)
	// Closing the pipe ends the compressor if Put stopped early (a
	// shutdown cancels it); the file is closed and removed only after the
	// compressor has stopped reading it.
	pr.CloseWithError(io.ErrClosedPipe)
	<-compressed
	if err != nil {
		return SnapshotInfo{}, fmt.Errorf("put snapshot %s into %s: %w", name, s.cfg.Bucket, err)
	}
	info := SnapshotInfo{Name: name, Seq: seq, Created: created, Bytes: int64(oi.Size), RawBytes: fi.Size(), Took: time.Since(start)}
	s.setLast(info)
	return info, nil
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

// prune deletes the snapshots beyond the newest Keep.
func (s *Snapshotter) prune(ctx context.Context, obj jetstream.ObjectStore) error {
	all, err := listSnapshots(ctx, obj)
	if err != nil {
		return err
	}
	var errs []error
	for _, old := range all[min(s.cfg.Keep, len(all)):] {
		if err := obj.Delete(ctx, old.Name); err != nil {
			errs = append(errs, fmt.Errorf("delete snapshot %s: %w", old.Name, err))
		}
	}
	return errors.Join(errs...)
}

// listSnapshots lists the bucket's snapshots, newest first.
func listSnapshots(ctx context.Context, obj jetstream.ObjectStore) ([]SnapshotInfo, error) {
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
		info := SnapshotInfo{Name: o.Name, Bytes: int64(o.Size), Created: o.ModTime, manifest: manifestOf(o), signature: o.Metadata[snapshotSigKey]}
		info.Seq, _ = strconv.ParseUint(o.Metadata[snapshotSeqKey], 10, 64)
		info.RawBytes, _ = strconv.ParseInt(o.Metadata[snapshotRawKey], 10, 64)
		if t, err := time.Parse(time.RFC3339Nano, o.Metadata[snapshotCreatedKey]); err == nil {
			info.Created = t
		}
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Created.After(out[j].Created) })
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

// newestSnapshot is the newest snapshot in obj; false when it has none.
func newestSnapshot(ctx context.Context, obj jetstream.ObjectStore) (SnapshotInfo, bool, error) {
	all, err := listSnapshots(ctx, obj)
	if err != nil || len(all) == 0 {
		return SnapshotInfo{}, false, err
	}
	return all[0], true, nil
}

// Restorable is what a follower needs of a mirror to start it from a
// snapshot.
type Restorable interface {
	Empty(ctx context.Context) (bool, error)
	Restore(ctx context.Context, path string, seq uint64) error
	SnapshotSeq(ctx context.Context) (uint64, error)
}

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

// restoreSnapshot downloads the newest snapshot of bucket (signed by a key
// of v, when given; reject is told of those passed over), restores it into
// m and returns it; false when the bucket has none.
func restoreSnapshot(ctx context.Context, js jetstream.JetStream, bucket, dir string, m Restorable, v *signing.Verifier, reject func(SnapshotInfo, error)) (SnapshotInfo, bool, error) {
	obj, err := js.ObjectStore(ctx, bucket)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return SnapshotInfo{}, false, nil
	}
	if err != nil {
		return SnapshotInfo{}, false, fmt.Errorf("look up snapshot bucket %s: %w", bucket, err)
	}
	newest, ok, err := newestVerified(ctx, obj, v, reject)
	if err != nil || !ok {
		return SnapshotInfo{}, false, err
	}
	start := time.Now()
	tmp, err := os.MkdirTemp(dir, ".restore-")
	if err != nil {
		return SnapshotInfo{}, false, fmt.Errorf("temporary directory for the snapshot: %w", err)
	}
	defer os.RemoveAll(tmp)
	path := filepath.Join(tmp, "mirror.db")
	if err := download(ctx, obj, newest.Name, path); err != nil {
		return SnapshotInfo{}, false, err
	}
	if v != nil {
		if err := checkDownload(path, newest); err != nil {
			return SnapshotInfo{}, false, err
		}
	}
	if err := m.Restore(ctx, path, newest.Seq); err != nil {
		return SnapshotInfo{}, false, fmt.Errorf("restore snapshot %s: %w", newest.Name, err)
	}
	newest.Took = time.Since(start)
	return newest, true, nil
}

// download writes the decompressed object name of obj to path, 0600.
func download(ctx context.Context, obj jetstream.ObjectStore, name, path string) error {
	r, err := obj.Get(ctx, name)
	if err != nil {
		return fmt.Errorf("get snapshot %s: %w", name, err)
	}
	defer r.Close()
	dec, err := zstd.NewReader(r)
	if err != nil {
		return fmt.Errorf("decompress snapshot %s: %w", name, err)
	}
	defer dec.Close()
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if _, err := io.Copy(f, dec); err != nil {
		f.Close()
		return fmt.Errorf("download snapshot %s: %w", name, err)
	}
	return f.Close()
}

// String is the mode as the --from-snapshot flag takes it.
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
