package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
)

// PublishedResource is a live resource as a consumer of the event stream
// knows it: exactly one of Repo, Tag and Advisory is set.
type PublishedResource struct {
	Repo     *Repo
	Tag      *Tag
	Advisory *Advisory
}

// PublishedState calls fn with every resource that is live as of the
// published events, from one snapshot of the mirror: what the KV buckets
// beside the stream must hold. A resource with events still in the outbox
// is given as the oldest of them found it (its "before", absent when that
// event created it), since consumers have not received them yet; every
// other live resource as the mirror has it, which includes what the
// baseline found without announcing it.
func (s *Store) PublishedState(ctx context.Context, fn func(PublishedResource) error) error {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("read published state: %w", err)
	}
	defer tx.Rollback()
	pending, err := pendingBefore(ctx, tx)
	if err != nil {
		return fmt.Errorf("read published state: outbox: %w", err)
	}
	for _, step := range []func(context.Context, *sql.Tx, map[string]*pendingEvent, func(PublishedResource) error) error{
		publishedRepos, publishedTags, publishedAdvisories,
	} {
		if err := step(ctx, tx, pending, fn); err != nil {
			return fmt.Errorf("read published state: %w", err)
		}
	}
	// The resources with unpublished events, as consumers last heard of
	// them, whether or not the mirror still has them live.
	for _, p := range pending {
		if p.before == nil {
			continue
		}
		var r PublishedResource
		switch p.resource {
		case "repo":
			r.Repo = new(Repo)
			err = json.Unmarshal(p.before, r.Repo)
		case "tag":
			r.Tag = new(Tag)
			err = json.Unmarshal(p.before, r.Tag)
		case "advisory":
			r.Advisory = new(Advisory)
			err = json.Unmarshal(p.before, r.Advisory)
		default:
			continue
		}
		if err != nil {
			return fmt.Errorf("read published state: decode %s %s: %w", p.resource, p.subject, err)
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// pendingEvent is the oldest unpublished event about a resource that
// carries its state.
type pendingEvent struct {
	resource string
	subject  string
	before   json.RawMessage // nil: the resource did not exist before it
}

// pendingBefore returns, by subject, the oldest event in the outbox that
// carries a "before" (an advisory's lifecycle step does not: its
// advisory.updated does).
func pendingBefore(ctx context.Context, tx *sql.Tx) (map[string]*pendingEvent, error) {
	out := map[string]*pendingEvent{}
	err := queryRows(
		ctx,
		tx,
		`SELECT l.subject, l.resource, l.action, l.data FROM outbox o JOIN event_log l ON l.seq = o.seq ORDER BY o.seq`,
		nil,
		func(rows *sql.Rows) error {
			var subject, resource, action, data string
			if err := rows.Scan(&subject, &resource, &action, &data); err != nil {
				return err
			}
			if _, ok := out[subject]; ok || !statefulAction(resource, action) {
				return nil
			}
			var d struct {
				Before json.RawMessage `json:"before"`
			}
			if err := json.Unmarshal([]byte(data), &d); err != nil {
				return fmt.Errorf("decode event data of %s: %w", subject, err)
			}
			p := &pendingEvent{resource: resource, subject: subject}
			if len(d.Before) > 0 && string(d.Before) != "null" {
				p.before = d.Before
			}
			out[subject] = p
			return nil
		},
	)
	return out, err
}

// statefulAction reports whether events of this resource and action carry
// the resource's state before and after: all but an advisory's steps and
// the replication records (history.recorded, crawl.*), which change no
// resource (an unpublished history.recorded held its tag out of the KV
// buckets until it was published, which a backfill's records did for
// every tag).
func statefulAction(resource, action string) bool {
	switch resource + "." + action {
	case TagMatured:
		return false // its data is the matured digest, not the tag (MaturedDigests)
	case HistoryRecorded, CrawlFailed, CrawlRecovered:
		return false
	}
	if resource != "advisory" {
		return true
	}
	switch resource + "." + action {
	case AdvisoryCreated, AdvisoryUpdated, AdvisoryWithdrawn:
		return true
	}
	return false
}

// publishedRepos calls fn with the live repos without unpublished events.
func publishedRepos(
	ctx context.Context,
	tx *sql.Tx,
	pending map[string]*pendingEvent,
	fn func(PublishedResource) error,
) error {
	err := queryRows(
		ctx,
		tx,
		`SELECT `+repoSelect+` FROM repos r WHERE r.deleted_time IS NULL`,
		nil,
		func(rows *sql.Rows) error {
			r, err := scanRepo(rows)
			if err != nil {
				return err
			}
			if _, ok := pending[r.UID]; ok {
				return nil
			}
			return fn(PublishedResource{Repo: &r.Repo})
		},
	)
	if err != nil {
		return fmt.Errorf("repos: %w", err)
	}
	return nil
}

// publishedTags calls fn with the live tags without unpublished events.
func publishedTags(
	ctx context.Context,
	tx *sql.Tx,
	pending map[string]*pendingEvent,
	fn func(PublishedResource) error,
) error {
	// The digest is the one the history walk last saw, which the last
	// tag.moved announced: the listing's may be ahead of it until the
	// history is read. A tag whose history was never read has the listing's,
	// as its tag.created said.
	err := queryRows(ctx, tx, `SELECT t.uid, t.repo_uid, COALESCE(r.name,''), COALESCE(r.path,''), t.name,
		CASE WHEN t.history_last_digest != '' THEN t.history_last_digest ELSE t.digest END, t.deprecated,
		t.bundles, COALESCE(t.create_time,''), COALESCE(t.update_time,'')
		FROM tags t LEFT JOIN repos r ON r.uid = t.repo_uid WHERE t.deleted_time IS NULL`, nil, func(rows *sql.Rows) error {
		var t Tag
		var bundles, ct, ut string
		if err := rows.Scan(
			&t.UID,
			&t.RepoUID,
			&t.Repo,
			&t.Path,
			&t.Name,
			&t.Digest,
			&t.Deprecated,
			&bundles,
			&ct,
			&ut,
		); err != nil {
			return err
		}
		if _, ok := pending[t.UID]; ok {
			return nil
		}
		t.Path = scopeOf(t.Path, t.Repo)
		if err := t.decodeText(bundles, ct, ut); err != nil {
			return err
		}
		return fn(PublishedResource{Tag: &t})
	})
	if err != nil {
		return fmt.Errorf("tags: %w", err)
	}
	return nil
}

// publishedAdvisories calls fn with the live advisories without
// unpublished events, lifecycles and aliases included.
func publishedAdvisories(
	ctx context.Context,
	tx *sql.Tx,
	pending map[string]*pendingEvent,
	fn func(PublishedResource) error,
) error {
	var uids []string
	err := queryRows(
		ctx,
		tx,
		`SELECT uid FROM advisories WHERE deleted_time IS NULL ORDER BY uid`,
		nil,
		func(rows *sql.Rows) error {
			var u string
			if err := rows.Scan(&u); err != nil {
				return err
			}
			if _, ok := pending[u]; !ok {
				uids = append(uids, u)
			}
			return nil
		},
	)
	if err != nil {
		return fmt.Errorf("advisories: %w", err)
	}
	// A few thousand at a time: the lists of every advisory at once would
	// hold the whole vulnerability database in memory.
	for start := 0; start < len(uids); start += 2000 {
		chunk := uids[start:min(start+2000, len(uids))]
		stored, err := loadAdvisories(ctx, tx, `uid IN (%s)`, chunk)
		if err != nil {
			return err
		}
		for _, u := range chunk {
			a := stored[u].Advisory
			if err := fn(PublishedResource{Advisory: &a}); err != nil {
				return err
			}
		}
	}
	return nil
}

// State is the advisory's current lifecycle state: its latest step that
// counts (approved, or without a review state), as the advisory_states
// view and the platform's latest_event_type filter read it; ok is false
// when it has none.
func (a Advisory) State() (step AdvisoryEvent, ok bool) {
	for i, e := range a.Events {
		switch e.ReviewState {
		case "", "REVIEW_STATE_APPROVED", "REVIEW_STATE_UNSPECIFIED":
		default:
			continue
		}
		// Latest create time wins, and among equal times the later step.
		if !ok || !e.CreateTime.Before(step.CreateTime) {
			step, ok = a.Events[i], true
		}
	}
	return step, ok
}

// LatestEventIDs returns, for those of subjects that have any, the id of
// the latest published event about each resource: the event that set the
// state the KV buckets show. Pruned events are gone, and so is their id.
func (s *Store) LatestEventIDs(ctx context.Context, subjects []string) (map[string]string, error) {
	out := make(map[string]string, len(subjects))
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("read latest event ids: %w", err)
	}
	defer tx.Rollback()
	err = queryByUIDs(
		ctx,
		tx,
		`SELECT l.subject, l.id, l.resource, l.action FROM event_log l
		WHERE l.subject IN (%s) AND l.seq NOT IN (SELECT seq FROM outbox) ORDER BY l.seq`,
		subjects,
		func(rows *sql.Rows) error {
			var subject, id, resource, action string
			if err := rows.Scan(&subject, &id, &resource, &action); err != nil {
				return err
			}
			if statefulAction(resource, action) {
				out[subject] = id
			}
			return nil
		},
	)
	if err != nil {
		return nil, fmt.Errorf("read latest event ids: %w", err)
	}
	return out, nil
}

// KVEpoch names the mirror's state of announcement, for the relay that
// keeps the KV buckets: empty while a baseline runs that announces
// nothing (the buckets wait for it to end rather than show a partial
// crawl and delete what it has not reached yet), and otherwise a value
// that changes when the baseline ends, after which the relay reconciles
// the buckets with PublishedState to bring in what the baseline found.
func (s *Store) KVEpoch(ctx context.Context) (string, error) {
	v, err := s.meta(ctx, s.r, "baseline_time")
	if err != nil {
		return "", fmt.Errorf("read baseline state: %w", err)
	}
	if v == "" && s.snapshot {
		return "snapshot baseline", nil
	}
	return v, nil
}
