package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// HistoryRecord is one entry of a tag's digest history.
type HistoryRecord struct {
	Time   time.Time
	Digest string
}

// Bookmark is where a tag's history walk stopped: the newest record's time
// and how many records share it.
type Bookmark struct {
	LastTime  time.Time
	LastCount int
	Count     int
}

// moveDisc tells a tag's moves apart in their event ids: the position in
// the history, its time and the new digest. Followers recompute it to
// place a move they received (see movePosition).
func moveDisc(seq int, at, digest string) string { return fmt.Sprintf("%d/%s/%s", seq, at, digest) }

// historyColumns is how many values one tag_history row takes.
const historyColumns = 4

// ApplyHistory appends the records of ref's history that the mirror does not
// have yet and records one tag.moved event per new record that has a
// predecessor, in order. records must be oldest first and hold everything from
// the bookmark time the caller started at (ref.Bookmark.LastTime) onwards: the
// store drops what it already has, comparing against its own bookmark inside
// the transaction, so overlapping or concurrent reads cannot duplicate rows.
// When complete is set, the walk reached the newest record and the tag is
// marked as read up to ref.UpdateTime.
func (s *Store) ApplyHistory(ctx context.Context, ref TagRef, records []HistoryRecord, complete bool) (events int, err error) {
	return s.ApplyHistories(ctx, []HistoryUpdate{{Ref: ref, Records: records, Complete: complete}})
}

// HistoryUpdate is one tag's history read, as ApplyHistory takes it.
type HistoryUpdate struct {
	Ref      TagRef
	Records  []HistoryRecord
	Complete bool
}

// ApplyHistories applies several tags' history reads in one transaction,
// each exactly as ApplyHistory would, and returns how many events they
// recorded. A commit per tag was most of an initial sync's cost; the
// crawler batches the reads that finish together.
func (s *Store) ApplyHistories(ctx context.Context, ups []HistoryUpdate) (events int, err error) {
	n, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		total := 0
		for _, u := range ups {
			n, err := s.applyHistory(ctx, tx, baseline, u.Ref, storedPrecision(u.Records), u.Complete)
			if err != nil {
				return 0, fmt.Errorf("apply %d history records of tag %s:%s: %w", len(u.Records), u.Ref.Repo, u.Ref.Name, err)
			}
			total += n
		}
		return total, nil
	})
	if err != nil {
		return 0, err
	}
	return n, nil
}

// applyHistory is ApplyHistory's work inside a transaction.
func (s *Store) applyHistory(ctx context.Context, tx *sql.Tx, baseline bool, ref TagRef, records []HistoryRecord, complete bool) (int, error) {
	old, err := loadTags(ctx, tx, `t.uid IN (%s)`, []string{ref.UID})
	if err != nil {
		return 0, err
	}
	st, ok := old[ref.UID]
	if !ok {
		return 0, fmt.Errorf("read bookmark: tag %s is not in the mirror", ref.UID)
	}
	b, cur := st.bookmark, st.Tag
	cur.RepoUID, cur.Repo = ref.RepoUID, ref.Repo

	fresh := newRecords(records, b)
	// A tag's first history read during the baseline, or for a tag the
	// baseline found, is the starting point: its past moves are not news.
	silent := baseline || (st.baseline && b.Count == 0)
	var cs []change
	prev := st.historyLastDigest
	args := make([]any, 0, historyColumns*len(fresh))
	for i, r := range fresh {
		seq := b.Count + i
		if seq > 0 && !silent {
			before, after := cur, cur
			before.Digest, after.Digest = prev, r.Digest
			after.UpdateTime = r.Time
			cs = append(cs, change{typ: TagMoved, scope: ref.Repo, subject: ref.UID,
				disc: moveDisc(seq, FormatTime(r.Time), r.Digest), time: r.Time, before: before, after: after})
		}
		prev = r.Digest
		args = append(args, ref.UID, seq, FormatTime(r.Time), r.Digest)
	}
	if _, err := s.insertRows(ctx, tx, bulkHistory, args); err != nil {
		return 0, fmt.Errorf("insert history: %w", err)
	}
	if len(fresh) > 0 {
		nb := bookmarkAfter(b, fresh)
		if _, err := tx.ExecContext(ctx, `UPDATE tags SET history_last_time = ?, history_last_count = ?, history_count = ?, history_last_digest = ? WHERE uid = ?`,
			FormatTime(nb.LastTime), nb.LastCount, nb.Count, prev, ref.UID); err != nil {
			return 0, fmt.Errorf("move bookmark: %w", err)
		}
	}
	if complete {
		if _, err := tx.ExecContext(ctx, `UPDATE tags SET history_update_time = ? WHERE uid = ?`, FormatTime(ref.UpdateTime), ref.UID); err != nil {
			return 0, fmt.Errorf("mark history read: %w", err)
		}
	}
	return s.appendEvents(ctx, tx, cs)
}

// storedPrecision returns records with times cut to the millisecond the
// mirror stores, so that comparisons with the stored bookmark are exact.
func storedPrecision(records []HistoryRecord) []HistoryRecord {
	out := make([]HistoryRecord, len(records))
	for i, r := range records {
		out[i] = HistoryRecord{Time: r.Time.UTC().Truncate(time.Millisecond), Digest: r.Digest}
	}
	return out
}

// newRecords drops the records the bookmark says the mirror already has:
// everything older than its last time, and the first LastCount records at it.
func newRecords(records []HistoryRecord, b Bookmark) []HistoryRecord {
	if b.Count == 0 {
		return records
	}
	skip := b.LastCount
	out := records[:0:0]
	for _, r := range records {
		switch {
		case r.Time.Before(b.LastTime):
		case r.Time.Equal(b.LastTime) && skip > 0:
			skip--
		default:
			out = append(out, r)
		}
	}
	return out
}

func bookmarkAfter(b Bookmark, fresh []HistoryRecord) Bookmark {
	last := fresh[len(fresh)-1].Time
	n := 0
	for i := len(fresh) - 1; i >= 0 && fresh[i].Time.Equal(last); i-- {
		n++
	}
	if n == len(fresh) && last.Equal(b.LastTime) {
		n += b.LastCount
	}
	return Bookmark{LastTime: last, LastCount: n, Count: b.Count + len(fresh)}
}
