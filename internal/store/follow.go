package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"
)

// A follower builds its mirror from the event stream instead of the
// platform: every event's after state (before, for a deletion) is applied
// to the same tables the crawler fills, and the event itself is recorded as
// already published. Applying is idempotent: an event whose id the mirror
// holds changes nothing, so JetStream's redeliveries are harmless, and a
// replica that published an event itself skips it when it follows again.

// StreamEvent is an event as a follower receives it from the stream.
type StreamEvent struct {
	ID      string
	Type    string // <resource>.<action>, e.g. tag.moved
	Subject string // uid of the resource
	Time    time.Time
	Data    json.RawMessage // {"before": …, "after": …}
	// Seq is the message's stream sequence; 0: not known.
	Seq uint64
	// RepairAfter, on a copy the leader's audit published again of a
	// resource's own event, is the stream sequence of the resource's own
	// message just before it; 0 on any other message (see streamOrder).
	RepairAfter uint64
	// Stored is when the stream stored the message; zero: not known. The
	// mirror marks the event published then, not when it applied it: the
	// stream audit of a replica that leads later reads the stream from an
	// event's publication time, and a standby applies what it catches up
	// on long after (TestApplyStreamEvents_MarkedPublishedWhenStored).
	Stored time.Time
	// decoded is Data as Predecode decoded it; nil: not predecoded.
	decoded any
}

// ApplyStreamEvents applies events, in order, in one transaction, skipping
// those already in the mirror, and returns how many it applied. An event it
// cannot decode fails the whole batch, naming the event. A follower uses
// ApplyStream, which sets such an event aside instead.
func (s *Store) ApplyStreamEvents(ctx context.Context, evs []StreamEvent) (int, error) {
	applied := 0
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		applied, err = s.applyStreamTx(ctx, tx, evs)
		return err
	})
	if err != nil {
		return 0, err
	}
	return applied, nil
}

// StreamResult is what ApplyStream did with a batch.
type StreamResult struct {
	// Applied is how many events changed the mirror.
	Applied int
	// Rejected are the events that could not be applied, in order: the
	// rest of the batch was applied without them.
	Rejected []RejectedEvent
}

// RejectedEvent is an event ApplyStream set aside, and why.
type RejectedEvent struct {
	Event StreamEvent
	Err   error
}

// ErrUnknownPosition is why a tag.moved event without a position, whose id
// matches none of the positions tried, is rejected.
var ErrUnknownPosition = errors.New(
	"the move's history position is not in its data, and its id matches no position tried",
)

// ApplyStream applies evs as ApplyStreamEvents does, in one transaction,
// but an event that cannot be applied (data that does not decode or breaks
// a constraint: what the stream carries is untrusted) is set aside and
// returned in Rejected, while the events before and after it are applied.
//
// The batch is tried whole first, in a transaction of its own without a
// savepoint: a savepoint around a batch made every statement in it pay for
// the pages the savepoint had journaled (SQLite's in-memory statement
// journal is cut back from its start at the end of each statement), most
// of a follower's time. Only when an event fails is that transaction
// rolled back and the batch applied again in another (applyApart), with
// the failed attempt's error, so a poison message costs one more pass over
// its batch. An error of the database itself (a full disk, a busy or
// damaged file, a cancelled context) fails the whole batch, which is then
// retried: it says nothing about the event.
func (s *Store) ApplyStream(ctx context.Context, evs []StreamEvent) (StreamResult, error) {
	var applied int
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		applied, err = s.applyStreamTx(ctx, tx, evs)
		return err
	})
	if err == nil {
		return StreamResult{Applied: applied}, nil
	}
	if !eventFault(ctx, err) {
		return StreamResult{}, err
	}
	return s.applyApart(ctx, evs, err)
}

// applyApart applies evs, a batch whose whole attempt failed with failed,
// setting aside the events that cannot be applied. Each attempt runs in a
// SAVEPOINT, so a rejected event leaves nothing behind: the events up to
// the one that failed are applied one at a time, and the rest whole again,
// so a batch costs at most one extra attempt per rejected event and one
// single-event write per event.
func (s *Store) applyApart(ctx context.Context, evs []StreamEvent, failed error) (StreamResult, error) {
	var res StreamResult
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res = StreamResult{}
		err := failed
		for rest := evs; len(rest) > 0; {
			if err == nil {
				var n int
				if n, err = s.applySavepoint(ctx, tx, rest); err == nil {
					res.Applied += n
					break
				}
			}
			if !eventFault(ctx, err) {
				return err
			}
			k, own := len(rest)-1, false
			var ee *eventError
			if errors.As(err, &ee) && ee.index < len(rest) {
				// The k-th event failed; the cause is its own when nothing
				// of earlier events was pending, or its position was not
				// found (a search not worth repeating).
				k, own = ee.index, ee.index == 0 || errors.Is(err, ErrUnknownPosition)
			}
			for j, e := range rest[:k+1] {
				if j == k && own {
					res.Rejected = append(res.Rejected, RejectedEvent{Event: e, Err: err})
					continue
				}
				n, err := s.applySavepoint(ctx, tx, []StreamEvent{e})
				switch {
				case err == nil:
					res.Applied += n
				case eventFault(ctx, err):
					res.Rejected = append(res.Rejected, RejectedEvent{Event: e, Err: err})
				default:
					return err
				}
			}
			rest, err = rest[k+1:], nil
		}
		// The rejected events are behind the mirror too: its position
		// covers them.
		return recordStreamSeq(ctx, tx, evs)
	})
	if err != nil {
		return StreamResult{}, err
	}
	return res, nil
}

// applySavepoint applies evs in a savepoint of tx, undone when they fail.
func (s *Store) applySavepoint(ctx context.Context, tx *sql.Tx, evs []StreamEvent) (int, error) {
	if _, err := tx.ExecContext(ctx, `SAVEPOINT apply_stream`); err != nil {
		return 0, err
	}
	n, err := s.applyStreamTx(ctx, tx, evs)
	if err != nil {
		if _, rerr := tx.ExecContext(ctx, `ROLLBACK TO apply_stream`); rerr != nil {
			return 0, errors.Join(err, rerr)
		}
	}
	if _, rerr := tx.ExecContext(ctx, `RELEASE apply_stream`); rerr != nil {
		return 0, errors.Join(err, rerr)
	}
	return n, err
}

// eventError is the failure of the index-th event of a batch.
type eventError struct {
	index int
	err   error
}

func (e *eventError) Error() string { return e.err.Error() }
func (e *eventError) Unwrap() error { return e.err }

// eventFault reports whether err, the failure to apply events, may be the
// events' own fault rather than the database's or the caller's: only such
// a failure sets an event aside.
func eventFault(ctx context.Context, err error) bool {
	if ctx.Err() != nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, sql.ErrTxDone) || errors.Is(err, driver.ErrBadConn) {
		return false
	}
	var se *sqlite.Error
	if !errors.As(err, &se) {
		return true // decoding and validation
	}
	switch se.Code() & 0xff {
	case sqlite3.SQLITE_BUSY,
		sqlite3.SQLITE_LOCKED,
		sqlite3.SQLITE_NOMEM,
		sqlite3.SQLITE_INTERRUPT,
		sqlite3.SQLITE_PROTOCOL:
		return false
	}
	return !fileRefused(err)
}

// applyStreamTx is ApplyStreamEvents' work in tx.
func (s *Store) applyStreamTx(ctx context.Context, tx *sql.Tx, evs []StreamEvent) (int, error) {
	fresh, held, known, err := newStreamEvents(ctx, tx, evs)
	if err != nil {
		return 0, err
	}
	if err := recordStreamSeq(ctx, tx, evs); err != nil {
		return 0, err
	}
	// Events of this mirror's own outbox (committed here while it
	// led, and never published) are on the stream now, published by
	// whoever leads: as a leader again it must not publish them anew.
	if err := markPublished(ctx, tx, known, FormatTime(s.now())); err != nil {
		return 0, err
	}
	now := FormatTime(s.now())
	b := newFollowBatch(s, tx, now)
	order := newStreamOrder(tx)
	rows := make([]any, 0, (eventColumns+1)*len(fresh))
	applied := make(map[string]bool, len(fresh))
	for i, e := range evs {
		if held[e.ID] || applied[e.ID] {
			again, err := order.again(ctx, e)
			if err == nil && again {
				err = b.applyAgain(ctx, e)
			}
			if err != nil {
				return 0, &eventError{index: i, err: fmt.Errorf("apply %s event %s of %s again: %w", e.Type, e.ID, e.Subject, err)}
			}
			continue
		}
		applied[e.ID] = true
		scope, err := b.apply(ctx, e)
		if err != nil {
			return 0, &eventError{index: i, err: fmt.Errorf("apply %s event %s of %s: %w", e.Type, e.ID, e.Subject, err)}
		}
		order.applied(e)
		resource, action, _ := strings.Cut(e.Type, ".")
		rows = append(rows, e.ID, e.Type, resource, action, scope, e.Subject, FormatTime(e.Time), string(e.Data), now,
			streamSeqValue(e.Seq))
	}
	if err := b.flush(ctx); err != nil {
		return 0, fmt.Errorf("apply events: %w", err)
	}
	if len(fresh) == 0 {
		return 0, order.record(ctx)
	}
	published := storedTime(fresh, now)
	if err := addHistoryDigest(ctx, tx, b.history); err != nil {
		return 0, err
	}
	// Recorded in stream order; the seqs past the last one before are
	// this batch's, the transaction being the only writer.
	var last int64
	if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM event_log`).Scan(&last); err != nil {
		return 0, fmt.Errorf("read the last event's seq: %w", err)
	}
	if _, err := b.insert(ctx, bulkFollowedEvents, rows); err != nil {
		return 0, fmt.Errorf("record events %s..%s: %w", fresh[0].ID, fresh[len(fresh)-1].ID, err)
	}
	seqs := make([]int64, 0, len(fresh))
	err = queryRows(ctx, tx, `SELECT seq FROM event_log WHERE seq > ?`, []any{last}, func(r *sql.Rows) error {
		var seq int64
		err := r.Scan(&seq)
		seqs = append(seqs, seq)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("read the recorded events' seqs: %w", err)
	}
	if err := order.record(ctx); err != nil {
		return 0, err
	}
	// The stream holds these events already: they are published, when
	// the stream stored them.
	if err := markPublished(ctx, tx, seqs, published); err != nil {
		return 0, err
	}
	// A mirror that holds the stream's events is past its baseline: if
	// this replica becomes the leader, what it crawls next is news.
	if err := s.endBaseline(ctx, tx, now, !s.catchUpDeferred.Load()); err != nil {
		return 0, err
	}
	return len(fresh), nil
}

// storedTime is when the stream stored the first of evs, the batch's
// publication time (one for the batch, so that its events are one run of
// event_publishes): the earliest Stored, no later than now; now when none
// is known. The audit reads the stream from an event's publication time
// on, so a time before an event's own is safe and one after it is not.
func storedTime(evs []StreamEvent, now string) string {
	var first time.Time
	for _, e := range evs {
		if !e.Stored.IsZero() && (first.IsZero() || e.Stored.Before(first)) {
			first = e.Stored
		}
	}
	if first.IsZero() {
		return now
	}
	return min(FormatTime(first), now)
}

// recordStreamSeq records the highest stream sequence of evs as the
// mirror's stream position, in the transaction that applies them.
func recordStreamSeq(ctx context.Context, tx *sql.Tx, evs []StreamEvent) error {
	var top uint64
	for _, e := range evs {
		top = max(top, e.Seq)
	}
	if top == 0 {
		return nil
	}
	if _, err := tx.ExecContext(ctx, setStreamSeqSQL, strconv.FormatUint(top, 10)); err != nil {
		return fmt.Errorf("record stream position %d: %w", top, err)
	}
	return nil
}

// newStreamEvents returns the events of evs the mirror does not hold, each
// once, in order, the ids of those it holds, and the seqs of those it holds
// in its outbox: the ids are looked up together, not one by one.
func newStreamEvents(ctx context.Context, tx *sql.Tx, evs []StreamEvent) (
	[]StreamEvent, map[string]bool, []int64, error,
) {
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.ID
	}
	seen := make(map[string]bool, len(evs))
	var unpublished []int64
	err := queryByUIDs(
		ctx,
		tx,
		`SELECT l.id, o.seq FROM event_log l LEFT JOIN outbox o ON o.seq = l.seq WHERE l.id IN (%s)`,
		ids,
		func(r *sql.Rows) error {
			var id string
			var seq sql.NullInt64
			err := r.Scan(&id, &seq)
			seen[id] = true
			if seq.Valid {
				unpublished = append(unpublished, seq.Int64)
			}
			return err
		},
	)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("look up events: %w", err)
	}
	held := maps.Clone(seen)
	fresh := make([]StreamEvent, 0, len(evs))
	for _, e := range evs {
		if !seen[e.ID] {
			seen[e.ID] = true
			fresh = append(fresh, e)
		}
	}
	return fresh, held, unpublished, nil
}

// apply applies one event's state and returns the event's scope (the
// repo's path, or the artifact name), as the leader recorded it.
func (b *followBatch) apply(ctx context.Context, e StreamEvent) (string, error) {
	if e.Type == TagMatured {
		return b.applyMatured(ctx, e)
	}
	resource, _, _ := strings.Cut(e.Type, ".")
	switch resource {
	case "repo":
		var d struct{ Before, After *Repo }
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return "", fmt.Errorf("decode data: %w", err)
		}
		if d.After != nil {
			return repoPath(*d.After), b.upsertRepo(ctx, *d.After)
		}
		if d.Before == nil {
			return "", errors.New("data has neither before nor after")
		}
		if err := b.upsertRepo(ctx, *d.Before); err != nil {
			return "", err
		}
		if err := b.flush(ctx); err != nil {
			return "", err
		}
		return repoPath(*d.Before), b.s.tombstone(ctx, b.tx, "repos", FormatTime(e.Time), []string{d.Before.UID})
	case "tag":
		d, err := decodedData[tagData](e)
		if err != nil {
			return "", err
		}
		if d.After == nil {
			if d.Before == nil {
				return "", errors.New("data has neither before nor after")
			}
			if err := b.upsertTag(ctx, *d.Before); err != nil {
				return "", err
			}
			if err := b.flush(ctx); err != nil {
				return "", err
			}
			return scopeOf(
					d.Before.Path,
					d.Before.Repo,
				), b.s.tombstone(
					ctx,
					b.tx,
					"tags",
					FormatTime(e.Time),
					[]string{d.Before.UID},
				)
		}
		if err := b.upsertTag(ctx, *d.After); err != nil {
			return "", err
		}
		if e.Type == TagMoved {
			if err := b.flush(ctx); err != nil {
				return "", err
			}
			return scopeOf(d.After.Path, d.After.Repo), b.appendFollowedMove(ctx, e.ID, *d.After, d.Position)
		}
		return scopeOf(d.After.Path, d.After.Repo), nil
	case "advisory":
		return b.applyAdvisory(ctx, e)
	case "history":
		d, err := decodedData[RecordedHistory](e)
		if err != nil {
			return "", err
		}
		// The tag's row and history as the events before left them; the
		// other pending upserts can wait.
		if b.pending[followKey{"tags", d.Tag}] || b.pending[followKey{"history", d.Tag}] {
			if err := b.flush(ctx); err != nil {
				return "", err
			}
		}
		return d.Path, b.appendRecorded(ctx, *d)
	case "crawl":
		return b.applyCrawl(ctx, e)
	}
	return "", fmt.Errorf("unknown resource %q", resource)
}

// applyMatured writes a tag.matured event's record to tag_matured, as the
// leader wrote it with the event, so that this replica, leading, goes on
// from it without announcing it again.
func (b *followBatch) applyMatured(ctx context.Context, e StreamEvent) (string, error) {
	var d MaturedTag
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return "", fmt.Errorf("decode data: %w", err)
	}
	if err := validMatured(d, e.Subject); err != nil {
		return "", err
	}
	if d.MaturedTime.IsZero() {
		d.MaturedTime = d.Since
	}
	st, err := b.stmt(ctx, upsertMaturedSQL)
	if err != nil {
		return "", err
	}
	return d.Repo, upsertMatured(ctx, st, d, e.ID)
}

// appendRecorded stores a history.recorded event's records at their
// positions and, when they continue the tag's history, moves its bookmark
// and digest after them, as the leader's history read did, and marks the
// history read as of the tag's update time, as the leader's read marked
// it: a replica that becomes the leader does not read it again.
//
// The records new to the mirror are queued (recordHistory) and written
// with the batch's other upserts: a row at a time, they were most of a
// follower's time, a baseline's event carrying a tag's whole history. The
// tag's rows are read once, with those after the records: which of them
// the mirror holds already (kept, as an insert that conflicts keeps them),
// and the ones that continue the history past them.
func (b *followBatch) appendRecorded(ctx context.Context, d RecordedHistory) error {
	if len(d.Records) == 0 || d.Tag == "" {
		return errors.New("history.recorded event without a tag or records")
	}
	// A replica that led queued the tags it knew only from the stream in
	// its backfill (BackfillFollowed): the leader has read this one now.
	if _, err := b.exec(ctx, `DELETE FROM backfill WHERE tag_uid = ?`, d.Tag); err != nil {
		return fmt.Errorf("take tag %s out of the backfill: %w", d.Tag, err)
	}
	var old Bookmark
	var lastTime string
	row, err := b.queryRow(
		ctx,
		`SELECT history_count, history_last_count, COALESCE(history_last_time,'') FROM tags WHERE uid = ?`,
		d.Tag,
	)
	if err == nil {
		err = row.Scan(&old.Count, &old.LastCount, &lastTime)
	}
	if err != nil {
		return fmt.Errorf("read bookmark of tag %s: %w", d.Tag, err)
	}
	if old.LastTime, err = ParseTime(lastTime); err != nil {
		return err
	}
	first := d.Records[0].Seq
	for _, r := range d.Records {
		first = min(first, r.Seq)
	}
	stored, err := b.historyFrom(ctx, d.Tag, first)
	if err != nil {
		return err
	}
	var fresh []HistoryRecord
	for _, r := range d.Records {
		at := FormatTime(r.Time)
		if _, ok := stored[r.Seq]; !ok {
			rec := HistoryRecord{Time: r.Time.UTC().Truncate(time.Millisecond), Digest: r.Digest}
			stored[r.Seq] = rec
			b.recordHistory(d.Tag, r.Seq, at, r.Digest)
		}
		if r.Seq == old.Count+len(fresh) {
			fresh = append(fresh, HistoryRecord{Time: r.Time.UTC().Truncate(time.Millisecond), Digest: r.Digest})
		}
	}
	if len(fresh) == 0 {
		return nil
	}
	// Moves after these records that came first (a lost message published
	// again by the leader's audit arrives after the later ones) are in
	// tag_history already: the bookmark and digest go on over them.
	recorded := len(fresh)
	for seq := old.Count + len(fresh); ; seq++ {
		r, ok := stored[seq]
		if !ok {
			break
		}
		fresh = append(fresh, r)
	}
	nb, last := bookmarkAfter(old, fresh), fresh[len(fresh)-1]
	// The tag points where the leader's did after the records: the last
	// one's digest, or the one the event names (a read during the
	// leader's baseline leaves its tag as listed).
	digest := last.Digest
	if d.Digest != "" && len(fresh) == recorded {
		digest = d.Digest
	}
	_, err = b.exec(
		ctx,
		`UPDATE tags SET history_last_time = ?1, history_last_count = ?2, history_count = ?3, history_last_digest = ?4,
			digest = ?6,
		update_time = CASE WHEN update_time IS NULL OR update_time < ?1 THEN ?1 ELSE update_time END,
		history_update_time = CASE WHEN update_time IS NULL OR update_time < ?1 THEN ?1 ELSE update_time END
		WHERE uid = ?5`,
		FormatTime(nb.LastTime),
		nb.LastCount,
		nb.Count,
		last.Digest,
		d.Tag,
		digest,
	)
	if err != nil {
		return fmt.Errorf("move bookmark of tag %s: %w", d.Tag, err)
	}
	return nil
}

// historyFrom returns the records of tag stored at positions from on, by
// position.
func (b *followBatch) historyFrom(ctx context.Context, tag string, from int) (map[int]HistoryRecord, error) {
	st, err := b.stmt(ctx, `SELECT seq, update_time, digest FROM tag_history WHERE tag_uid = ? AND seq >= ?`)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, tag, from)
	if err != nil {
		return nil, fmt.Errorf("read history of tag %s: %w", tag, err)
	}
	defer rows.Close()
	out := map[int]HistoryRecord{}
	for rows.Next() {
		var seq int
		var at, digest string
		if err := rows.Scan(&seq, &at, &digest); err != nil {
			return nil, err
		}
		t, err := ParseTime(at)
		if err != nil {
			return nil, err
		}
		out[seq] = HistoryRecord{Time: t, Digest: digest}
	}
	return out, rows.Err()
}

// appendFollowedMove records a tag.moved event as a history row at the
// position the leader gave it, and moves the tag's bookmark to it, so that
// a follower that becomes the leader continues the history (and the event
// ids, which contain the position) where the old leader left off.
//
// The position is in the event's data (position). An event of an older
// leader lacks it; the position is part of its id, so it is recovered by
// recomputing the id at the positions nearest the bookmark, at most
// maxMoveCandidates of them: an id that matches none of them (a forgery,
// or an id scheme this binary does not know) is rejected with
// ErrUnknownPosition rather than searched for at length.
func (b *followBatch) appendFollowedMove(ctx context.Context, id string, after Tag, position int) error {
	var count, lastCount int
	var lastTime string
	row, err := b.queryRow(
		ctx,
		`SELECT history_count, history_last_count, COALESCE(history_last_time,'') FROM tags WHERE uid = ?`,
		after.UID,
	)
	if err == nil {
		err = row.Scan(&count, &lastCount, &lastTime)
	}
	if err != nil {
		return fmt.Errorf("read bookmark: %w", err)
	}
	at := FormatTime(after.UpdateTime)
	seq := position
	switch {
	case position < 0 || position > maxPosition:
		return fmt.Errorf("history position %d out of range 1..%d", position, maxPosition)
	case position == 0:
		var ok bool
		if seq, ok = movePosition(id, after.UID, at, after.Digest, count); !ok {
			return fmt.Errorf("%w (%d positions around %d)", ErrUnknownPosition, maxMoveCandidates, count)
		}
	}
	res, err := b.exec(
		ctx,
		`INSERT INTO tag_history (tag_uid, seq, update_time, digest) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		after.UID,
		seq,
		at,
		after.Digest,
	)
	if err != nil {
		return fmt.Errorf("insert history: %w", err)
	}
	if n, err := res.RowsAffected(); err != nil {
		return fmt.Errorf("insert history: %w", err)
	} else if n > 0 {
		b.history = append(b.history, after.UID, seq, at, after.Digest)
	}
	if seq < count {
		return nil // an older move arriving late: the bookmark is already past it
	}
	if at == lastTime {
		lastCount++
	} else {
		lastCount = 1
	}
	_, err = b.exec(
		ctx,
		`UPDATE tags SET history_count = ?, history_last_time = ?, history_last_count = ?, history_last_digest = ?,
		history_update_time = ? WHERE uid = ?`,
		seq+1,
		at,
		lastCount,
		after.Digest,
		at,
		after.UID,
	)
	if err != nil {
		return fmt.Errorf("move bookmark: %w", err)
	}
	return nil
}

// maxPosition bounds a move's history position as its data gives it: a
// tag's history is far shorter, and the bookmark (position + 1) must fit.
const maxPosition = 1 << 31

// maxMoveCandidates bounds the positions movePosition tries: a move
// arrives at the position after the bookmark, or (late, redelivered) a
// little before it.
const maxMoveCandidates = 1024

// moveCandidates counts the positions movePosition tried, for tests.
var moveCandidates atomic.Int64

// movePosition finds the history position seq for which a tag.moved event
// of tag at time at to digest has the given id (see ApplyHistory), trying
// hint (the position after the bookmark) first, then the positions below
// it, nearest first, then those above it: maxMoveCandidates at most.
func movePosition(id, tag, at, digest string, hint int) (int, bool) {
	hint = max(hint, 1)
	tries := 0
	try := func(seq int) bool {
		tries++
		moveCandidates.Add(1)
		return eventID(TagMoved, tag, moveDisc(seq, at, digest)) == id
	}
	for seq := hint; seq >= 1 && tries < maxMoveCandidates; seq-- {
		if try(seq) {
			return seq, true
		}
	}
	for seq := hint + 1; tries < maxMoveCandidates; seq++ {
		if try(seq) {
			return seq, true
		}
	}
	return 0, false
}

// unresolvedTags selects (of tags t and their repos r) the live tags whose
// history position is unknown: tags a follower learned from the stream (a
// snapshot, or a creation) with no history record since.
const unresolvedTags = `t.baseline = 1 AND t.history_count = 0 AND t.deleted_time IS NULL AND r.deleted_time IS NULL`

// UnresolvedTags returns the live tags whose history position is unknown:
// tags a follower learned from the stream (a snapshot, or a creation) with
// no move since. BackfillFollowed queues them when the replica becomes the
// leader.
func (s *Store) UnresolvedTags(ctx context.Context) ([]TagRef, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT t.uid, t.repo_uid, r.name, r.path, t.name, COALESCE(t.update_time,'')
		FROM tags t JOIN repos r ON r.uid = t.repo_uid WHERE `+unresolvedTags+` ORDER BY t.uid`)
	if err != nil {
		return nil, fmt.Errorf("read unresolved tags: %w", err)
	}
	defer rows.Close()
	var out []TagRef
	for rows.Next() {
		var ref TagRef
		var ut string
		if err := rows.Scan(&ref.UID, &ref.RepoUID, &ref.Repo, &ref.Path, &ref.Name, &ut); err != nil {
			return nil, err
		}
		ref.Path = scopeOf(ref.Path, ref.Repo)
		if ref.UpdateTime, err = ParseTime(ut); err != nil {
			return nil, err
		}
		out = append(out, ref)
	}
	return out, rows.Err()
}

// BackfillFollowed readies a mirror built from the stream for crawling,
// when its replica becomes the leader, and returns how many tags it
// queued. The tags it knows only from the stream (UnresolvedTags) are what
// the old leader's backfill held: tags whose history it had not read, or
// whose records it had not published. They go into this mirror's backfill
// with their update time as the old leader's listing showed it, so that
// the backfill reads them behind the first crawl as the old leader's would
// have: the records up to that time silently (history.recorded), the later
// ones as moves, with the positions, and so the ids, the old leader would
// have given them.
func (s *Store) BackfillFollowed(ctx context.Context) (int64, error) {
	var n int64
	err := s.tx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `INSERT INTO backfill (tag_uid, listed_time)
			SELECT t.uid, t.update_time FROM tags t JOIN repos r ON r.uid = t.repo_uid WHERE `+unresolvedTags+`
			ON CONFLICT(tag_uid) DO NOTHING`)
		if err != nil {
			return err
		}
		n, err = res.RowsAffected()
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("queue the followed tags for the backfill: %w", err)
	}
	return n, nil
}
