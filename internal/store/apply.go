package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Repo is a repository as the mirror keeps it.
type Repo struct {
	UID         string    `json:"uid"`
	Name        string    `json:"name"`
	Description string    `json:"description"`
	CatalogTier string    `json:"catalogTier,omitempty"`
	Aliases     []string  `json:"aliases,omitempty"`
	ActiveTags  []string  `json:"activeTags,omitempty"`
	Bundles     []string  `json:"bundles,omitempty"`
	CreateTime  time.Time `json:"createTime,omitzero"`
	UpdateTime  time.Time `json:"updateTime,omitzero"`
}

// Tag is a tag as the mirror keeps it.
type Tag struct {
	UID        string    `json:"uid"`
	RepoUID    string    `json:"repoUid"`
	Repo       string    `json:"repo"` // repo name, filled in by the store
	Name       string    `json:"name"`
	Digest     string    `json:"digest"`
	Deprecated bool      `json:"deprecated"`
	Bundles    []string  `json:"bundles,omitempty"`
	CreateTime time.Time `json:"createTime,omitzero"`
	UpdateTime time.Time `json:"updateTime,omitzero"`
}

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

// TagRef names a tag whose history needs reading, with the bookmark to start
// from.
type TagRef struct {
	UID        string
	RepoUID    string
	Repo       string
	Name       string
	UpdateTime time.Time
	Bookmark   Bookmark
}

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
)

// change is an event about to be appended to the outbox.
type change struct {
	typ     string
	scope   string
	subject string
	disc    string // what makes this change distinct from others of the same type and subject
	time    time.Time
	before  any
	after   any
}

// eventID is deterministic: the same change always gets the same id, so a
// change recorded twice (a retried crawl, a failover) is one event.
func eventID(typ, subject, disc string) string {
	h := sha256.Sum256([]byte(typ + "\x00" + subject + "\x00" + disc))
	return hex.EncodeToString(h[:16])
}

// appendEvents writes changes to the outbox, skipping ones already recorded.
func (s *Store) appendEvents(ctx context.Context, tx *sql.Tx, cs []change) (int, error) {
	if len(cs) == 0 {
		return 0, nil
	}
	stmt, err := tx.PrepareContext(ctx, `INSERT INTO events (id, type, resource, action, scope, subject, time, data, created_time)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT(id) DO NOTHING`)
	if err != nil {
		return 0, err
	}
	defer stmt.Close()
	now := FormatTime(s.now())
	n := 0
	for _, c := range cs {
		data, err := json.Marshal(struct {
			Before any `json:"before"`
			After  any `json:"after"`
		}{c.before, c.after})
		if err != nil {
			return n, err
		}
		resource, action, _ := strings.Cut(c.typ, ".")
		res, err := stmt.ExecContext(ctx, eventID(c.typ, c.subject, c.disc), c.typ, resource, action, c.scope, c.subject,
			FormatTime(c.time), string(data), now)
		if err != nil {
			return n, fmt.Errorf("append %s event: %w", c.typ, err)
		}
		if k, _ := res.RowsAffected(); k > 0 {
			n++
		}
	}
	return n, nil
}

// inBaseline reports whether the mirror has not finished its first crawl, so
// what it sees is the starting point, not news.
func (s *Store) inBaseline(ctx context.Context, tx *sql.Tx) (bool, error) {
	v, err := s.meta(ctx, tx, "baseline_time")
	return v == "", err
}

// EndBaseline records that the first complete crawl finished; from now on
// every change is an event.
func (s *Store) EndBaseline(ctx context.Context) error {
	_, err := s.w.ExecContext(ctx, `INSERT INTO meta (key, value) VALUES ('baseline_time', ?) ON CONFLICT(key) DO NOTHING`, FormatTime(s.now()))
	return err
}

// InBaseline reports whether the first complete crawl has yet to finish.
func (s *Store) InBaseline(ctx context.Context) (bool, error) {
	v, err := s.meta(ctx, s.w, "baseline_time")
	return v == "", err
}

// commit runs fn in a write transaction and wakes the publisher when fn
// recorded events.
func (s *Store) commit(ctx context.Context, fn func(tx *sql.Tx) (events int, err error)) (int, error) {
	var n int
	err := s.tx(ctx, func(tx *sql.Tx) error {
		var err error
		n, err = fn(tx)
		return err
	})
	if err != nil {
		return 0, err
	}
	if n > 0 {
		s.signal()
	}
	return n, nil
}

func jsonList(v []string) string {
	if len(v) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(v)
	return string(b)
}

func placeholders(n int) string {
	return strings.TrimSuffix(strings.Repeat("?,", n), ",")
}

// ApplyRepos upserts one page of repos and records repo.created (also for a
// repo that comes back after a deletion) and repo.updated events. It returns
// how many events it recorded.
func (s *Store) ApplyRepos(ctx context.Context, repos []Repo) (int, error) {
	return s.commit(ctx, func(tx *sql.Tx) (int, error) {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		uids := make([]any, len(repos))
		for i, r := range repos {
			uids[i] = r.UID
		}
		old := make(map[string]storedRepo, len(repos))
		if len(uids) > 0 {
			rows, err := tx.QueryContext(ctx, `SELECT uid, name, description, catalog_tier, aliases, active_tags, bundles,
				COALESCE(create_time,''), COALESCE(update_time,''), deleted_time IS NOT NULL FROM repos WHERE uid IN (`+placeholders(len(uids))+`)`, uids...)
			if err != nil {
				return 0, err
			}
			for rows.Next() {
				var r storedRepo
				var aliases, active, bundles, ct, ut string
				if err := rows.Scan(&r.UID, &r.Name, &r.Description, &r.CatalogTier, &aliases, &active, &bundles, &ct, &ut, &r.deleted); err != nil {
					rows.Close()
					return 0, err
				}
				json.Unmarshal([]byte(aliases), &r.Aliases)
				json.Unmarshal([]byte(active), &r.ActiveTags)
				json.Unmarshal([]byte(bundles), &r.Bundles)
				r.CreateTime, _ = ParseTime(ct)
				r.UpdateTime, _ = ParseTime(ut)
				old[r.UID] = r
			}
			rows.Close()
			if err := rows.Err(); err != nil {
				return 0, err
			}
		}
		up, err := tx.PrepareContext(ctx, `INSERT INTO repos (uid, name, description, catalog_tier, aliases, active_tags, bundles, create_time, update_time, first_seen_time)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT(uid) DO UPDATE SET name=excluded.name, description=excluded.description, catalog_tier=excluded.catalog_tier,
				aliases=excluded.aliases, active_tags=excluded.active_tags, bundles=excluded.bundles, create_time=excluded.create_time,
				update_time=excluded.update_time, deleted_time=NULL`)
		if err != nil {
			return 0, err
		}
		defer up.Close()
		now := FormatTime(s.now())
		var cs []change
		for _, r := range repos {
			o, seen := old[r.UID]
			switch {
			case !seen || o.deleted:
				if !baseline || s.snapshot {
					cs = append(cs, change{typ: RepoCreated, scope: r.Name, subject: r.UID, disc: FormatTime(r.CreateTime) + "/" + FormatTime(r.UpdateTime), time: eventTime(r.CreateTime, s.now()), after: r})
				}
			case !sameRepo(o.Repo, r):
				cs = append(cs, change{typ: RepoUpdated, scope: r.Name, subject: r.UID, disc: FormatTime(r.UpdateTime) + "/" + r.Name + "/" + r.Description, time: eventTime(r.UpdateTime, s.now()), before: o.Repo, after: r})
			default:
				continue
			}
			if _, err := up.ExecContext(ctx, r.UID, r.Name, r.Description, r.CatalogTier, jsonList(r.Aliases), jsonList(r.ActiveTags), jsonList(r.Bundles),
				nullTime(r.CreateTime), nullTime(r.UpdateTime), now); err != nil {
				return 0, fmt.Errorf("upsert repo %s: %w", r.UID, err)
			}
		}
		return s.appendEvents(ctx, tx, cs)
	})
}

type storedRepo struct {
	Repo
	deleted bool
}

func sameRepo(a, b Repo) bool {
	return a.Name == b.Name && a.Description == b.Description && a.CatalogTier == b.CatalogTier &&
		slices.Equal(a.Aliases, b.Aliases) && slices.Equal(a.ActiveTags, b.ActiveTags) && slices.Equal(a.Bundles, b.Bundles) &&
		a.CreateTime.Equal(b.CreateTime) && a.UpdateTime.Equal(b.UpdateTime)
}

func nullTime(t time.Time) any {
	if t.IsZero() {
		return nil
	}
	return FormatTime(t)
}

// eventTime is when a change happened upstream, or when syncd saw it if the
// upstream gave no time.
func eventTime(t, now time.Time) time.Time {
	if t.IsZero() {
		return now
	}
	return t
}

type storedTag struct {
	Tag
	deleted           bool
	historyUpdateTime string
	historyLastDigest string
	bookmark          Bookmark
}

// ApplyTags upserts one page of tags of repo and records tag.created (also
// for a tag that comes back) and tag.deprecated events. Digest changes are
// not events here: they come from the tag history, one per move, through
// ApplyHistory. It returns the tags whose history needs reading, because
// their digest or update time differs from what the history walk last saw.
func (s *Store) ApplyTags(ctx context.Context, repo Repo, tags []Tag) (need []TagRef, events int, err error) {
	events, err = s.commit(ctx, func(tx *sql.Tx) (int, error) {
		need = need[:0]
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		old, err := loadTags(ctx, tx, tags)
		if err != nil {
			return 0, err
		}
		up, err := tx.PrepareContext(ctx, `INSERT INTO tags (uid, repo_uid, name, digest, deprecated, bundles, create_time, update_time, first_seen_time, baseline)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
			ON CONFLICT(uid) DO UPDATE SET repo_uid=excluded.repo_uid, name=excluded.name, digest=excluded.digest, deprecated=excluded.deprecated,
				bundles=excluded.bundles, create_time=excluded.create_time, update_time=excluded.update_time, deleted_time=NULL`)
		if err != nil {
			return 0, err
		}
		defer up.Close()
		now := FormatTime(s.now())
		var cs []change
		for _, t := range tags {
			t.Repo, t.RepoUID = repo.Name, repo.UID
			o, seen := old[t.UID]
			changed := true
			switch {
			case !seen || o.deleted:
				if !baseline || s.snapshot {
					cs = append(cs, change{typ: TagCreated, scope: repo.Name, subject: t.UID, disc: FormatTime(t.CreateTime) + "/" + FormatTime(t.UpdateTime), time: eventTime(t.CreateTime, s.now()), after: t})
				}
			case t.Deprecated && !o.Deprecated:
				before := o.Tag
				before.Repo = repo.Name
				cs = append(cs, change{typ: TagDeprecated, scope: repo.Name, subject: t.UID, disc: FormatTime(t.UpdateTime), time: eventTime(t.UpdateTime, s.now()), before: before, after: t})
			default:
				changed = !sameTag(o.Tag, t)
			}
			if changed {
				if _, err := up.ExecContext(ctx, t.UID, repo.UID, t.Name, t.Digest, t.Deprecated, jsonList(t.Bundles),
					nullTime(t.CreateTime), nullTime(t.UpdateTime), now, baseline); err != nil {
					return 0, fmt.Errorf("upsert tag %s: %w", t.UID, err)
				}
			}
			if !seen || o.historyUpdateTime != FormatTime(t.UpdateTime) || o.historyLastDigest != t.Digest {
				need = append(need, TagRef{UID: t.UID, RepoUID: repo.UID, Repo: repo.Name, Name: t.Name, UpdateTime: t.UpdateTime, Bookmark: o.bookmark})
			}
		}
		return s.appendEvents(ctx, tx, cs)
	})
	return need, events, err
}

func sameTag(a, b Tag) bool {
	return a.Name == b.Name && a.Digest == b.Digest && a.Deprecated == b.Deprecated && slices.Equal(a.Bundles, b.Bundles) &&
		a.CreateTime.Equal(b.CreateTime) && a.UpdateTime.Equal(b.UpdateTime)
}

func loadTags(ctx context.Context, tx *sql.Tx, tags []Tag) (map[string]storedTag, error) {
	old := make(map[string]storedTag, len(tags))
	if len(tags) == 0 {
		return old, nil
	}
	uids := make([]any, len(tags))
	for i, t := range tags {
		uids[i] = t.UID
	}
	rows, err := tx.QueryContext(ctx, `SELECT uid, repo_uid, name, digest, deprecated, bundles, COALESCE(create_time,''), COALESCE(update_time,''),
		deleted_time IS NOT NULL, COALESCE(history_update_time,''), history_last_digest, COALESCE(history_last_time,''), history_last_count, history_count
		FROM tags WHERE uid IN (`+placeholders(len(uids))+`)`, uids...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	for rows.Next() {
		var t storedTag
		var bundles, ct, ut, lt string
		if err := rows.Scan(&t.UID, &t.RepoUID, &t.Name, &t.Digest, &t.Deprecated, &bundles, &ct, &ut, &t.deleted,
			&t.historyUpdateTime, &t.historyLastDigest, &lt, &t.bookmark.LastCount, &t.bookmark.Count); err != nil {
			return nil, err
		}
		json.Unmarshal([]byte(bundles), &t.Bundles)
		t.CreateTime, _ = ParseTime(ct)
		t.UpdateTime, _ = ParseTime(ut)
		t.bookmark.LastTime, _ = ParseTime(lt)
		old[t.UID] = t
	}
	return old, rows.Err()
}

// historyChunk is how many history rows go into one INSERT statement.
const historyChunk = 200

// ApplyHistory appends the records of ref's history that the mirror does not
// have yet and records one tag.moved event per new record that has a
// predecessor, in order. records must be oldest first and hold everything from
// the bookmark time the caller started at (ref.Bookmark.LastTime) onwards: the
// store drops what it already has, comparing against its own bookmark inside
// the transaction, so overlapping or concurrent reads cannot duplicate rows.
// When complete is set, the walk reached the newest record and the tag is
// marked as read up to ref.UpdateTime.
func (s *Store) ApplyHistory(ctx context.Context, ref TagRef, records []HistoryRecord, complete bool) (events int, err error) {
	return s.commit(ctx, func(tx *sql.Tx) (int, error) {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		var (
			lastTime, lastDigest string
			b                    Bookmark
			tagBaseline          bool
			cur                  Tag
			bundles, ct, ut      string
		)
		err = tx.QueryRowContext(ctx, `SELECT COALESCE(history_last_time,''), history_last_count, history_count, history_last_digest, baseline,
			name, digest, deprecated, bundles, COALESCE(create_time,''), COALESCE(update_time,'') FROM tags WHERE uid = ?`, ref.UID).
			Scan(&lastTime, &b.LastCount, &b.Count, &lastDigest, &tagBaseline, &cur.Name, &cur.Digest, &cur.Deprecated, &bundles, &ct, &ut)
		if err != nil {
			return 0, fmt.Errorf("read bookmark of tag %s: %w", ref.UID, err)
		}
		json.Unmarshal([]byte(bundles), &cur.Bundles)
		cur.CreateTime, _ = ParseTime(ct)
		cur.UpdateTime, _ = ParseTime(ut)
		cur.UID, cur.RepoUID, cur.Repo = ref.UID, ref.RepoUID, ref.Repo
		b.LastTime, _ = ParseTime(lastTime)

		fresh := newRecords(records, b)
		// A tag's first history read during the baseline, or for a tag the
		// baseline found, is the starting point: its past moves are not news.
		silent := baseline || (tagBaseline && b.Count == 0)
		var cs []change
		prev := lastDigest
		for i, r := range fresh {
			seq := b.Count + i
			if seq > 0 && !silent {
				before, after := cur, cur
				before.Digest, after.Digest = prev, r.Digest
				after.UpdateTime = r.Time
				cs = append(cs, change{typ: TagMoved, scope: ref.Repo, subject: ref.UID,
					disc: fmt.Sprintf("%d/%s/%s", seq, FormatTime(r.Time), r.Digest), time: r.Time, before: before, after: after})
			}
			prev = r.Digest
		}
		if err := insertHistory(ctx, tx, ref.UID, b.Count, fresh); err != nil {
			return 0, err
		}
		if len(fresh) > 0 {
			nb := bookmarkAfter(b, fresh)
			if _, err := tx.ExecContext(ctx, `UPDATE tags SET history_last_time = ?, history_last_count = ?, history_count = ?, history_last_digest = ? WHERE uid = ?`,
				FormatTime(nb.LastTime), nb.LastCount, nb.Count, prev, ref.UID); err != nil {
				return 0, err
			}
		}
		if complete {
			if _, err := tx.ExecContext(ctx, `UPDATE tags SET history_update_time = ? WHERE uid = ?`, FormatTime(ref.UpdateTime), ref.UID); err != nil {
				return 0, err
			}
		}
		return s.appendEvents(ctx, tx, cs)
	})
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

func insertHistory(ctx context.Context, tx *sql.Tx, tagUID string, firstSeq int, recs []HistoryRecord) error {
	for start := 0; start < len(recs); start += historyChunk {
		end := min(start+historyChunk, len(recs))
		args := make([]any, 0, 4*(end-start))
		var q strings.Builder
		q.WriteString(`INSERT INTO tag_history (tag_uid, seq, update_time, digest) VALUES `)
		for i := start; i < end; i++ {
			if i > start {
				q.WriteByte(',')
			}
			q.WriteString("(?,?,?,?)")
			args = append(args, tagUID, firstSeq+i, FormatTime(recs[i].Time), recs[i].Digest)
		}
		if _, err := tx.ExecContext(ctx, q.String(), args...); err != nil {
			return fmt.Errorf("insert history of tag %s: %w", tagUID, err)
		}
	}
	return nil
}
