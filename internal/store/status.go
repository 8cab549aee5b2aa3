package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// StatusTables are the tables Status counts, in the order "syncd status"
// lists them.
var StatusTables = []string{"repos", "tags", "tag_history", "advisories", "subscriptions", "events", "crawl_runs"}

// Status is what the mirror holds and how fresh it is, as "syncd status"
// shows it.
type Status struct {
	SchemaVersion int
	// Tables counts the rows of each of StatusTables.
	Tables map[string]int64
	// Runs is the latest run of each job, by job name.
	Runs []JobRun
	// Subscriptions are every subscription syncd recorded, removed ones
	// included.
	Subscriptions []SubscriptionStatus
	// Failures are the repos and tags whose reads failed and are retried
	// with backoff; the rest of each crawl went on without them.
	Failures []Failure
	// Unpublished events wait for JetStream, the oldest recorded at
	// OldestUnpublished (zero: none).
	Unpublished       int
	OldestUnpublished time.Time
	// Role, LeaseHolder and FollowLag are what cluster mode and followers
	// recorded in meta: leader, standby or follower; the lease holder; the
	// stream messages the follower had pending.
	Role, LeaseHolder, FollowLag string
	// Checkpoint is the last leader's checkpoint a follower or standby
	// compared its mirror with: its stream sequence, the result ("match",
	// or "differs: <table>") and the checkpoint's time; empty before one.
	CheckpointSeq, CheckpointResult, CheckpointTime string
	// SnapshotSeq is the stream sequence of the snapshot the mirror was
	// restored from ("" when none); AdoptedCheckDue, when the mirror was
	// made from the snapshot's file and its check has not ended yet, and
	// AdoptedDamage what that check's quick_check found (AdoptFile).
	SnapshotSeq, AdoptedCheckDue, AdoptedDamage string
	// Progress is the running crawl's progress as it last wrote it (JSON;
	// "" when no crawl is running).
	Progress string
	// Current: the first complete listing ended (the baseline), so the
	// mirror holds the current state; BackfillRemaining counts the tags
	// whose history is still to read.
	Current           bool
	BackfillRemaining int64
}

// SubscriptionStatus is a subscription as syncd last saw it.
type SubscriptionStatus struct {
	UID, GroupUID, Sink string
	Synced              time.Time // when syncd last found it on the platform
	Deleted             time.Time // zero while it exists
}

// Status reads the mirror's status.
func (s *Store) Status(ctx context.Context) (Status, error) {
	st := Status{Tables: map[string]int64{}}
	var err error
	if st.SchemaVersion, err = s.SchemaVersion(ctx); err != nil {
		return st, err
	}
	for _, t := range StatusTables {
		var n int64
		if err := s.r.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+t).Scan(&n); err != nil {
			return st, fmt.Errorf("count %s: %w", t, err)
		}
		st.Tables[t] = n
	}
	if st.Runs, err = s.LastRuns(ctx); err != nil {
		return st, err
	}
	if st.Subscriptions, err = s.subscriptionStatus(ctx); err != nil {
		return st, err
	}
	if st.Failures, err = s.Failures(ctx); err != nil {
		return st, err
	}
	if st.Unpublished, st.OldestUnpublished, err = s.UnpublishedCount(ctx); err != nil {
		return st, err
	}
	in, err := s.InBaseline(ctx)
	if err != nil {
		return st, err
	}
	st.Current = !in
	if st.BackfillRemaining, err = s.BackfillRemaining(ctx); err != nil {
		return st, err
	}
	for key, v := range map[string]*string{
		"role":              &st.Role,
		"lease_holder":      &st.LeaseHolder,
		"follow_lag":        &st.FollowLag,
		ProgressKey:         &st.Progress,
		"checkpoint_seq":    &st.CheckpointSeq,
		"checkpoint_result": &st.CheckpointResult,
		"checkpoint_time":   &st.CheckpointTime,
		SnapshotSeqKey:      &st.SnapshotSeq,
		adoptedCheckKey:     &st.AdoptedCheckDue,
		adoptedDamagedKey:   &st.AdoptedDamage,
	} {
		if *v, err = s.Meta(ctx, key); err != nil {
			return st, fmt.Errorf("read meta %s: %w", key, err)
		}
	}
	return st, nil
}

// subscriptionStatus reads every recorded subscription, by uid.
func (s *Store) subscriptionStatus(ctx context.Context) ([]SubscriptionStatus, error) {
	var out []SubscriptionStatus
	err := queryRows(
		ctx,
		s.r,
		`SELECT uid, group_uid, sink, synced_time, COALESCE(deleted_time, '') FROM subscriptions ORDER BY uid`,
		nil,
		func(rows *sql.Rows) error {
			var sub SubscriptionStatus
			var synced, deleted string
			if err := rows.Scan(&sub.UID, &sub.GroupUID, &sub.Sink, &synced, &deleted); err != nil {
				return err
			}
			var err error
			if sub.Synced, err = ParseTime(synced); err != nil {
				return err
			}
			sub.Deleted, err = ParseTime(deleted)
			out = append(out, sub)
			return err
		},
	)
	if err != nil {
		return nil, fmt.Errorf("read subscriptions: %w", err)
	}
	return out, nil
}

// ProgressKey is the meta key under which a running crawl keeps its
// progress for "syncd status".
const ProgressKey = "crawl_progress"
