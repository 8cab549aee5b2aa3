package store

import (
	"context"
	"database/sql"
	"fmt"
	"strconv"
)

// CheckpointState is what a leader's checkpoint says: the digest of the
// replicated state, read in the same read transaction that found every
// recorded event published, so that the stream up to the checkpoint holds
// exactly the changes the digest covers.
type CheckpointState struct {
	Digest ReplicaDigest
	// EventSeq is the last event_log seq the digest covers.
	EventSeq int64
	// Ready is false while a checkpoint would cover less than the mirror
	// holds (events wait in the outbox) or more than the stream can carry
	// (the baseline, whose history followers get from a snapshot) or
	// carries (a stream created again, until the audit has published the
	// log into it again: RefillUntilKey). Why says which.
	Ready bool
	Why   string
}

// CheckpointState reads the state a checkpoint published now would carry.
func (s *Store) CheckpointState(ctx context.Context) (CheckpointState, error) {
	var st CheckpointState
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return st, fmt.Errorf("read checkpoint state: %w", err)
	}
	defer tx.Rollback()
	var unpublished int
	var baseline, refill string
	err = tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM outbox), (SELECT COALESCE(MAX(seq), 0) FROM event_log),
		COALESCE((SELECT value FROM meta WHERE key = 'baseline_time'), ''),
		COALESCE((SELECT value FROM meta WHERE key = ?), '')`, RefillUntilKey).
		Scan(&unpublished, &st.EventSeq, &baseline, &refill)
	if err != nil {
		return st, fmt.Errorf("read checkpoint state: %w", err)
	}
	if st.Digest, err = readDigest(ctx, tx); err != nil {
		return st, err
	}
	switch {
	case baseline == "":
		st.Why = "the baseline has not finished"
	case unpublished > 0:
		st.Why = fmt.Sprintf("%d events wait to be published", unpublished)
	case refill != "":
		st.Why = WhyRefill + " (the stream was created again, or lost its tail; up to event " + refill + ")"
	default:
		st.Ready = true
	}
	return st, nil
}

// StreamSeqKey is the meta key of the highest stream sequence whose
// messages the mirror reflects: what a follower applied, a leader had
// acknowledged, or a restored snapshot covers. A checkpoint at or before
// it tells nothing about the mirror (it holds later changes).
const StreamSeqKey = "stream_seq"

// SetStreamSeq records that the mirror reflects the stream up to seq, if
// that is further than it had recorded.
func (s *Store) SetStreamSeq(ctx context.Context, seq uint64) error {
	_, err := s.w.ExecContext(ctx, setStreamSeqSQL, strconv.FormatUint(seq, 10))
	if err != nil {
		return fmt.Errorf("record stream position %d: %w", seq, err)
	}
	return nil
}

const setStreamSeqSQL = `INSERT INTO meta (key, value) VALUES ('` + StreamSeqKey + `', ?1)
	ON CONFLICT(key) DO UPDATE SET value = ?1 WHERE CAST(value AS INTEGER) < CAST(?1 AS INTEGER)`

// StreamPosition returns the highest stream sequence the mirror reflects
// (its recorded position, or the snapshot it was restored from) and how
// many of its events wait in its outbox: a mirror with events the stream
// does not hold yet is ahead of every checkpoint until they arrive there.
func (s *Store) StreamPosition(ctx context.Context) (uint64, int, error) {
	var pos, snap string
	var pending int
	err := s.r.QueryRowContext(
		ctx,
		`SELECT COALESCE((SELECT value FROM meta WHERE key = ?), '0'),
		COALESCE((SELECT value FROM meta WHERE key = ?), '0'), (SELECT count(*) FROM outbox)`,
		StreamSeqKey,
		SnapshotSeqKey,
	).Scan(
		&pos,
		&snap,
		&pending,
	)
	if err != nil {
		return 0, 0, fmt.Errorf("read stream position: %w", err)
	}
	p, _ := strconv.ParseUint(pos, 10, 64)
	q, _ := strconv.ParseUint(snap, 10, 64)
	return max(p, q), pending, nil
}
