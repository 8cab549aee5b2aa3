package store

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"
)

// The leader's audit of the stream (publish.Auditor) checks that every
// event the mirror marks published is on the stream. It reads the event
// log in seq order from where the last audit stopped, which the meta table
// keeps across restarts.

// Meta keys of the stream audit: the seq of the last event it checked (every
// event up to it was found on the stream, or published again), and the
// stream's last sequence when that audit began.
const (
	AuditSeqKey       = "audit_event_seq"
	AuditStreamSeqKey = "audit_stream_seq"
	// AuditHeldKey holds the events (HeldEvent, a JSON list) before the
	// position that a later audit must look at again: a lost event
	// whose repair waits (its resource's later events still in the
	// duplicate window, a re-publish dropped as a duplicate), and a
	// repaired one, whose copies the stream may lose before it syncs them.
	AuditHeldKey = "audit_held"
	// AuditStreamKey holds what the last audit saw of the stream at its
	// end (AuditStream, a JSON object), for the next to tell whether the
	// stream lost messages the audits had already found.
	AuditStreamKey = "audit_stream"
)

// AuditStream is what an audit saw of the stream at its end, and when the
// audits last went through the whole log again (a sweep).
type AuditStream struct {
	// Created is when the stream was created: another time is another
	// stream, which holds none of what the audits found on the first.
	Created time.Time `json:"created"`
	// LastSeq is the stream's last sequence: one lower later is a lost
	// tail.
	LastSeq uint64 `json:"last_seq"`
	// Deleted is how many messages between the stream's first and last
	// were gone: more later is messages lost, or deleted by someone else.
	Deleted uint64 `json:"deleted"`
	// Swept is when the last sweep began.
	Swept time.Time `json:"swept"`
	// Again: the last audit had more events to look at again than it
	// keeps, and held none; the next sweeps.
	Again bool `json:"again,omitempty"`
	// Refill: the mirror met the stream created again, or with messages
	// it had counted gone (SetStreamIncarnation), since the last sweep
	// began; the next audit sweeps, whatever it finds of the stream's
	// state by then (a lost tail the relay has published past). It is
	// meta RefillSweepKey, not part of the record, so that an audit
	// running meanwhile does not write it away at its end.
	Refill bool `json:"-"`
}

// maxAuditStreamBytes bounds meta audit_stream as read back.
const maxAuditStreamBytes = 4 << 10

// AuditStream returns what the last audit saw of the stream; the zero
// AuditStream before any.
func (s *Store) AuditStream(ctx context.Context) (AuditStream, error) {
	var rec AuditStream
	sweep, err := s.meta(ctx, s.r, RefillSweepKey)
	if err != nil {
		return rec, err
	}
	v, err := s.meta(ctx, s.r, AuditStreamKey)
	if err != nil || v == "" {
		rec.Refill = sweep != ""
		return rec, err
	}
	if len(v) > maxAuditStreamBytes {
		return rec, fmt.Errorf("meta %s: %d bytes, more than %d", AuditStreamKey, len(v), maxAuditStreamBytes)
	}
	if err := json.Unmarshal([]byte(v), &rec); err != nil {
		return AuditStream{}, fmt.Errorf("meta %s: %w", AuditStreamKey, err)
	}
	rec.Refill = sweep != ""
	return rec, nil
}

// SetAuditStream records rec; with sweep, it also moves the audit's
// position back to the log's start, in the same transaction, so that the
// audits from then on check the whole log again. Without, it ends the
// refill of a stream created again (RefillUntilKey) when the audit,
// which saw that stream (rec), has checked every event up to it and
// holds none to look at again.
func (s *Store) SetAuditStream(ctx context.Context, rec AuditStream, sweep bool) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		if err := setMeta(ctx, tx, "main", AuditStreamKey, string(b)); err != nil {
			return fmt.Errorf("record the audit's view of the stream: %w", err)
		}
		if sweep {
			if err := setMeta(ctx, tx, "main", AuditSeqKey, "0"); err != nil {
				return fmt.Errorf("move the audit's position to the log's start: %w", err)
			}
			if _, err := tx.ExecContext(ctx, `DELETE FROM meta WHERE key = ?`, RefillSweepKey); err != nil {
				return fmt.Errorf("record the sweep asked for: %w", err)
			}
			return nil
		}
		if rec.Again || rec.Created.IsZero() {
			return nil
		}
		return s.endRefill(ctx, tx, rec.Created)
	})
}

// endRefill clears RefillUntilKey, in tx, when the audit that saw the
// stream created at created has checked every event up to it, and holds
// none to look at again or has held some for RefillWait.
func (s *Store) endRefill(ctx context.Context, tx *sql.Tx, created time.Time) error {
	var until, position int64
	var held, since, stream string
	err := tx.QueryRowContext(ctx, `SELECT CAST(value AS INTEGER),
		COALESCE((SELECT CAST(value AS INTEGER) FROM meta WHERE key = ?2), 0),
		COALESCE((SELECT value FROM meta WHERE key = ?3), ''),
		COALESCE((SELECT value FROM meta WHERE key = ?4), ''),
		COALESCE((SELECT value FROM meta WHERE key = ?5), '')
		FROM meta WHERE key = ?1`, RefillUntilKey, AuditSeqKey, AuditHeldKey, RefillSinceKey, StreamCreatedKey).
		Scan(&until, &position, &held, &since, &stream)
	if errors.Is(err, sql.ErrNoRows) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("read the stream's refill: %w", err)
	}
	if position < until || stream != FormatStreamCreated(created) {
		return nil
	}
	if held != "" {
		if t, err := ParseTime(since); err == nil && s.now().Sub(t) < RefillWait {
			return nil
		}
		s.log.Warn("the audit has passed the refill of the stream with events still held, their repair put off "+
			"(their resources change within the duplicate window): checkpoints resume", "refill_until", until)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM meta WHERE key IN (?, ?)`, RefillUntilKey, RefillSinceKey); err != nil {
		return fmt.Errorf("end the stream's refill: %w", err)
	}
	return nil
}

// AuditEvent is an event of the log and when JetStream acknowledged it.
type AuditEvent struct {
	Event
	// Published is when the relay marked the event published (zero: it is
	// still in the outbox).
	Published time.Time
}

// AuditEvents returns up to limit events after seq after, in seq order,
// each with its publication time; their Data is left out (ResourceEvents
// has it).
func (s *Store) AuditEvents(ctx context.Context, after int64, limit int) ([]AuditEvent, error) {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("read events to audit: %w", err)
	}
	defer tx.Rollback()
	var evs []AuditEvent
	err = queryRows(
		ctx,
		tx,
		`SELECT seq, id, type, resource, action, scope, subject FROM event_log WHERE seq > ? ORDER BY seq LIMIT ?`,
		[]any{after, limit},
		func(rows *sql.Rows) error {
			var e AuditEvent
			if err := rows.Scan(&e.Seq, &e.ID, &e.Type, &e.Resource, &e.Action, &e.Scope, &e.Subject); err != nil {
				return err
			}
			evs = append(evs, e)
			return nil
		},
	)
	if err != nil {
		return nil, fmt.Errorf("read events to audit after seq %d: %w", after, err)
	}
	if err := publicationTimes(ctx, tx, evs); err != nil {
		return nil, fmt.Errorf("read events to audit after seq %d: %w", after, err)
	}
	return evs, nil
}

// ResourceEvents returns the events about the resource subject (its uid)
// from seq from on, in seq order, data included, each with its
// publication time.
func (s *Store) ResourceEvents(ctx context.Context, subject string, from int64) ([]AuditEvent, error) {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("read events of %s: %w", subject, err)
	}
	defer tx.Rollback()
	var evs []AuditEvent
	err = queryRows(ctx, tx, `SELECT `+outboxColumns+` FROM event_log l WHERE l.subject = ? AND l.seq >= ? ORDER BY l.seq`,
		[]any{subject, from}, func(rows *sql.Rows) error {
			e, err := scanEvent(rows)
			evs = append(evs, AuditEvent{Event: e})
			return err
		})
	if err != nil {
		return nil, fmt.Errorf("read events of %s from seq %d: %w", subject, from, err)
	}
	// A resource's events are few and far apart: a lookup each.
	for i := range evs {
		if err := publicationTimes(ctx, tx, evs[i:i+1]); err != nil {
			return nil, fmt.Errorf("read events of %s from seq %d: %w", subject, from, err)
		}
	}
	return evs, nil
}

// PreviousOwnEvent returns the id of the last event before seq before
// about the resource subject that is the resource's own (a repo's, tag's
// or advisory's event, not a replication record that shares its
// subject), and "" when there is none.
func (s *Store) PreviousOwnEvent(ctx context.Context, subject string, before int64) (string, error) {
	var id string
	err := s.r.QueryRowContext(ctx, `SELECT id FROM event_log
		WHERE subject = ? AND seq < ? AND `+ownResourcesSQL+` ORDER BY seq DESC LIMIT 1`,
		subject, before).Scan(&id)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("read the event of %s before seq %d: %w", subject, before, err)
	}
	return id, nil
}

// publicationTimes sets the Published time of evs, which are in seq order,
// from the runs of event_publishes that cover them: the runs from the one
// that may cover the first to the last, read in one range of the primary
// key and merged.
func publicationTimes(ctx context.Context, tx *sql.Tx, evs []AuditEvent) error {
	if len(evs) == 0 {
		return nil
	}
	type run struct {
		first, last int64
		at          time.Time
	}
	var runs []run
	err := queryRows(ctx, tx, `SELECT first_seq, last_seq, published_time FROM event_publishes
		WHERE first_seq >= (SELECT COALESCE(MAX(first_seq), 0) FROM event_publishes WHERE first_seq <= ?) AND first_seq <= ?
		ORDER BY first_seq`, []any{evs[0].Seq, evs[len(evs)-1].Seq}, func(rows *sql.Rows) error {
		var r run
		var at string
		if err := rows.Scan(&r.first, &r.last, &at); err != nil {
			return err
		}
		t, err := ParseTime(at)
		if err != nil {
			return fmt.Errorf("publication of events %d..%d: %w", r.first, r.last, err)
		}
		r.at = t
		runs = append(runs, r)
		return nil
	})
	if err != nil {
		return fmt.Errorf("read publication times: %w", err)
	}
	i := 0
	for k := range evs {
		for i < len(runs) && runs[i].last < evs[k].Seq {
			i++
		}
		if i < len(runs) && runs[i].first <= evs[k].Seq {
			evs[k].Published = runs[i].at
		}
	}
	return nil
}

// AuditPosition returns the seq of the last event the stream audit
// checked (0: none yet).
func (s *Store) AuditPosition(ctx context.Context) (int64, error) {
	v, err := s.meta(ctx, s.r, AuditSeqKey)
	if err != nil || v == "" {
		return 0, err
	}
	seq, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("meta %s: %w", AuditSeqKey, err)
	}
	return seq, nil
}

// HeldEvent is an event before the stream audit's position that the next
// audit looks at again, with the resource it is of.
type HeldEvent struct {
	Seq     int64  `json:"seq"`
	Subject string `json:"subject"`
}

// maxHeldBytes bounds meta audit_held as read back: a value past it is
// not syncd's (a held event leaves the list at the audit that finds it on
// the stream, and few are held at once).
const maxHeldBytes = 16 << 20

// AuditHeld returns the events before the audit's position that the next
// audit looks at again, in seq order.
func (s *Store) AuditHeld(ctx context.Context) ([]HeldEvent, error) {
	v, err := s.meta(ctx, s.r, AuditHeldKey)
	if err != nil || v == "" {
		return nil, err
	}
	if len(v) > maxHeldBytes {
		return nil, fmt.Errorf("meta %s: %d bytes, more than %d", AuditHeldKey, len(v), maxHeldBytes)
	}
	var held []HeldEvent
	if err := json.Unmarshal([]byte(v), &held); err != nil {
		return nil, fmt.Errorf("meta %s: %w", AuditHeldKey, err)
	}
	slices.SortFunc(held, func(a, b HeldEvent) int { return cmp.Compare(a.Seq, b.Seq) })
	return slices.Compact(held), nil
}

// SetAuditPosition records that the stream audit checked the events up to
// seq, reading the stream up to its sequence streamSeq, but for those of
// held, which the next audit looks at again.
func (s *Store) SetAuditPosition(ctx context.Context, seq int64, streamSeq uint64, held []HeldEvent) error {
	list := "" // none held
	if len(held) > 0 {
		b, err := json.Marshal(held)
		if err != nil {
			return err
		}
		list = string(b)
	}
	return s.tx(ctx, func(tx *sql.Tx) error {
		for k, v := range map[string]string{
			AuditSeqKey:       strconv.FormatInt(seq, 10),
			AuditStreamSeqKey: strconv.FormatUint(streamSeq, 10),
			AuditHeldKey:      list,
		} {
			if err := setMeta(ctx, tx, "main", k, v); err != nil {
				return fmt.Errorf("record the audit's position: %w", err)
			}
		}
		return nil
	})
}
