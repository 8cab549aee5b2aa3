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
func (s *Store) ApplyHistory(
	ctx context.Context,
	ref TagRef,
	records []HistoryRecord,
	complete bool,
) (events int, err error) {
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
		for len(ups) > 0 {
			// A tag read twice in one batch is applied in two steps, the
			// second on the bookmark the first moved.
			k := distinctPrefix(ups)
			n, err := s.applyHistories(ctx, tx, baseline, ups[:k])
			if err != nil {
				return 0, err
			}
			total += n
			ups = ups[k:]
		}
		return total, nil
	})
	if err != nil {
		return 0, err
	}
	s.signalHistory()
	return n, nil
}

// distinctPrefix returns how many of ups, from the first, are of distinct tags.
func distinctPrefix(ups []HistoryUpdate) int {
	seen := make(map[string]bool, len(ups))
	for i, u := range ups {
		if seen[u.Ref.UID] {
			return i
		}
		seen[u.Ref.UID] = true
	}
	return len(ups)
}

// applyHistories is ApplyHistories' work inside a transaction for updates
// of distinct tags. It reads the tags' bookmarks in one query, writes every
// tag's new records in the same multi-row INSERTs, and moves the bookmarks
// with one prepared statement: statements per tag, each parsed anew, were
// what most of an initial sync's writing cost beyond the rows themselves.
func (s *Store) applyHistories(ctx context.Context, tx *sql.Tx, baseline bool, ups []HistoryUpdate) (int, error) {
	uids := make([]string, len(ups))
	for i, u := range ups {
		uids[i] = u.Ref.UID
	}
	old, err := loadTags(ctx, tx, `t.uid IN (%s)`, uids, false)
	if err != nil {
		return 0, err
	}
	var args []any
	// cs are the moves, recorded the replication records, which are not
	// counted as events: they change no resource.
	var cs, recorded []change
	// creations announce the tags read for the first time, ahead of
	// their replication records and moves.
	var creations []change
	// backfilled are the tags of the backfill read now.
	var backfilled []string
	type bookmarkRow struct {
		ref      TagRef
		b        Bookmark
		digest   string
		complete bool
		// moved: the read appended records, so the tag points at the
		// newest one's digest.
		moved bool
	}
	marks := make([]bookmarkRow, 0, len(ups))
	for _, u := range ups {
		ref := u.Ref
		st, ok := old[ref.UID]
		if !ok {
			return 0, fmt.Errorf(
				"apply %d history records of tag %s:%s: read bookmark: tag %s is not in the mirror",
				len(u.Records),
				ref.Repo,
				ref.Name,
				ref.UID,
			)
		}
		b, cur := st.bookmark, st.Tag
		cur.RepoUID, cur.Repo, cur.Path = ref.RepoUID, ref.Repo, scopeOf(st.Path, ref.Path)
		fresh := newRecords(storedPrecision(u.Records), b)
		if baseline {
			// A read during the baseline stops at the listing it was asked
			// for: a move after that is news once the baseline ends. The
			// records left out come after the bookmark, so the next read
			// (the listing shows the move) gets them, as tag.moved events.
			fresh = upToListing(fresh, ref.UpdateTime, st.Digest, st.historyLastDigest)
		}
		quiet := silentRecords(fresh, baseline, st)
		if st.backfill {
			backfilled = append(backfilled, ref.UID)
		}
		// before is the tag as the previous record left it: its digest and
		// its time.
		prev, prevTime := st.historyLastDigest, b.LastTime
		// What is stored without a move (the first record, or a silent
		// read's) goes on the stream as a replication record, so that
		// followers hold the whole history: the backfill's reads, and
		// those made during the baseline in the places its listings
		// leave free (crawler: spare reads).
		if unannounced := unannouncedRecords(fresh, b.Count, quiet); unannounced > 0 {
			// The tag points at the last of them, but during the baseline,
			// where it stays as listed (see the bookmarks' update below).
			after := fresh[unannounced-1].Digest
			if baseline {
				after = st.Digest
			}
			recorded = append(recorded, recordedChange(ref.UID, cur.Path, b.Count, fresh[:unannounced], after))
		}
		if !baseline && b.Count == 0 && !st.baseline && !st.backfill && !st.deleted && (len(fresh) > 0 || u.Complete) {
			// The tag's first read: it is announced now, as it was
			// created, before its moves (see ApplyTags).
			created := cur
			if len(fresh) > 0 {
				created.Digest, created.UpdateTime = fresh[0].Digest, fresh[0].Time
			}
			// The id does not depend on the records read: a first read
			// that found none (the tag is announced as listed) and the
			// next one, which finds some, record the same event once.
			creations = append(creations, change{typ: TagCreated, scope: cur.Path, subject: ref.UID,
				disc: firstReadDisc(cur.CreateTime, st.deletions), time: eventTime(cur.CreateTime, s.now()),
				after: created})
		}
		for i, r := range fresh {
			seq := b.Count + i
			if seq > 0 && i >= quiet {
				before, after := cur, cur
				before.Digest, after.Digest = prev, r.Digest
				before.UpdateTime, after.UpdateTime = prevTime, r.Time
				cs = append(cs, change{typ: TagMoved, scope: cur.Path, subject: ref.UID,
					disc: moveDisc(seq, FormatTime(r.Time), r.Digest), time: r.Time, before: before, after: after, position: seq})
			}
			prev, prevTime = r.Digest, r.Time
			args = append(args, ref.UID, seq, FormatTime(r.Time), r.Digest)
		}
		if len(fresh) > 0 || u.Complete {
			nb := b
			if len(fresh) > 0 {
				nb = bookmarkAfter(b, fresh)
			}
			marks = append(marks, bookmarkRow{ref: ref, b: nb, digest: prev, complete: u.Complete, moved: len(fresh) > 0})
		}
	}
	if _, err := s.insertRows(ctx, tx, bulkHistory, args); err != nil {
		return 0, fmt.Errorf("insert history of %d tags: %w", len(ups), err)
	}
	if err := addHistoryDigest(ctx, tx, args); err != nil {
		return 0, err
	}
	if len(marks) > 0 {
		// history_update_time moves only when the walk was complete. The
		// tag's digest is its newest record's, written with the records
		// and their tag.moved events: a snapshot copied between this read
		// and the next listing (a pushed move is read before any listing
		// shows it) must not hold the events without the state they
		// announce, since a follower that restores it skips them by id.
		stmt, err := tx.PrepareContext(
			ctx,
			`UPDATE tags SET history_last_time = ?1, history_last_count = ?2, history_count = ?3,
			history_last_digest = ?4, history_update_time = COALESCE(?5, history_update_time),
			digest = CASE WHEN ?6 AND NOT ?8 THEN ?4 ELSE digest END,
			update_time = CASE WHEN ?6 AND NOT ?8 AND (update_time IS NULL OR update_time < ?1) THEN ?1 ELSE update_time END
			WHERE uid = ?7`,
		)
		if err != nil {
			return 0, fmt.Errorf("move bookmarks: %w", err)
		}
		defer stmt.Close()
		for _, m := range marks {
			var read any
			if m.complete {
				read = FormatTime(m.ref.UpdateTime)
			}
			var last any
			if !m.b.LastTime.IsZero() {
				last = FormatTime(m.b.LastTime)
			}
			// During the baseline the tag's state is its listing's, which
			// a read that ended before a later listing must not take back.
			_, err := stmt.ExecContext(ctx, last, m.b.LastCount, m.b.Count, m.digest, read, m.moved, m.ref.UID, baseline)
			if err != nil {
				return 0, fmt.Errorf("move bookmark of tag %s:%s: %w", m.ref.Repo, m.ref.Name, err)
			}
		}
	}
	if err := s.backfillDone(ctx, tx, backfilled); err != nil {
		return 0, err
	}
	created, err := s.appendEvents(ctx, tx, creations)
	if err != nil {
		return 0, err
	}
	if _, err := s.appendEvents(ctx, tx, recorded); err != nil {
		return 0, err
	}
	moves, err := s.appendEvents(ctx, tx, cs)
	if err != nil {
		return 0, err
	}
	listed, err := s.applyListed(ctx, tx, baseline, ups)
	return created + moves + listed, err
}

// applyListed applies, after the moves of their reads, the listing's state
// that ApplyTags held back from the tags of ups (TagRef.Listed): a
// deprecation seen with a move is recorded at the digest the move left.
// A tag whose read did not reach the listed digest is held back again,
// for the next listing to try; what that asks to read is left to it. A
// listing older than what the mirror holds (a push's read and a crawl's of
// the same tag, committed out of order) or of a tag deleted since is not
// applied: it would take the tag back.
func (s *Store) applyListed(ctx context.Context, tx *sql.Tx, baseline bool, ups []HistoryUpdate) (int, error) {
	n := 0
	for _, u := range ups {
		ref := u.Ref
		if ref.Listed == nil {
			continue
		}
		var deleted bool
		var updated sql.NullString
		err := tx.QueryRowContext(ctx, `SELECT deleted_time IS NOT NULL, update_time FROM tags WHERE uid = ?`, ref.UID).
			Scan(&deleted, &updated)
		if err != nil {
			return 0, fmt.Errorf("read tag %s:%s before applying its listing: %w", ref.Repo, ref.Name, err)
		}
		if deleted || updated.Valid && updated.String > FormatTime(ref.Listed.UpdateTime) {
			continue
		}
		_, events, err := s.applyTags(ctx, tx, baseline, Repo{UID: ref.RepoUID, Name: ref.Repo, Path: ref.Path},
			[]Tag{*ref.Listed})
		if err != nil {
			return 0, fmt.Errorf("apply the listed state of tag %s:%s after its history: %w", ref.Repo, ref.Name, err)
		}
		n += events
	}
	return n, nil
}

// upToListing returns the records of fresh (which follow a history ending
// at before) up to the update time a listing showed with digest (all of
// them when it showed no time). The platform does not say that a tag's
// updateTime is its newest record's time: a record of the listed digest
// just after that time, where the records up to it end elsewhere, is the
// one the listing showed, and is kept too.
func upToListing(fresh []HistoryRecord, listed time.Time, digest, before string) []HistoryRecord {
	if listed.IsZero() {
		return fresh
	}
	cutoff := listed.UTC().Truncate(time.Millisecond)
	n := 0
	for n < len(fresh) && !fresh[n].Time.After(cutoff) {
		n++
	}
	if n > 0 {
		before = fresh[n-1].Digest
	}
	if n < len(fresh) && before != digest && fresh[n].Digest == digest {
		n++
	}
	return fresh[:n]
}

// silentRecords is how many of the fresh records of the tag st, from the
// first, are the starting point rather than news, and so no tag.moved
// events: every record read during the baseline; of a tag the backfill
// reads, those up to the update time the first complete listing showed
// (later ones are moves made after it, announced as any move); of the
// first read of another tag the baseline found (its repo's baseline was
// pending), all.
func silentRecords(fresh []HistoryRecord, baseline bool, st storedTag) int {
	switch {
	case baseline:
		return len(fresh)
	case st.backfill && !st.listedTime.IsZero():
		return len(upToListing(fresh, st.listedTime, st.Digest, st.historyLastDigest))
	case st.backfill, st.baseline && st.bookmark.Count == 0:
		return len(fresh)
	}
	return 0
}

// unannouncedRecords is how many of the fresh records, the first at
// position first, are stored without a tag.moved event: the quiet ones,
// and at least the tag's first record.
func unannouncedRecords(fresh []HistoryRecord, first, quiet int) int {
	if first == 0 && len(fresh) > 0 {
		return max(quiet, 1)
	}
	return quiet
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
