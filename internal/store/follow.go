package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
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
}

// maxRecoverSeq bounds the search for a move's position in its tag's
// history; histories are far shorter.
const maxRecoverSeq = 1 << 17

// ApplyStreamEvents applies events, in order, in one transaction, skipping
// those already in the mirror, and returns how many it applied. An event it
// cannot decode fails the whole batch, naming the event.
func (s *Store) ApplyStreamEvents(ctx context.Context, evs []StreamEvent) (int, error) {
	applied := 0
	err := s.tx(ctx, func(tx *sql.Tx) error {
		fresh, known, err := newStreamEvents(ctx, tx, evs)
		if err != nil {
			return err
		}
		if err := recordStreamSeq(ctx, tx, evs); err != nil {
			return err
		}
		// Events of this mirror's own outbox (committed here while it
		// led, and never published) are on the stream now, published by
		// whoever leads: as a leader again it must not publish them anew.
		if err := markPublished(ctx, tx, known, FormatTime(s.now())); err != nil {
			return err
		}
		applied = len(fresh)
		if applied == 0 {
			return nil
		}
		now := FormatTime(s.now())
		b := newFollowBatch(s, tx, now)
		rows := make([]any, 0, eventColumns*len(fresh))
		for _, e := range fresh {
			scope, err := b.apply(ctx, e)
			if err != nil {
				return fmt.Errorf("apply %s event %s of %s: %w", e.Type, e.ID, e.Subject, err)
			}
			resource, action, _ := strings.Cut(e.Type, ".")
			rows = append(rows, e.ID, e.Type, resource, action, scope, e.Subject, FormatTime(e.Time), string(e.Data), now)
		}
		if err := b.flush(ctx); err != nil {
			return fmt.Errorf("apply events %s..%s: %w", fresh[0].ID, fresh[len(fresh)-1].ID, err)
		}
		if err := addHistoryDigest(ctx, tx, b.history); err != nil {
			return err
		}
		// Recorded in stream order; the seqs past the last one before are
		// this batch's, the transaction being the only writer.
		var last int64
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM event_log`).Scan(&last); err != nil {
			return fmt.Errorf("read the last event's seq: %w", err)
		}
		if _, err := b.insert(ctx, bulkEvents, rows); err != nil {
			return fmt.Errorf("record events %s..%s: %w", fresh[0].ID, fresh[len(fresh)-1].ID, err)
		}
		seqs := make([]int64, 0, len(fresh))
		err = queryRows(ctx, tx, `SELECT seq FROM event_log WHERE seq > ?`, []any{last}, func(r *sql.Rows) error {
			var seq int64
			err := r.Scan(&seq)
			seqs = append(seqs, seq)
			return err
		})
		if err != nil {
			return fmt.Errorf("read the recorded events' seqs: %w", err)
		}
		// The stream holds these events already: they are published.
		if err := markPublished(ctx, tx, seqs, now); err != nil {
			return err
		}
		// A mirror that holds the stream's events is past its baseline: if
		// this replica becomes the leader, what it crawls next is news.
		return s.endBaseline(ctx, tx, now, true)
	})
	if err != nil {
		return 0, err
	}
	return applied, nil
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
// once, in order, and the seqs of those it holds in its outbox: the ids are
// looked up together, not one by one.
func newStreamEvents(ctx context.Context, tx *sql.Tx, evs []StreamEvent) ([]StreamEvent, []int64, error) {
	ids := make([]string, len(evs))
	for i, e := range evs {
		ids[i] = e.ID
	}
	seen := make(map[string]bool, len(evs))
	var unpublished []int64
	err := queryByUIDs(ctx, tx, `SELECT l.id, o.seq FROM event_log l LEFT JOIN outbox o ON o.seq = l.seq WHERE l.id IN (%s)`, ids, func(r *sql.Rows) error {
		var id string
		var seq sql.NullInt64
		err := r.Scan(&id, &seq)
		seen[id] = true
		if seq.Valid {
			unpublished = append(unpublished, seq.Int64)
		}
		return err
	})
	if err != nil {
		return nil, nil, fmt.Errorf("look up events: %w", err)
	}
	fresh := make([]StreamEvent, 0, len(evs))
	for _, e := range evs {
		if !seen[e.ID] {
			seen[e.ID] = true
			fresh = append(fresh, e)
		}
	}
	return fresh, unpublished, nil
}

// apply applies one event's state and returns the event's scope (the
// repo's path, or the artifact name), as the leader recorded it.
func (b *followBatch) apply(ctx context.Context, e StreamEvent) (string, error) {
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
		return repoPath(*d.Before), tombstone(ctx, b.tx, "repos", FormatTime(e.Time), []string{d.Before.UID})
	case "tag":
		var d struct{ Before, After *Tag }
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return "", fmt.Errorf("decode data: %w", err)
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
			return scopeOf(d.Before.Path, d.Before.Repo), tombstone(ctx, b.tx, "tags", FormatTime(e.Time), []string{d.Before.UID})
		}
		if err := b.upsertTag(ctx, *d.After); err != nil {
			return "", err
		}
		if e.Type == TagMoved {
			if err := b.flush(ctx); err != nil {
				return "", err
			}
			return scopeOf(d.After.Path, d.After.Repo), b.appendFollowedMove(ctx, e.ID, *d.After)
		}
		return scopeOf(d.After.Path, d.After.Repo), nil
	case "advisory":
		return b.applyAdvisory(ctx, e)
	case "history":
		var d RecordedHistory
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return "", fmt.Errorf("decode data: %w", err)
		}
		if err := b.flush(ctx); err != nil {
			return "", err
		}
		return d.Path, b.appendRecorded(ctx, d)
	}
	return "", fmt.Errorf("unknown resource %q", resource)
}

// appendRecorded stores a history.recorded event's records at their
// positions and, when they continue the tag's history, moves its bookmark
// and digest after them, as the leader's history read did.
func (b *followBatch) appendRecorded(ctx context.Context, d RecordedHistory) error {
	if len(d.Records) == 0 || d.Tag == "" {
		return errors.New("history.recorded event without a tag or records")
	}
	var old Bookmark
	var lastTime string
	row, err := b.queryRow(ctx, `SELECT history_count, history_last_count, COALESCE(history_last_time,'') FROM tags WHERE uid = ?`, d.Tag)
	if err == nil {
		err = row.Scan(&old.Count, &old.LastCount, &lastTime)
	}
	if err != nil {
		return fmt.Errorf("read bookmark of tag %s: %w", d.Tag, err)
	}
	if old.LastTime, err = ParseTime(lastTime); err != nil {
		return err
	}
	var fresh []HistoryRecord
	for _, r := range d.Records {
		at := FormatTime(r.Time)
		res, err := b.exec(ctx, `INSERT INTO tag_history (tag_uid, seq, update_time, digest) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
			d.Tag, r.Seq, at, r.Digest)
		if err != nil {
			return fmt.Errorf("insert history of tag %s: %w", d.Tag, err)
		}
		if n, err := res.RowsAffected(); err != nil {
			return err
		} else if n > 0 {
			b.history = append(b.history, d.Tag, r.Seq, at, r.Digest)
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
	later, err := b.historyFrom(ctx, d.Tag, old.Count+len(fresh))
	if err != nil {
		return err
	}
	fresh = append(fresh, later...)
	nb, last := bookmarkAfter(old, fresh), fresh[len(fresh)-1]
	_, err = b.exec(ctx, `UPDATE tags SET history_last_time = ?1, history_last_count = ?2, history_count = ?3, history_last_digest = ?4, digest = ?4,
		update_time = CASE WHEN update_time IS NULL OR update_time < ?1 THEN ?1 ELSE update_time END WHERE uid = ?5`,
		FormatTime(nb.LastTime), nb.LastCount, nb.Count, last.Digest, d.Tag)
	if err != nil {
		return fmt.Errorf("move bookmark of tag %s: %w", d.Tag, err)
	}
	return nil
}

// historyFrom returns the records of tag stored at positions from on
// without a gap, oldest first.
func (b *followBatch) historyFrom(ctx context.Context, tag string, from int) ([]HistoryRecord, error) {
	st, err := b.stmt(ctx, `SELECT seq, update_time, digest FROM tag_history WHERE tag_uid = ? AND seq >= ? ORDER BY seq`)
	if err != nil {
		return nil, err
	}
	rows, err := st.QueryContext(ctx, tag, from)
	if err != nil {
		return nil, fmt.Errorf("read history of tag %s: %w", tag, err)
	}
	defer rows.Close()
	var out []HistoryRecord
	for rows.Next() {
		var seq int
		var at, digest string
		if err := rows.Scan(&seq, &at, &digest); err != nil {
			return nil, err
		}
		if seq != from+len(out) {
			break
		}
		t, err := ParseTime(at)
		if err != nil {
			return nil, err
		}
		out = append(out, HistoryRecord{Time: t, Digest: digest})
	}
	return out, rows.Err()
}

// appendFollowedMove records a tag.moved event as a history row at the
// position the leader gave it, and moves the tag's bookmark to it, so that
// a follower that becomes the leader continues the history (and the event
// ids, which contain the position) where the old leader left off.
//
// The position is not in the event's data but is part of its id, so it is
// recovered by recomputing the id: first at the position after the
// bookmark (the usual case), then by search. Should the id not match any
// position (an id scheme this binary does not know), the row goes after the
// mirror's last one.
func (b *followBatch) appendFollowedMove(ctx context.Context, id string, after Tag) error {
	var count, lastCount int
	var lastTime string
	row, err := b.queryRow(ctx, `SELECT history_count, history_last_count, COALESCE(history_last_time,'') FROM tags WHERE uid = ?`, after.UID)
	if err == nil {
		err = row.Scan(&count, &lastCount, &lastTime)
	}
	if err != nil {
		return fmt.Errorf("read bookmark: %w", err)
	}
	at := FormatTime(after.UpdateTime)
	seq, ok := movePosition(id, after.UID, at, after.Digest, count)
	if !ok {
		seq = max(count, 1)
		b.s.log.Warn("cannot tell the position of a followed move from its id; appending it", "event", id, "tag", after.UID, "seq", seq)
	}
	res, err := b.exec(ctx, `INSERT INTO tag_history (tag_uid, seq, update_time, digest) VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING`,
		after.UID, seq, at, after.Digest)
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
	_, err = b.exec(ctx, `UPDATE tags SET history_count = ?, history_last_time = ?, history_last_count = ?, history_last_digest = ?,
		history_update_time = ? WHERE uid = ?`, seq+1, at, lastCount, after.Digest, at, after.UID)
	if err != nil {
		return fmt.Errorf("move bookmark: %w", err)
	}
	return nil
}

// movePosition finds the history position seq for which a tag.moved event
// of tag at time at to digest has the given id (see ApplyHistory).
func movePosition(id, tag, at, digest string, hint int) (int, bool) {
	try := func(seq int) bool { return eventID(TagMoved, tag, moveDisc(seq, at, digest)) == id }
	if hint > 0 && try(hint) {
		return hint, true
	}
	for seq := 1; seq < maxRecoverSeq; seq++ {
		if try(seq) {
			return seq, true
		}
	}
	return 0, false
}

// UnresolvedTags returns the live tags whose history position is unknown:
// tags a follower learned from the stream (a snapshot, or a creation) with
// no move since. ResolveHistory settles them when the replica becomes the
// leader.
func (s *Store) UnresolvedTags(ctx context.Context) ([]TagRef, error) {
	rows, err := s.r.QueryContext(ctx, `SELECT t.uid, t.repo_uid, r.name, r.path, t.name, COALESCE(t.update_time,'')
		FROM tags t JOIN repos r ON r.uid = t.repo_uid
		WHERE t.baseline = 1 AND t.history_count = 0 AND t.deleted_time IS NULL AND r.deleted_time IS NULL ORDER BY t.uid`)
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

// ResolveHistory gives a tag from UnresolvedTags the history the old leader
// had: records (the tag's whole history, oldest first) up to the tag's
// last known update time are stored silently, as the old leader stored them
// at its baseline, and the bookmark is set after them. The next crawl then
// announces only the later records, with the positions, and so the ids, the
// old leader would have given them. It returns how many records it stored.
func (s *Store) ResolveHistory(ctx context.Context, ref TagRef, records []HistoryRecord) (int, error) {
	records = storedPrecision(records)
	known := records[:0:0]
	for _, r := range records {
		if ref.UpdateTime.IsZero() || !r.Time.After(ref.UpdateTime.UTC().Truncate(time.Millisecond)) {
			known = append(known, r)
		}
	}
	if len(known) == 0 {
		return 0, nil // nothing to anchor on: the tag stays baseline, read silently
	}
	// The records go on the stream as a replication record, so that the
	// followers hold them too.
	_, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		// Only a tag with no history yet is resolved: one that a move
		// already placed, or a second resolution, is left alone.
		var count int
		if err := tx.QueryRowContext(ctx, `SELECT history_count FROM tags WHERE uid = ?`, ref.UID).Scan(&count); err != nil || count > 0 {
			return 0, err
		}
		args := make([]any, 0, historyColumns*len(known))
		for i, r := range known {
			args = append(args, ref.UID, i, FormatTime(r.Time), r.Digest)
		}
		if _, err := s.insertRows(ctx, tx, bulkHistory, args); err != nil {
			return 0, fmt.Errorf("insert history: %w", err)
		}
		if err := addHistoryDigest(ctx, tx, args); err != nil {
			return 0, err
		}
		nb := bookmarkAfter(Bookmark{}, known)
		_, err := tx.ExecContext(ctx, `UPDATE tags SET history_last_time = ?, history_last_count = ?, history_count = ?, history_last_digest = ?, baseline = 0
			WHERE uid = ?`, FormatTime(nb.LastTime), nb.LastCount, nb.Count, known[len(known)-1].Digest, ref.UID)
		if err != nil {
			return 0, err
		}
		return s.appendEvents(ctx, tx, []change{recordedChange(ref.UID, ref.Path, 0, known)})
	})
	if err != nil {
		return 0, fmt.Errorf("resolve history of tag %s:%s: %w", ref.Repo, ref.Name, err)
	}
	return len(known), nil
}
