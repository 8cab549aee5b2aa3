package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// A stream's sequences count from 1 again when it is created again (NATS
// lost it whole, or an operator deleted it): a position of the stream that
// was (meta stream_seq, snapshot_stream_seq) names nothing in the new one,
// and taken for a position of it, a consumer made there passes over
// everything the new stream holds below it. So the mirror records which
// stream its positions count: the stream's creation time, which the
// server sets and a new stream of the same name does not share.

// StreamCreatedKey is the meta key of the creation time (RFC 3339, UTC)
// of the stream whose sequences the mirror's positions (StreamSeqKey,
// SnapshotSeqKey) count; absent in a mirror from before syncd recorded it,
// whose positions are taken to be the stream's it meets first.
const StreamCreatedKey = "stream_created"

// SetStreamIncarnation records that the stream the mirror reflects is the
// one created at created, whose last sequence is last. When the mirror's
// positions count another (a different creation time recorded), or pass
// last (the stream lost its tail, or is another one the mirror did not
// record: a mirror of an older syncd), they name nothing in this one: it
// sets them to 0, in the same transaction, and returns moved. A mirror
// restored from a snapshot keeps saying so (Restored), with the snapshot
// sequence 0.
func (s *Store) SetStreamIncarnation(ctx context.Context, created time.Time, last uint64) (moved bool, err error) {
	if created.IsZero() {
		return false, nil
	}
	want := FormatStreamCreated(created)
	// Read first: the leader's relay asks before every checkpoint, and the
	// stream is nearly always the one recorded; a write transaction each
	// time would hold the writer for nothing.
	if was, beyond, err := streamRecorded(ctx, s.r, last); err == nil && was == want && beyond == 0 {
		return false, nil
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		was, beyond, err := streamRecorded(ctx, tx, last)
		if err != nil {
			return err
		}
		moved = (was != "" && was != want) || beyond > 0
		if was != want {
			if err := setMeta(ctx, tx, "main", StreamCreatedKey, want); err != nil {
				return err
			}
		}
		if !moved {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `UPDATE meta SET value = '0' WHERE key IN (?, ?)`,
			StreamSeqKey, SnapshotSeqKey); err != nil {
			return err
		}
		// Nor do the events' own sequences (streamOrder).
		if _, err := tx.ExecContext(ctx, `UPDATE event_log SET stream_seq = NULL WHERE stream_seq IS NOT NULL`); err != nil {
			return err
		}
		// The stream holds none of the log until the leader's audit has
		// published it there again (see RefillUntilKey): the next audit
		// checks the whole log (a sweep), whatever it finds of the stream's
		// state by then (a lost tail the relay has published past).
		if _, err := tx.ExecContext(ctx, `INSERT INTO meta (key, value)
			SELECT ?, CAST(COALESCE(MAX(seq), 0) AS TEXT) FROM event_log WHERE true
			ON CONFLICT(key) DO UPDATE SET value = excluded.value`, RefillUntilKey); err != nil {
			return err
		}
		now := FormatTime(s.now())
		if err := setMeta(ctx, tx, "main", RefillSinceKey, now); err != nil {
			return err
		}
		return setMeta(ctx, tx, "main", RefillSweepKey, now)
	})
	if err != nil {
		return false, fmt.Errorf("record the stream created at %s: %w", want, err)
	}
	return moved, nil
}

// streamRecorded returns, through q, the stream the mirror's positions
// count (StreamCreatedKey) and how many of them pass last.
func streamRecorded(ctx context.Context, q queryer, last uint64) (was string, beyond int, err error) {
	err = q.QueryRowContext(ctx, `SELECT COALESCE((SELECT value FROM meta WHERE key = ?1), ''),
		(SELECT count(*) FROM meta WHERE key IN (?2, ?3) AND CAST(value AS INTEGER) > ?4)`,
		StreamCreatedKey, StreamSeqKey, SnapshotSeqKey, int64(min(last, 1<<63-1))).Scan(&was, &beyond)
	return was, beyond, err
}

// StreamIncarnation returns the creation time of the stream whose
// sequences the mirror's positions count; zero when not recorded.
func (s *Store) StreamIncarnation(ctx context.Context) (time.Time, error) {
	v, err := s.meta(ctx, s.r, StreamCreatedKey)
	if err != nil || v == "" {
		return time.Time{}, err
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return time.Time{}, fmt.Errorf("meta %s: %w", StreamCreatedKey, err)
	}
	return t, nil
}

// RefillUntilKey is the meta key of the last event_log seq the mirror
// held when it met a stream created again, or one that lost its tail
// (SetStreamIncarnation): the stream lacks the log up to it until the
// leader's audit has published it there again (its next audit sweeps),
// and a checkpoint meanwhile would cover more than the stream carries; a
// follower reading the new stream from its start would find its mirror
// diverged at it. So no checkpoint is published while the key is set
// (CheckpointState, WhyRefill), and the audit's end clears it once its
// position has passed it on this stream (SetAuditStream) with nothing
// held, or with events still held RefillWait after RefillSinceKey: a
// resource that changes more often than the duplicate window has its
// lost events' repair put off for as long (audit.go), and must not keep
// every checkpoint off.
const RefillUntilKey = "refill_until"

// RefillSinceKey is the meta key of when RefillUntilKey was set.
const RefillSinceKey = "refill_since"

// RefillSweepKey is the meta key of when the mirror last met another
// stream or a lost tail, until the next sweep begins (AuditStream.Refill).
const RefillSweepKey = "refill_sweep"

// RefillWait is how long events still held keep the checkpoints off once
// the audit has passed RefillUntilKey.
const RefillWait = 15 * time.Minute

// WhyRefill begins CheckpointState's Why while RefillUntilKey is set.
const WhyRefill = "the stream lacks the event log until the audit has published it there again"

// FormatStreamCreated is a stream's creation time as the mirror and the
// snapshots' metadata record it: to the nanosecond, as the server gives
// it, so that two streams created within a second are told apart.
func FormatStreamCreated(t time.Time) string { return t.UTC().Format(time.RFC3339Nano) }

// Restored reports whether the mirror was restored from a snapshot (or
// made from one's file): it then holds the history the stream does not
// carry, whatever stream its snapshot sequence counted.
func (s *Store) Restored(ctx context.Context) (bool, error) {
	var n int
	err := s.r.QueryRowContext(ctx, `SELECT count(*) FROM meta WHERE key = ?`, SnapshotSeqKey).Scan(&n)
	if err != nil {
		return false, fmt.Errorf("read meta %s: %w", SnapshotSeqKey, err)
	}
	return n > 0, nil
}
