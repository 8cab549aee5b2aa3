package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// Event kinds of the event contract.
const (
	RepoCreated       = "repo.created"
	RepoUpdated       = "repo.updated"
	RepoDeleted       = "repo.deleted"
	TagCreated        = "tag.created"
	TagMoved          = "tag.moved"
	TagDeprecated     = "tag.deprecated"
	TagDeleted        = "tag.deleted"
	AdvisoryCreated   = "advisory.created"
	AdvisoryUpdated   = "advisory.updated"
	AdvisoryWithdrawn = "advisory.withdrawn"
	// HistoryRecorded carries history records the mirror stored without a
	// tag.moved event (a tag's first record, the history of a tag whose
	// baseline was pending, a history a new leader settled), so that a
	// follower holds the whole history too. It is a replication record,
	// not a change of a resource: consumers of the resources' subjects
	// never see it.
	HistoryRecorded = "history.recorded"
	// CrawlFailed and CrawlRecovered carry the leader's crawl_failures:
	// a scope failed once more (with its backoff), or read again. They are
	// replication records, so that a standby that takes over holds back
	// what the old leader held back rather than trying every failing
	// scope at once.
	CrawlFailed    = "crawl.failed"
	CrawlRecovered = "crawl.recovered"
)

// RecordedHistory is a history.recorded event's data.
type RecordedHistory struct {
	Tag     string           `json:"tag"`
	Path    string           `json:"path"`
	Records []RecordedRecord `json:"records"`
	// Digest is the tag's digest after the records, when it is not the
	// last record's: a read during the baseline leaves the tag as its
	// newest listing showed it, which may be past the records (the tag
	// listed again, moved, before the read was stored). Empty otherwise,
	// and in the events of a syncd before it.
	Digest string `json:"digest,omitempty"`
}

// RecordedRecord is one record of RecordedHistory, at its position.
type RecordedRecord struct {
	Seq    int       `json:"seq"`
	Time   time.Time `json:"time"`
	Digest string    `json:"digest"`
}

// recordedChange is the history.recorded event of records stored without
// events, the first at position first, of the tag at path, which points at
// digest after them.
func recordedChange(tag, path string, first int, records []HistoryRecord, digest string) change {
	d := RecordedHistory{Tag: tag, Path: path, Records: make([]RecordedRecord, len(records))}
	if digest != records[len(records)-1].Digest {
		d.Digest = digest
	}
	for i, r := range records {
		d.Records[i] = RecordedRecord{Seq: first + i, Time: r.Time, Digest: r.Digest}
	}
	last := records[len(records)-1]
	return change{typ: HistoryRecorded, scope: path, subject: tag, time: last.Time, data: d,
		disc: moveDisc(
			first,
			FormatTime(records[0].Time),
			records[0].Digest,
		) + "/" + moveDisc(
			first+len(records)-1,
			FormatTime(last.Time),
			last.Digest,
		)}
}

// change is an event about to be appended to the outbox.
type change struct {
	typ     string
	scope   string
	subject string
	disc    string // what makes this change distinct from others of the same type and subject
	time    time.Time
	before  any
	after   any
	// data, when set, is the event's data instead of {"before", "after"}
	// (an advisory's lifecycle step).
	data any
	// position is a tag.moved event's position in the tag's history (0:
	// none), carried in its data so that a follower places the move
	// without searching for it (see appendFollowedMove).
	position int
}

// eventID is deterministic: the same change always gets the same id, so a
// change recorded twice (a retried crawl, a failover) is one event.
//
// Its first half hashes only the subject, so the ids of one resource's
// events sit together in the events.id index: a page of a tag's history,
// which records up to a thousand moves, then touches a few index pages
// instead of one random page per event, which made ingest write several
// times as much WAL as the rows themselves. The second half hashes the
// whole change; 64 bits tell apart the changes of one subject.
func eventID(typ, subject, disc string) string {
	s := sha256.Sum256([]byte(subject))
	c := sha256.Sum256([]byte(typ + "\x00" + subject + "\x00" + disc))
	return hex.EncodeToString(s[:8]) + hex.EncodeToString(c[:8])
}

// createdDisc tells creations of one resource apart: a resource revived
// after its nth deletion is a new creation even when upstream reports the
// same times as before.
func createdDisc(createTime, updateTime time.Time, deletions int) string {
	d := FormatTime(createTime) + "/" + FormatTime(updateTime)
	if deletions > 0 {
		d += "/revived/" + strconv.Itoa(deletions)
	}
	return d
}

// firstReadDisc tells apart the creations of one tag announced by their
// first history read (ApplyHistory): by its create time and how many
// times it was deleted before.
func firstReadDisc(createTime time.Time, deletions int) string {
	return "first-read/" + FormatTime(createTime) + "/" + strconv.Itoa(deletions)
}

// deletedDisc names the nth deletion of a resource (n counts from 1).
func deletedDisc(n int) string { return "deletion/" + strconv.Itoa(n) }

// updatedDisc identifies an update by the states on both sides and the
// upstream update time. Hashing the states, rather than naming a few fields,
// keeps a change to any field from reusing the id of an earlier update at
// the same updateTime, which the outbox would drop as a duplicate.
func updatedDisc(updateTime time.Time, before, after any) (string, error) {
	b, err := json.Marshal([2]any{before, after})
	if err != nil {
		return "", fmt.Errorf("encode update: %w", err)
	}
	h := sha256.Sum256(b)
	return FormatTime(updateTime) + "/" + hex.EncodeToString(h[:8]), nil
}

// eventColumns is how many values one events row takes in appendEvents.
const eventColumns = 9

// appendEvents writes changes to the outbox with multi-row statements,
// skipping ones already recorded, and returns how many it added.
func (s *Store) appendEvents(ctx context.Context, tx *sql.Tx, cs []change) (int, error) {
	if len(cs) == 0 {
		return 0, nil
	}
	now := FormatTime(s.now())
	args := make([]any, 0, eventColumns*len(cs))
	for _, c := range cs {
		var v any = struct {
			Before   any `json:"before"`
			After    any `json:"after"`
			Position int `json:"position,omitempty"`
		}{c.before, c.after, c.position}
		if c.data != nil {
			v = c.data
		}
		data, ok := []byte(nil), false
		if d, recorded := c.data.(RecordedHistory); recorded {
			data, ok = d.appendJSON(make([]byte, 0, 64+len(d.Tag)+len(d.Path)+160*len(d.Records)))
		}
		if !ok {
			var err error
			if data, err = json.Marshal(v); err != nil {
				return 0, fmt.Errorf("encode %s event of %s: %w", c.typ, c.subject, err)
			}
		}
		resource, action, _ := strings.Cut(c.typ, ".")
		args = append(args, eventID(c.typ, c.subject, c.disc), c.typ, resource, action, c.scope, c.subject,
			FormatTime(c.time), string(data), now)
	}
	n, err := s.insertRows(ctx, tx, bulkEvents, args)
	if err != nil {
		return 0, fmt.Errorf("append events: %w", err)
	}
	return int(n), nil
}

// inBaseline reports whether the mirror has not finished its first crawl, so
// what it sees is the starting point, not news.
func (s *Store) inBaseline(ctx context.Context, tx *sql.Tx) (bool, error) {
	v, err := s.meta(ctx, tx, "baseline_time")
	if err != nil {
		return false, fmt.Errorf("read baseline state: %w", err)
	}
	return v == "", nil
}

// announce reports whether a created or deleted event is news: always after
// the baseline, and during it only in snapshot mode.
func (s *Store) announce(baseline bool) bool { return !baseline || s.snapshot }

// EndBaseline records that the first complete listing finished; from now on
// every change is an event. It queues the history of every tag not read yet
// for the backfill (see BackfillNext) and builds the indexes DeferIndexes
// dropped.
func (s *Store) EndBaseline(ctx context.Context) error {
	err := s.sortingTx(ctx, func(tx *sql.Tx) error {
		in, err := s.inBaseline(ctx, tx)
		if err != nil || !in {
			return err
		}
		// The histories are read after the baseline, in the backfill: the
		// mirror serves the current state meanwhile.
		queued, err := startBackfill(ctx, tx)
		if err != nil {
			return err
		}
		return s.endBaseline(ctx, tx, FormatTime(s.now()), queued == 0)
	})
	if err != nil {
		return fmt.Errorf("end baseline: %w", err)
	}
	// The relay reconciles the KV buckets with what the baseline found;
	// the tags' histories are known now, and mature.
	s.signal()
	s.signalHistory()
	s.endBaselineOnce.Do(func() { close(s.baselineOver) })
	return nil
}

// baselineRecheck is how often WaitBaselineOver reads the baseline's state
// again without a word from EndBaseline: a mirror's baseline can also end
// otherwise (a follower's, from the stream).
const baselineRecheck = 5 * time.Second

// WaitBaselineOver returns once the mirror is past its baseline (at once
// if it is), or with ctx's error when ctx ends first.
func (s *Store) WaitBaselineOver(ctx context.Context) error {
	over := s.baselineOver
	for {
		in, err := s.InBaseline(ctx)
		if err != nil || !in {
			return err
		}
		t := time.NewTimer(baselineRecheck)
		select {
		case <-over:
			over = nil // told once; the timer from now on
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		}
		t.Stop()
	}
}

// InBaseline reports whether the first complete crawl has yet to finish.
func (s *Store) InBaseline(ctx context.Context) (bool, error) {
	v, err := s.meta(ctx, s.w, "baseline_time")
	if err != nil {
		return false, fmt.Errorf("read baseline state: %w", err)
	}
	return v == "", nil
}

// commit runs fn in a write transaction, then the BeforeCommit hook, and
// wakes the publisher when fn recorded events.
func (s *Store) commit(ctx context.Context, fn func(tx *sql.Tx) (events int, err error)) (int, error) {
	var n int
	var recorded map[string]int
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var before int64
		if s.onEvents != nil {
			if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM event_log`).Scan(&before); err != nil {
				return err
			}
		}
		var err error
		if n, err = fn(tx); err != nil {
			return err
		}
		if n > 0 && s.onEvents != nil {
			if recorded, err = eventTypesAfter(ctx, tx, before); err != nil {
				return err
			}
		}
		if s.beforeCommit != nil {
			return s.beforeCommit(ctx)
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	if n > 0 {
		s.signal()
		if s.onEvents != nil {
			s.onEvents(recorded)
		}
	}
	return n, nil
}

// eventTypesAfter counts the events recorded after seq, by type.
func eventTypesAfter(ctx context.Context, tx *sql.Tx, seq int64) (map[string]int, error) {
	rows, err := tx.QueryContext(ctx, `SELECT type, count(*) FROM event_log WHERE seq > ? GROUP BY type`, seq)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := map[string]int{}
	for rows.Next() {
		var typ string
		var n int
		if err := rows.Scan(&typ, &n); err != nil {
			return nil, err
		}
		out[typ] = n
	}
	return out, rows.Err()
}
