package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
)

// streamOrder keeps a replica's mirror in the stream's order where a
// repair changed that order under it. The leader's audit repairs a
// message the stream lost after acknowledging it by publishing the event
// again and, behind it, its resource's later events (deleted where they
// were and published anew under the same ids), each copy of the resource's
// own events naming the stream sequence of its own message just before it
// (RepairAfter). A
// replica that had read past the loss holds the later events, applies the
// lost one late over them, and would skip them as held; instead, a held
// event is applied again when it is such a copy and the copy it names is
// the message its resource's state came from (the highest stream_seq of
// the resource's events). Nothing else is applied twice: a redelivery, or
// an old message copied onto the stream after the duplicate window (even
// a repair's copy: by then the resource's state came from a later
// message), names no such message.
type streamOrder struct {
	tx *sql.Tx
	// last is, per resource (an event's subject), the stream sequence of
	// the message its state came from; 0: not known (events recorded
	// here, applied before schema version 11, or from a stream created
	// again since).
	last map[string]uint64
	// moved are held events' new stream sequences, written by record.
	moved map[string]uint64
}

func newStreamOrder(tx *sql.Tx) *streamOrder {
	return &streamOrder{tx: tx, last: map[string]uint64{}, moved: map[string]uint64{}}
}

// OwnResource reports whether events of kind resource are a resource's
// own (a repo's, tag's or advisory's, published on its own subjects), not
// replication records that share its CloudEvents subject
// (history.recorded, crawl.*): only its own messages make the chain of a
// repair's copies (publish.RepairAttribute).
func OwnResource(resource string) bool {
	return resource == "repo" || resource == "tag" || resource == "advisory"
}

// ownResourcesSQL is OwnResource as an SQL condition on event_log.resource.
const ownResourcesSQL = `resource IN ('repo', 'tag', 'advisory')`

// chained reports whether e's message is one of its resource's own.
func chained(e StreamEvent) bool {
	resource, _, _ := strings.Cut(e.Type, ".")
	return OwnResource(resource)
}

// applied notes that the resource of e, an event new to the mirror, has
// its state from e's message.
func (o *streamOrder) applied(e StreamEvent) {
	if e.Seq > 0 && chained(e) {
		o.last[e.Subject] = e.Seq
	}
}

// again reports whether held event e, delivered again, is to be applied
// again: a repair's copy behind the message its resource's state came
// from. Such a copy takes that place whether or not it carries a state
// to apply again (a lifecycle step or a maturity adds to what the mirror
// holds, in place).
func (o *streamOrder) again(ctx context.Context, e StreamEvent) (bool, error) {
	if e.Seq == 0 || e.RepairAfter == 0 || e.RepairAfter >= e.Seq || !chained(e) {
		return false, nil
	}
	last, ok := o.last[e.Subject]
	if !ok {
		var err error
		if last, err = o.stateFrom(ctx, e.Subject); err != nil {
			return false, err
		}
		o.last[e.Subject] = last
	}
	if last != e.RepairAfter {
		return false, nil
	}
	o.last[e.Subject], o.moved[e.ID] = e.Seq, e.Seq
	return restatable(e), nil
}

// stateFrom returns the stream sequence of the message the state of the
// resource subject came from: the highest stream_seq of its own events,
// unless an own event the mirror recorded after that one has none (it
// recorded the event itself while it led, or a restore brought the
// leader's): then the state came from no message it knows, and 0.
func (o *streamOrder) stateFrom(ctx context.Context, subject string) (uint64, error) {
	const own = `subject = ?1 AND ` + ownResourcesSQL
	var seq, streamSeq int64
	err := o.tx.QueryRowContext(ctx, `SELECT seq, stream_seq FROM event_log WHERE `+own+` AND stream_seq IS NOT NULL
		ORDER BY stream_seq DESC LIMIT 1`, subject).Scan(&seq, &streamSeq)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, nil
	}
	var later bool
	if err == nil {
		err = o.tx.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM event_log WHERE `+own+` AND stream_seq IS NULL
			AND seq > ?2)`, subject, seq).Scan(&later)
	}
	if err != nil {
		return 0, fmt.Errorf("read the stream order of %s: %w", subject, err)
	}
	if later {
		return 0, nil
	}
	return uint64(max(streamSeq, 0)), nil
}

// record writes the new stream sequences of the held events that took
// their place again.
func (o *streamOrder) record(ctx context.Context) error {
	for id, seq := range o.moved {
		if _, err := o.tx.ExecContext(ctx, `UPDATE event_log SET stream_seq = ? WHERE id = ?`, int64(seq), id); err != nil {
			return fmt.Errorf("record the stream sequence of event %s: %w", id, err)
		}
	}
	return nil
}

// restatable reports whether e carries its resource's whole state, which
// applying again restores: a repo's, tag's or advisory's created, updated,
// moved, deprecated or deleted event.
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

// applyAgain applies held event e again (restatable) and keeps its
// resource's count of deletions as it was: the late event applied before
// it may have brought a deleted resource back, and the deletion, applied
// again, is the same deletion, counted already. (The count is part of the
// replica digest, and of the ids a replica computes once it leads.)
func (b *followBatch) applyAgain(ctx context.Context, e StreamEvent) error {
	resource, _, _ := strings.Cut(e.Type, ".")
	table := map[string]string{"repo": "repos", "tag": "tags", "advisory": "advisories"}[resource]
	if table == "" {
		return fmt.Errorf("no table for resource %q", resource)
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	var deletions int64
	row, err := b.queryRow(ctx, `SELECT deletions FROM `+table+` WHERE uid = ?`, e.Subject)
	if err == nil {
		err = row.Scan(&deletions)
	}
	known := err == nil
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("read the deletions of %s: %w", e.Subject, err)
	}
	if _, err := b.apply(ctx, e); err != nil {
		return err
	}
	if err := b.flush(ctx); err != nil {
		return err
	}
	if !known {
		return nil
	}
	_, err = b.exec(ctx, `UPDATE `+table+` SET deletions = ?1 WHERE uid = ?2 AND deletions != ?1`, deletions, e.Subject)
	return err
}

// streamSeqValue is seq as event_log.stream_seq holds it: NULL for 0.
func streamSeqValue(seq uint64) any {
	if seq == 0 {
		return nil
	}
	return int64(seq)
}
