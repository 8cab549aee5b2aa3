package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Tags that mature ([maturity] after). For a tag and an age A, the matured
// digest is the one the tag pointed to at now − A: the digest of its newest
// history record at least A old, "the newest digest of this tag that is at
// least A old". It trails the tag by A and changes when a record reaches
// the age A. A digest replaced within A matures too, at its own age, for as
// long as it was the tag's (docs/events.md has an example); a consumer that
// wants to skip what was taken back sooner reads the history (the query
// service's tag.history) for how long it stayed.
//
// The leader recomputes a tag only when something can have changed: a
// record of it reached the age A since the last run (time passed; the
// history's time index finds them), or records of it were written since
// (late-discovered history, found by tag_history.id). When the matured
// digest differs from tag_matured's, it writes the row and a tag.matured
// event in the same transaction. The next instant anything can mature is
// the oldest record younger than A, plus A: a record that matures does so
// at its time plus A, and only the newest record of a tag can still be
// younger, so no other instant need be watched.

// TagMatured is the event kind of a change of a tag's matured digest.
const TagMatured = "tag.matured"

// MaturedTag is a tag.matured event's data: the tag's matured digest for
// an age, the record it is from, and the one it replaces.
type MaturedTag struct {
	Repo   string `json:"repo"` // the repo's path
	Tag    string `json:"tag"`
	UID    string `json:"uid"`
	Age    string `json:"age"`
	Digest string `json:"digest"`
	// Seq is the record's position in the tag's history.
	Seq int `json:"seq"`
	// Since is the record's time: when the tag moved to Digest.
	Since time.Time `json:"since"`
	// MaturedTime is Since plus the age: when the record matured.
	MaturedTime time.Time `json:"maturedTime"`
	// Previous is the matured record this one replaces; nil: none.
	Previous *MaturedRecord `json:"previous"`
	// EventID is the id of the event that set this state (tag_matured's
	// event_id); not part of the event's data.
	EventID string `json:"-"`
}

// MaturedRecord is a history record as MaturedTag names it.
type MaturedRecord struct {
	Digest string    `json:"digest"`
	Seq    int       `json:"seq"`
	Since  time.Time `json:"since"`
}

// AgeName is the canonical name of a maturity age, as keys, event data
// and tag_matured spell it: time.Duration's form without zero minutes and
// seconds (72h, 1h30m, 90s → 1m30s), so two spellings of one age have
// one name.
func AgeName(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

// maxAgeName bounds an age name a follower accepts from the stream.
const maxAgeName = 32

// MatureResult is what one Mature run did.
type MatureResult struct {
	// Events is how many tag.matured events it recorded.
	Events int
	// Next is the next instant a record matures; zero when no record is
	// younger than the longest age (nothing will mature without new
	// history).
	Next time.Time
}

// maturedRunKey is the meta key of an age's last run: the cutoff it
// matured records up to and the last tag_history id it had seen. A
// snapshot does not carry it, so a new leader's first run recomputes
// every tag, announcing only what differs from the rows the stream gave.
func maturedRunKey(age string) string { return "matured_run/" + age }

// Mature brings tag_matured up to the store's clock for each age,
// recording a tag.matured event for each change, and returns the next
// instant a record matures. During the baseline it does nothing: the
// tags' histories are not all known yet. An age's first run (maturity
// just turned on, or a new leader) recomputes every tag, so each tag's
// matured digest is announced once.
//
// The tags are recomputed matureChunk at a time, each chunk's rows and
// events in a transaction of their own, so that a first run over a large
// mirror does not hold the writer for all of it; the run is recorded in
// the last. A run cut short is done again whole, and announces only what
// the rows do not hold yet.
func (s *Store) Mature(ctx context.Context, ages []time.Duration) (MatureResult, error) {
	var res MatureResult
	if len(ages) == 0 {
		return res, nil
	}
	now := s.now()
	plans, lastID, err := s.maturityPlans(ctx, ages, now)
	if err != nil || plans == nil {
		return res, err
	}
	type step struct {
		plan  *maturityPlan
		chunk []string
	}
	var steps []step
	for i := range plans {
		p := &plans[i]
		for start := 0; start < len(p.uids); start += matureChunk {
			steps = append(steps, step{p, p.uids[start:min(start+matureChunk, len(p.uids))]})
		}
	}
	if len(steps) == 0 {
		steps = append(steps, step{}) // the run alone
	}
	for i, st := range steps {
		last := i == len(steps)-1
		n, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
			n := 0
			if st.plan != nil {
				var err error
				if n, err = s.matureTags(ctx, tx, st.chunk, st.plan.age, st.plan.cutoff); err != nil {
					return 0, fmt.Errorf("age %s: %w", st.plan.name, err)
				}
			}
			if !last {
				return n, nil
			}
			for _, p := range plans {
				_, err := tx.ExecContext(
					ctx,
					`INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value`,
					maturedRunKey(p.name),
					FormatTime(p.cutoff)+"|"+strconv.FormatInt(lastID, 10),
				)
				if err != nil {
					return 0, fmt.Errorf("record the run of age %s: %w", p.name, err)
				}
			}
			next, err := nextMaturation(ctx, tx, ages, now)
			res.Next = next
			return n, err
		})
		if err != nil {
			return MatureResult{}, fmt.Errorf("mature tags: %w", err)
		}
		res.Events += n
	}
	return res, nil
}

// matureChunk is how many tags one transaction of Mature recomputes: a
// first run over 50,000 tags in one transaction held the writer for
// seconds, which a crawl's pages would wait for.
var matureChunk = 1000 // a variable for tests of runs cut short

// maturityPlan is the work of a Mature run for one age: the tags to
// recompute, up to cutoff (now minus the age).
type maturityPlan struct {
	age    time.Duration
	name   string
	cutoff time.Time
	uids   []string
}

// maturityPlans reads the tags each age must recompute, and the last
// tag_history id they were found up to; nil plans during the baseline.
func (s *Store) maturityPlans(
	ctx context.Context,
	ages []time.Duration,
	now time.Time,
) (plans []maturityPlan, lastID int64, err error) {
	// Read first, without the write lock: during the baseline every page
	// of history wakes the duty.
	if baseline, err := s.InBaseline(ctx); err != nil || baseline {
		return nil, 0, err
	}
	err = s.tx(ctx, func(tx *sql.Tx) error {
		if baseline, err := s.inBaseline(ctx, tx); err != nil || baseline {
			return err
		}
		if err := tx.QueryRowContext(ctx, `SELECT COALESCE(MAX(id), 0) FROM tag_history`).Scan(&lastID); err != nil {
			return fmt.Errorf("read the last history id: %w", err)
		}
		plans = make([]maturityPlan, 0, len(ages))
		for _, age := range ages {
			p := maturityPlan{age: age, name: AgeName(age), cutoff: now.Add(-age)}
			run, ok, err := readMaturedRun(ctx, s, tx, p.name)
			if err != nil {
				return err
			}
			if p.uids, err = maturityCandidates(ctx, tx, run, ok, FormatTime(p.cutoff)); err != nil {
				return fmt.Errorf("age %s: %w", p.name, err)
			}
			plans = append(plans, p)
		}
		return nil
	})
	if err != nil {
		return nil, 0, fmt.Errorf("mature tags: %w", err)
	}
	return plans, lastID, nil
}

// nextMaturation is the earliest instant after now at which a record
// reaches one of the ages: for each age, the oldest record younger than
// it, plus the age (through the history's time index).
func nextMaturation(ctx context.Context, tx *sql.Tx, ages []time.Duration, now time.Time) (time.Time, error) {
	var next time.Time
	for _, age := range ages {
		var oldest sql.NullString
		err := tx.QueryRowContext(
			ctx,
			`SELECT MIN(update_time) FROM tag_history WHERE update_time > ?`,
			FormatTime(now.Add(-age)),
		).
			Scan(&oldest)
		if err != nil {
			return time.Time{}, fmt.Errorf("read the next maturation: %w", err)
		}
		if !oldest.Valid {
			continue
		}
		t, err := ParseTime(oldest.String)
		if err != nil {
			return time.Time{}, err
		}
		if at := t.Add(age); next.IsZero() || at.Before(next) {
			next = at
		}
	}
	return next, nil
}

// maturedRun is an age's last run, as maturedRunKey holds it.
type maturedRun struct {
	cutoff string
	lastID int64
}

func readMaturedRun(ctx context.Context, s *Store, tx *sql.Tx, age string) (maturedRun, bool, error) {
	v, err := s.meta(ctx, tx, maturedRunKey(age))
	if err != nil || v == "" {
		return maturedRun{}, false, err
	}
	cutoff, id, ok := strings.Cut(v, "|")
	n, err := strconv.ParseInt(id, 10, 64)
	if !ok || err != nil {
		// Not what this code writes: recompute every tag.
		s.log.Warn("maturity: unreadable run state; recomputing every tag", "key", maturedRunKey(age), "value", v)
		return maturedRun{}, false, nil
	}
	return maturedRun{cutoff: cutoff, lastID: n}, true, nil
}

// matureTags recomputes tags for age up to cutoff, writing the rows and
// events of the changes in tx; it returns how many events it recorded.
func (s *Store) matureTags(
	ctx context.Context,
	tx *sql.Tx,
	tags []string,
	age time.Duration,
	cutoff time.Time,
) (int, error) {
	cs, err := maturedChanges(ctx, tx, tags, age, AgeName(age), cutoff)
	if err != nil {
		return 0, err
	}
	if err := writeMatured(ctx, tx, cs); err != nil {
		return 0, err
	}
	return s.appendEvents(ctx, tx, cs)
}

// maturityCandidates are the live tags whose matured digest may have
// changed since run: those with a record that reached the age since
// (update_time in (run's cutoff, cutoff]) and those with records written
// since (id past run's). Without a run, every live tag with history.
func maturityCandidates(ctx context.Context, tx *sql.Tx, run maturedRun, ok bool, cutoff string) ([]string, error) {
	q := `SELECT t.uid FROM tags t WHERE t.deleted_time IS NULL AND EXISTS (SELECT 1 FROM tag_history h WHERE h.tag_uid = t.uid) ORDER BY t.uid`
	var args []any
	if ok {
		// UNION ALL and DISTINCT after: a UNION merged the two sorted by
		// tag, which read the whole history through its (tag_uid, seq)
		// index instead of the rows past lastID.
		q = `SELECT DISTINCT t.uid FROM (SELECT tag_uid FROM tag_history WHERE update_time > ? AND update_time <= ?
			UNION ALL SELECT tag_uid FROM tag_history WHERE id > ?) h JOIN tags t ON t.uid = h.tag_uid
			WHERE t.deleted_time IS NULL`
		args = []any{run.cutoff, cutoff, run.lastID}
	}
	var uids []string
	err := queryRows(ctx, tx, q, args, func(r *sql.Rows) error {
		var u string
		err := r.Scan(&u)
		uids = append(uids, u)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("find the tags to recompute: %w", err)
	}
	slices.Sort(uids) // the events in the order of the tags
	return uids, nil
}

// maturedChanges recomputes the matured record of tags for age and
// returns a tag.matured change for each that differs in digest from
// tag_matured. A tag with no matured record keeps its row: a matured
// digest is replaced, never withdrawn.
func maturedChanges(
	ctx context.Context,
	tx *sql.Tx,
	tags []string,
	age time.Duration,
	name string,
	cutoff time.Time,
) ([]change, error) {
	matured := map[string]MaturedRecord{}
	var cur string
	var hist []MaturedRecord
	flush := func() {
		if r, ok := maturedOf(hist, age, cutoff); ok {
			matured[cur] = r
		}
		hist = hist[:0]
	}
	err := queryByUIDs(
		ctx,
		tx,
		`SELECT tag_uid, seq, update_time, digest FROM tag_history WHERE tag_uid IN (%s) ORDER BY tag_uid, seq`,
		tags,
		func(r *sql.Rows) error {
			var uid, at string
			var rec MaturedRecord
			if err := r.Scan(&uid, &rec.Seq, &at, &rec.Digest); err != nil {
				return err
			}
			t, err := ParseTime(at)
			if err != nil {
				return err
			}
			rec.Since = t
			if uid != cur {
				flush()
				cur = uid
			}
			hist = append(hist, rec)
			return nil
		},
	)
	if err != nil {
		return nil, fmt.Errorf("read history: %w", err)
	}
	flush()
	if len(matured) == 0 {
		return nil, nil
	}
	uids := make([]string, 0, len(matured))
	for _, u := range tags {
		if _, ok := matured[u]; ok {
			uids = append(uids, u)
		}
	}
	prev := map[string]MaturedRecord{}
	names := map[string][2]string{} // uid → repo path, tag name
	err = queryByUIDsAfter(
		ctx,
		tx,
		`SELECT t.uid, t.name, COALESCE(r.path,''), COALESCE(r.name,''), m.seq, m.update_time, m.digest
		FROM tags t LEFT JOIN repos r ON r.uid = t.repo_uid LEFT JOIN tag_matured m ON m.tag_uid = t.uid AND m.age = ?
		WHERE t.uid IN (%s)`,
		[]any{name},
		uids,
		func(r *sql.Rows) error {
			var uid, tag, path, repo string
			var seq sql.NullInt64
			var at, digest sql.NullString
			if err := r.Scan(&uid, &tag, &path, &repo, &seq, &at, &digest); err != nil {
				return err
			}
			names[uid] = [2]string{scopeOf(path, repo), tag}
			if seq.Valid {
				t, err := ParseTime(at.String)
				prev[uid] = MaturedRecord{Digest: digest.String, Seq: int(seq.Int64), Since: t}
				return err
			}
			return nil
		},
	)
	if err != nil {
		return nil, fmt.Errorf("read matured digests: %w", err)
	}
	var cs []change
	for _, uid := range uids {
		m := matured[uid]
		p, had := prev[uid]
		if had && p.Digest == m.Digest {
			continue
		}
		d := MaturedTag{Repo: names[uid][0], Tag: names[uid][1], UID: uid, Age: name, Digest: m.Digest, Seq: m.Seq,
			Since: m.Since, MaturedTime: m.Since.Add(age)}
		from := "-"
		if had {
			d.Previous = &p
			from = strconv.Itoa(p.Seq)
		}
		cs = append(cs, change{typ: TagMatured, scope: d.Repo, subject: uid, time: d.MaturedTime, data: d,
			disc: maturedDisc(name, from, m)})
	}
	return cs, nil
}

// maturedDisc tells a tag's tag.matured events apart: the age, the
// position of the record it replaces ("-": none) and the record's
// position, time and digest. A new leader that recomputes the same change
// gives it the same id, so the stream keeps it once.
func maturedDisc(age, from string, m MaturedRecord) string {
	return age + "/" + from + "/" + moveDisc(m.Seq, FormatTime(m.Since), m.Digest)
}

// maturedOf returns the record of hist (a tag's history in order) the tag
// pointed to at cutoff (now minus the age): the newest whose time is at
// most cutoff.
func maturedOf(hist []MaturedRecord, _ time.Duration, cutoff time.Time) (MaturedRecord, bool) {
	for i := len(hist) - 1; i >= 0; i-- {
		if !hist[i].Since.After(cutoff) {
			return hist[i], true
		}
	}
	return MaturedRecord{}, false
}

// writeMatured upserts the tag_matured rows of tag.matured changes.
func writeMatured(ctx context.Context, tx *sql.Tx, cs []change) error {
	if len(cs) == 0 {
		return nil
	}
	stmt, err := tx.PrepareContext(ctx, upsertMaturedSQL)
	if err != nil {
		return fmt.Errorf("write matured digests: %w", err)
	}
	defer stmt.Close()
	for _, c := range cs {
		d := c.data.(MaturedTag)
		if err := upsertMatured(ctx, stmt, d, eventID(c.typ, c.subject, c.disc)); err != nil {
			return err
		}
	}
	return nil
}

// upsertMaturedSQL writes a tag's matured record for an age.
const upsertMaturedSQL = `INSERT INTO tag_matured (tag_uid, age, seq, update_time, digest, matured_time,
	event_id) VALUES (?, ?, ?, ?, ?, ?, ?)
	ON CONFLICT (tag_uid, age) DO UPDATE SET seq = excluded.seq, update_time = excluded.update_time,
		digest = excluded.digest,
	matured_time = excluded.matured_time, event_id = excluded.event_id`

// upsertMatured writes d's row with stmt, upsertMaturedSQL prepared.
func upsertMatured(ctx context.Context, stmt *sql.Stmt, d MaturedTag, id string) error {
	_, err := stmt.ExecContext(ctx, d.UID, d.Age, d.Seq, FormatTime(d.Since), d.Digest, FormatTime(d.MaturedTime), id)
	if err != nil {
		return fmt.Errorf("write matured digest of tag %s for %s: %w", d.UID, d.Age, err)
	}
	return nil
}

// validMatured checks a tag.matured event's data from the stream before a
// follower writes it.
func validMatured(d MaturedTag, subject string) error {
	switch {
	case d.UID == "" || d.UID != subject:
		return fmt.Errorf("tag.matured data names tag %q, the event %q", d.UID, subject)
	case d.Age == "" || len(d.Age) > maxAgeName:
		return fmt.Errorf("tag.matured age %.40q: want a duration's name of 1 to %d bytes", d.Age, maxAgeName)
	case d.Digest == "":
		return errors.New("tag.matured without a digest")
	case d.Seq < 0:
		return fmt.Errorf("tag.matured at history position %d", d.Seq)
	case d.Since.IsZero():
		return errors.New("tag.matured without the record's time")
	}
	return nil
}

// MaturedDigests calls fn with the matured digest of every live tag for
// every age, as consumers of the published events know it: a tag whose
// tag.matured is still in the outbox is given as its oldest such event's
// previous record (not at all when it had none). What the matured KV
// bucket must hold.
func (s *Store) MaturedDigests(ctx context.Context, fn func(MaturedTag) error) error {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("read matured digests: %w", err)
	}
	defer tx.Rollback()
	type key struct{ uid, age string }
	pending := map[key]*MaturedTag{}
	live := map[key]bool{} // pending keys of live tags
	var order []key
	err = queryRows(
		ctx,
		tx,
		`SELECT l.data FROM outbox o JOIN event_log l ON l.seq = o.seq WHERE l.type = ? ORDER BY o.seq`,
		[]any{TagMatured},
		func(r *sql.Rows) error {
			var data string
			if err := r.Scan(&data); err != nil {
				return err
			}
			var d MaturedTag
			if err := json.Unmarshal([]byte(data), &d); err != nil {
				return fmt.Errorf("decode tag.matured: %w", err)
			}
			k := key{d.UID, d.Age}
			if _, ok := pending[k]; !ok {
				pending[k] = &d
				order = append(order, k)
			}
			return nil
		},
	)
	if err != nil {
		return fmt.Errorf("read matured digests: outbox: %w", err)
	}
	err = queryRows(
		ctx,
		tx,
		`SELECT m.tag_uid, m.age, m.seq, m.update_time, m.digest, m.matured_time, m.event_id, t.name, COALESCE(r.path,''),
			COALESCE(r.name,'')
		FROM tag_matured m JOIN tags t ON t.uid = m.tag_uid LEFT JOIN repos r ON r.uid = t.repo_uid
		WHERE t.deleted_time IS NULL ORDER BY m.tag_uid, m.age`,
		nil,
		func(r *sql.Rows) error {
			var d MaturedTag
			var since, at, path, repo string
			if err := r.Scan(&d.UID, &d.Age, &d.Seq, &since, &d.Digest, &at, &d.EventID, &d.Tag, &path, &repo); err != nil {
				return err
			}
			if p, ok := pending[key{d.UID, d.Age}]; ok {
				p.Repo, p.Tag = scopeOf(path, repo), d.Tag // the tag's name and path now
				live[key{d.UID, d.Age}] = true
				return nil
			}
			var err error
			if d.Since, err = ParseTime(since); err != nil {
				return err
			}
			if d.MaturedTime, err = ParseTime(at); err != nil {
				return err
			}
			d.Repo = scopeOf(path, repo)
			return fn(d)
		},
	)
	if err != nil {
		return fmt.Errorf("read matured digests: %w", err)
	}
	for _, k := range order {
		p := pending[k].Previous
		if p == nil || !live[k] {
			continue
		}
		d := MaturedTag{
			Repo:   pending[k].Repo,
			Tag:    pending[k].Tag,
			UID:    k.uid,
			Age:    k.age,
			Digest: p.Digest,
			Seq:    p.Seq,
			Since:  p.Since,
		}
		if age, err := time.ParseDuration(k.age); err == nil {
			d.MaturedTime = p.Since.Add(age)
		}
		if err := fn(d); err != nil {
			return err
		}
	}
	return nil
}

// queryByUIDsAfter is queryByUIDs for a query whose first placeholders,
// before the list, take lead.
func queryByUIDsAfter(
	ctx context.Context,
	tx *sql.Tx,
	query string,
	lead []any,
	uids []string,
	scan func(*sql.Rows) error,
) error {
	for start := 0; start < len(uids); start += uidsPerQuery {
		end := min(start+uidsPerQuery, len(uids))
		args := append(make([]any, 0, len(lead)+end-start), lead...)
		for _, u := range uids[start:end] {
			args = append(args, u)
		}
		if err := queryRows(ctx, tx, fmt.Sprintf(query, placeholders(end-start)), args, scan); err != nil {
			return err
		}
	}
	return nil
}
