package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Repo is a repository as the mirror keeps it.
type Repo struct {
	UID  string `json:"uid"`
	Name string `json:"name"`
	// Path is the repo's registry path below the organization: the names
	// of its uid's segments below the root group joined by '/', e.g.
	// charts/cert-manager. Empty means the name (a repo directly under the
	// root group); the store fills it in.
	Path        string    `json:"path"`
	Description string    `json:"description"`
	CatalogTier string    `json:"catalogTier,omitempty"`
	Aliases     []string  `json:"aliases,omitempty"`
	ActiveTags  []string  `json:"activeTags,omitempty"`
	Bundles     []string  `json:"bundles,omitempty"`
	CreateTime  time.Time `json:"createTime,omitzero"`
	UpdateTime  time.Time `json:"updateTime,omitzero"`
	// Raw is the repo as the platform sent it, stored in repos.raw; never
	// part of an event. Nil leaves what the mirror has.
	Raw json.RawMessage `json:"-"`
}

// repoPath is r's registry path: its Path, or its name when it has none.
func repoPath(r Repo) string { return scopeOf(r.Path, r.Name) }

// scopeOf returns path, or name for a repo (or a record of one) without a
// path, such as an event from a syncd that did not know paths.
func scopeOf(path, name string) string {
	if path == "" {
		return name
	}
	return path
}

type storedRepo struct {
	Repo
	raw       string // repos.raw, "" for none
	deleted   bool
	deletions int
}

// repoColumns is how many values one repos row takes in ApplyRepos.
const repoColumns = 12

// repoRow is the values of r's row for bulkRepos.
func repoRow(r Repo, raw any, now string) []any {
	return []any{
		r.UID,
		r.Name,
		repoPath(r),
		r.Description,
		r.CatalogTier,
		jsonList(r.Aliases),
		jsonList(r.ActiveTags),
		jsonList(r.Bundles),
		nullTime(r.CreateTime),
		nullTime(r.UpdateTime),
		now,
		raw,
	}
}

// ApplyRepos upserts one page of repos and records repo.created (also for a
// repo that comes back after a deletion, whose tombstone it clears) and
// repo.updated events (a new path is an update), all in one transaction.
// A repo whose raw JSON alone changed is rewritten without an event, and
// an unchanged one is not written at all. It returns how many events it
// recorded.
func (s *Store) ApplyRepos(ctx context.Context, repos []Repo) (int, error) {
	repos = lastByUID(repos, func(r Repo) string { return r.UID })
	n, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		uids := make([]string, len(repos))
		for i, r := range repos {
			uids[i] = r.UID
		}
		old, err := loadRepos(ctx, tx, `r.uid IN (%s)`, uids)
		if err != nil {
			return 0, err
		}
		now := FormatTime(s.now())
		var cs []change
		args := make([]any, 0, repoColumns*len(repos))
		for _, r := range repos {
			r.Path = repoPath(r)
			raw, err := rawJSON(r.Raw)
			if err != nil {
				return 0, fmt.Errorf("repo %s: %w", r.UID, err)
			}
			o, seen := old[r.UID]
			switch {
			case !seen || o.deleted:
				if s.announce(baseline) {
					cs = append(
						cs,
						change{
							typ:     RepoCreated,
							scope:   r.Path,
							subject: r.UID,
							disc:    createdDisc(r.CreateTime, r.UpdateTime, o.deletions),
							time:    eventTime(r.CreateTime, s.now()),
							after:   r,
						},
					)
				}
			case pathLearnt(o.Repo, r) && sameRepo(withPath(o.Repo, r.Path), r):
				// Schema 6 filled in every path with the name; the nested
				// repo's real path, learnt now, is no change upstream.
			case !sameRepo(o.Repo, r):
				disc, err := updatedDisc(r.UpdateTime, o.Repo, r)
				if err != nil {
					return 0, err
				}
				cs = append(
					cs,
					change{
						typ:     RepoUpdated,
						scope:   r.Path,
						subject: r.UID,
						disc:    disc,
						time:    eventTime(r.UpdateTime, s.now()),
						before:  o.Repo,
						after:   r,
					},
				)
			case rawChanged(o.raw, raw):
			default:
				continue
			}
			args = append(args, repoRow(r, raw, now)...)
		}
		if _, err := s.insertRows(ctx, tx, bulkRepos, args); err != nil {
			return 0, fmt.Errorf("upsert repos: %w", err)
		}
		return s.appendEvents(ctx, tx, cs)
	})
	if err != nil {
		return 0, fmt.Errorf("apply %d repos: %w", len(repos), err)
	}
	return n, nil
}

// repoSelect are the columns scanRepo reads, of repos r.
const repoSelect = `r.uid, r.name, r.path, r.description, r.catalog_tier, r.aliases, r.active_tags, r.bundles,
	COALESCE(r.create_time,''), COALESCE(r.update_time,''), COALESCE(r.raw,''), r.deleted_time IS NOT NULL, r.deletions`

// scanRepo reads a row of repoSelect.
func scanRepo(rows *sql.Rows) (storedRepo, error) {
	var r storedRepo
	var aliases, active, bundles, ct, ut string
	if err := rows.Scan(
		&r.UID,
		&r.Name,
		&r.Path,
		&r.Description,
		&r.CatalogTier,
		&aliases,
		&active,
		&bundles,
		&ct,
		&ut,
		&r.raw,
		&r.deleted,
		&r.deletions,
	); err != nil {
		return r, err
	}
	r.Path = repoPath(r.Repo)
	var err error
	if r.Aliases, err = parseList(aliases); err != nil {
		return r, err
	}
	if r.ActiveTags, err = parseList(active); err != nil {
		return r, err
	}
	if r.Bundles, err = parseList(bundles); err != nil {
		return r, err
	}
	if r.CreateTime, err = ParseTime(ct); err != nil {
		return r, err
	}
	r.UpdateTime, err = ParseTime(ut)
	return r, err
}

// loadRepos reads the repos matching where (on alias r, "%s" standing for
// the list of uids), deleted ones included.
func loadRepos(ctx context.Context, tx *sql.Tx, where string, uids []string) (map[string]storedRepo, error) {
	old := make(map[string]storedRepo, len(uids))
	err := queryByUIDs(ctx, tx, `SELECT `+repoSelect+` FROM repos r WHERE `+where, uids,
		func(rows *sql.Rows) error {
			r, err := scanRepo(rows)
			if err != nil {
				return err
			}
			old[r.UID] = r
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("read stored repos: %w", err)
	}
	return old, nil
}

// RepoByPath returns the live repo whose registry path is path (for a repo
// directly under the root group, its name), with its raw JSON, and whether
// there is one. A push names its repository by path; this resolves it
// without asking the platform.
func (s *Store) RepoByPath(ctx context.Context, path string) (Repo, bool, error) {
	var found *storedRepo
	err := queryRows(
		ctx,
		s.r,
		`SELECT `+repoSelect+` FROM repos r WHERE r.path = ? AND r.deleted_time IS NULL ORDER BY r.uid LIMIT 1`,
		[]any{path},
		func(rows *sql.Rows) error {
			r, err := scanRepo(rows)
			found = &r
			return err
		},
	)
	if err != nil {
		return Repo{}, false, fmt.Errorf("find repo at path %q: %w", path, err)
	}
	if found == nil {
		return Repo{}, false, nil
	}
	r := found.Repo
	if found.raw != "" {
		r.Raw = json.RawMessage(found.raw)
	}
	return r, true, nil
}

// pathLearnt reports whether r's path replaces the name that stood for it
// in old (as the migration to schema 6 wrote it): a repo's path changes
// with its uid otherwise, or when a group above it is renamed, and neither
// makes a path that was the bare name.
func pathLearnt(old, r Repo) bool {
	return old.Path == old.Name && r.Path != old.Path && strings.HasSuffix(r.Path, "/"+r.Name)
}

func withPath(r Repo, path string) Repo {
	r.Path = path
	return r
}

func sameRepo(a, b Repo) bool {
	return a.Name == b.Name &&
		repoPath(a) == repoPath(b) &&
		a.Description == b.Description &&
		a.CatalogTier == b.CatalogTier &&
		slices.Equal(a.Aliases, b.Aliases) && slices.Equal(a.ActiveTags, b.ActiveTags) &&
		slices.Equal(a.Bundles, b.Bundles) &&
		sameTime(a.CreateTime, b.CreateTime) &&
		sameTime(a.UpdateTime, b.UpdateTime)
}

// sameTime compares times as the mirror stores them, to the millisecond, so
// that a finer clock upstream does not look like a change on every crawl.
func sameTime(a, b time.Time) bool { return FormatTime(a) == FormatTime(b) }

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
