package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
)

// applyAdvisory applies an advisory event from the stream and returns its
// scope, the artifact name. A created or updated event's after state
// replaces the advisory, a withdrawal's before state is written and
// tombstoned, and a lifecycle step is added to the lifecycle unless the
// advisory has it already (a state carries its steps, which come after it
// in the stream, and a withdrawal's state may predate the steps before it).
func (b *followBatch) applyAdvisory(ctx context.Context, e StreamEvent) (string, error) {
	switch e.Type {
	case AdvisoryCreated, AdvisoryUpdated, AdvisoryWithdrawn:
		st, ok := e.decoded.(*advisoryState)
		if !ok {
			var err error
			if st, err = decodeAdvisoryState(e.Data); err != nil {
				return "", err
			}
		}
		a, complete, withdrawal := st.Advisory, st.complete, st.withdrawal
		if err := b.upsertAdvisory(ctx, a, complete, withdrawal); err != nil {
			return "", err
		}
		if !withdrawal {
			return a.ArtifactName, nil
		}
		if err := b.flush(ctx); err != nil {
			return "", err
		}
		return a.ArtifactName, b.s.tombstone(ctx, b.tx, "advisories", FormatTime(e.Time), []string{a.UID})
	}
	var d struct {
		Advisory *Advisory
		Event    *AdvisoryEvent
	}
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return "", fmt.Errorf("decode data: %w", err)
	}
	if d.Advisory == nil || d.Event == nil {
		return "", errors.New("a lifecycle step's data lacks its advisory or its event")
	}
	if err := b.flush(ctx); err != nil {
		return "", err
	}
	return d.Advisory.ArtifactName, b.addStep(ctx, *d.Advisory, *d.Event)
}

// addStep appends step e to the lifecycle of advisory a unless it is
// there. An advisory the follower does not know (its earlier events left
// the stream) gets an incomplete row from the step's summary of it.
func (b *followBatch) addStep(ctx context.Context, a Advisory, e AdvisoryEvent) error {
	if _, err := b.exec(ctx, `INSERT INTO advisories (uid, advisory_id, artifact_name, first_seen_time) VALUES (?, ?, ?, ?)
		ON CONFLICT(uid) DO NOTHING`, a.UID, a.AdvisoryID, a.ArtifactName, b.now); err != nil {
		return fmt.Errorf("placeholder advisory %s: %w", a.UID, err)
	}
	var n, next int
	row, err := b.queryRow(
		ctx,
		`SELECT count(*) FILTER (WHERE uid = ?), COALESCE(MAX(seq) + 1, 0) FROM advisory_events WHERE advisory_uid = ?`,
		e.UID,
		a.UID,
	)
	if err == nil {
		err = row.Scan(&n, &next)
	}
	if err != nil {
		return fmt.Errorf("read lifecycle of %s: %w", a.UID, err)
	}
	if n > 0 {
		return nil
	}
	if _, err := b.insert(ctx, bulkAdvisoryEvents, eventRow(a.UID, next, e)); err != nil {
		return fmt.Errorf("add step %s to %s: %w", e.UID, a.UID, err)
	}
	return nil
}
