package store

import (
	"context"
	"database/sql"
	"fmt"
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
	// (the baseline, whose history followers get from a snapshot). Why
	// says which.
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
	var baseline string
	err = tx.QueryRowContext(ctx, `SELECT (SELECT count(*) FROM outbox), (SELECT COALESCE(MAX(seq), 0) FROM event_log),
		COALESCE((SELECT value FROM meta WHERE key = 'baseline_time'), '')`).Scan(&unpublished, &st.EventSeq, &baseline)
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
	default:
		st.Ready = true
	}
	return st, nil
}
