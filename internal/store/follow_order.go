package store

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
)

// streamOrder keeps a follower's mirror in the stream's order where the
// stream's order changed under it. The audit repairs a message lost after
// its acknowledgement by publishing the event again and, behind it, its
// resource's later events (deleted where they were and published anew
// under the same ids): a follower that had read past the loss holds the
// later events, applies the lost one late over them, and would skip them
// as held. So a held event that comes again at a stream sequence above
// the one its resource's state came from (the highest stream_seq of the
// resource's events) is applied again: the stream now carries it after
// that state. A redelivery comes at its own sequence, at or below, and is
// skipped as before.
type streamOrder struct {
	tx *sql.Tx
	// last is, per resource, the stream sequence its state came from;
	// 0: none known (events recorded here, or before schema version 11).
	last map[orderKey]uint64
	// moved are held events' new stream sequences, written by record.
	moved map[string]uint64
}

type orderKey struct{ resource, subject string }

func newStreamOrder(tx *sql.Tx) *streamOrder {
	return &streamOrder{tx: tx, last: map[orderKey]uint64{}, moved: map[string]uint64{}}
}

// restatable reports whether e carries its resource's whole state, which
// applying again restores: a repo's, tag's or advisory's created, updated
// or deleted event. A lifecycle step, a history record, a maturity or a
// crawl's record adds to what the mirror holds, in place, and is left as
// it was applied.
func restatable(e StreamEvent) bool {
	resource, _, _ := strings.Cut(e.Type, ".")
	switch {
	case e.Type == TagMatured:
		return false
	case resource == "repo", resource == "tag":
		return true
	case resource == "advisory":
		return e.Type == AdvisoryCreated || e.Type == AdvisoryUpdated || e.Type == AdvisoryWithdrawn
	}
	return false
}

func keyOf(e StreamEvent) orderKey {
	resource, _, _ := strings.Cut(e.Type, ".")
	return orderKey{resource, e.Subject}
}

// applied notes that fresh event e set its resource's state.
func (o *streamOrder) applied(e StreamEvent) {
	if e.Seq > 0 && restatable(e) {
		o.last[keyOf(e)] = e.Seq
	}
}

// again reports whether held event e, delivered again, is to be applied
// again: it is later on the stream than what its resource's state came
// from. A held event whose resource's order is not known takes its place
// without being applied.
func (o *streamOrder) again(ctx context.Context, e StreamEvent) (bool, error) {
	if e.Seq == 0 || !restatable(e) {
		return false, nil
	}
	k := keyOf(e)
	last, ok := o.last[k]
	if !ok {
		var seq sql.NullInt64
		err := o.tx.QueryRowContext(ctx, `SELECT MAX(stream_seq) FROM event_log WHERE subject = ? AND resource = ?`,
			k.subject, k.resource).Scan(&seq)
		if err != nil {
			return false, fmt.Errorf("read the stream order of %s %s: %w", k.resource, k.subject, err)
		}
		last = uint64(max(seq.Int64, 0))
	}
	if last >= e.Seq {
		return false, nil
	}
	o.last[k], o.moved[e.ID] = e.Seq, e.Seq
	return last > 0, nil
}

// record writes the new stream sequences of the held events that came
// again.
func (o *streamOrder) record(ctx context.Context) error {
	for id, seq := range o.moved {
		if _, err := o.tx.ExecContext(ctx, `UPDATE event_log SET stream_seq = ? WHERE id = ?`, int64(seq), id); err != nil {
			return fmt.Errorf("record the stream sequence of event %s: %w", id, err)
		}
	}
	return nil
}

// streamSeqValue is seq as event_log.stream_seq holds it: NULL for 0.
func streamSeqValue(seq uint64) any {
	if seq == 0 {
		return nil
	}
	return int64(seq)
}
