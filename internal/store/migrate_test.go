package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// migrationFiles returns the migration files in the order Open applies them.
func migrationFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("migrations", "*.sql"))
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(files) // numbered with leading zeros, so names sort by version
	if len(files) < 2 {
		t.Fatalf("found %d migrations; the upgrade test needs an earlier version to upgrade from", len(files))
	}
	return files
}

// createAtVersion builds a database as a syncd that knew only the first n
// migrations left it, with a few rows of every table version 1 has.
func createAtVersion(t *testing.T, path string, files []string, n int) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	exec := func(q string, args ...any) {
		t.Helper()
		if _, err := db.Exec(q, args...); err != nil {
			t.Fatalf("%.60s: %v", q, err)
		}
	}
	exec(`CREATE TABLE schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_time TEXT NOT NULL)`)
	for _, f := range files[:n] {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		num, _, _ := strings.Cut(filepath.Base(f), "_")
		v, err := strconv.Atoi(num)
		if err != nil {
			t.Fatalf("migration %s: %v", f, err)
		}
		exec(string(b))
		exec(
			`INSERT INTO schema_migrations (version, name, applied_time) VALUES (?, ?, '2025-01-01T00:00:00.000Z')`,
			v,
			filepath.Base(f),
		)
	}
	if n == 0 {
		return
	}
	exec(`INSERT INTO meta (key, value) VALUES ('baseline_time', '2025-01-01T00:00:00.000Z')`)
	exec(`INSERT INTO repos (uid, name, first_seen_time) VALUES ('g1/r1', 'nginx', '2025-01-01T00:00:00.000Z')`)
	if n >= 6 {
		exec(`UPDATE repos SET path = name`) // as syncd writes it from version 6 on
	}
	exec(
		`INSERT INTO tags (uid, repo_uid, name, digest, first_seen_time, history_last_time, history_last_count,
			history_count, history_last_digest)
		VALUES ('g1/r1/t1', 'g1/r1', 'latest', ?, '2025-01-01T00:00:00.000Z', '2025-01-02T00:00:00.000Z', 1, 2, ?)`,
		digest(2),
		digest(2),
	)
	exec(
		`INSERT INTO tag_history (tag_uid, seq, update_time, digest) VALUES ('g1/r1/t1', 0, '2025-01-01T00:00:00.000Z', ?), ('g1/r1/t1', 1, '2025-01-02T00:00:00.000Z', ?)`,
		digest(1),
		digest(2),
	)
	exec(
		`INSERT INTO advisories (uid, advisory_id, artifact_name, update_time, first_seen_time) VALUES ('g1/a1', 'CGA-1', 'openssl', '2025-01-01T00:00:00.000Z', '2025-01-01T00:00:00.000Z')`,
	)
	exec(
		`INSERT INTO subscriptions (uid, group_uid, sink, synced_time) VALUES ('g1/s1', 'g1', 'https://syncd.example/hook', '2025-01-01T00:00:00.000Z')`,
	)
	// From version 5 on, events is a view over event_log.
	events := "events"
	if n >= 5 {
		events = "event_log"
	}
	exec(`INSERT INTO ` + events + ` (id, type, resource, action, scope, subject, time, data, created_time)
		VALUES ('old-event', 'tag.moved', 'tag', 'moved', 'nginx', 'g1/r1/t1', '2025-01-02T00:00:00.000Z', '{}',
			'2025-01-02T00:00:00.000Z')`)
	exec(`INSERT INTO ` + events + ` (id, type, resource, action, scope, subject, time, data, created_time)
		VALUES ('old-published', 'tag.moved', 'tag', 'moved', 'nginx', 'g1/r1/t1', '2025-01-02T00:00:00.000Z', '{}',
			'2025-01-02T00:00:00.000Z')`)
	if n >= 5 {
		exec(`DELETE FROM outbox WHERE seq = (SELECT seq FROM event_log WHERE id = 'old-published')`)
		exec(
			`INSERT INTO event_publishes (first_seq, last_seq, published_time) SELECT seq, seq, '2025-01-02T00:00:01.000Z' FROM event_log WHERE id = 'old-published'`,
		)
	} else {
		exec(`UPDATE events SET published_time = '2025-01-02T00:00:01.000Z' WHERE id = 'old-published'`)
	}
	exec(`INSERT INTO crawl_runs (job, started_time, outcome) VALUES ('crawl', '2025-01-01T00:00:00.000Z', 'ok')`)
}

func TestMigrate_UpgradesEveryEarlierVersion(t *testing.T) {
	files := migrationFiles(t)
	latest := len(files) // versions are numbered 1, 2, … without gaps
	for n := 0; n <= latest; n++ {
		t.Run(fmt.Sprintf("FromVersion%d", n), func(t *testing.T) {
			ctx := context.Background()
			path := filepath.Join(t.TempDir(), "mirror.db")
			createAtVersion(t, path, files, n)
			st := mustOpen(t, path, store.Options{Now: newClock().Now})
			if got, err := st.SchemaVersion(ctx); err != nil || got != latest {
				t.Fatalf("schema version=%d err=%v, want %d", got, err, latest)
			}
			if n == 0 {
				if got := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM repos`); got != 0 {
					t.Fatalf("repos=%d in a fresh mirror", got)
				}
				return
			}
			db := st.Reader()
			if got, want := queryString(
				t,
				db,
				`SELECT before_digest FROM tag_moves WHERE tag = 'latest'`,
			), digest(1); got != want {
				t.Fatalf("old history through tag_moves: before=%s, want %s", got, want)
			}
			if got, want := queryInt(t, db, `SELECT COUNT(*) FROM events WHERE published_time IS NULL`), 1; got != want {
				t.Fatalf("unpublished events kept=%d, want %d", got, want)
			}
			if got, want := queryString(
				t,
				db,
				`SELECT published_time FROM events WHERE id = 'old-published'`,
			), "2025-01-02T00:00:01.000Z"; got != want {
				t.Fatalf("published_time of a published event=%q, want %q", got, want)
			}
			if evs, err := st.Unpublished(ctx, 0, 10); err != nil || len(evs) != 1 || evs[0].ID != "old-event" {
				t.Fatalf("outbox after the upgrade=%+v err=%v, want old-event alone", evs, err)
			}
			if got, want := queryInt(t, db, `SELECT moves FROM repo_moves WHERE repo = 'nginx'`), 1; got != want {
				t.Fatalf("repo_moves=%d, want %d", got, want)
			}
			// What the newer schema added works on the old rows.
			if n, err := st.MarkTagsDeleted(ctx, []string{"g1/r1/t1"}); err != nil || n != 1 {
				t.Fatalf("delete an old tag: events=%d err=%v, want 1 and nil", n, err)
			}
			evs := allEvents(t, st)
			if before, _ := payload[store.Tag](t, evs[len(evs)-1]); before.Digest != digest(2) || before.Repo != "nginx" {
				t.Fatalf("tag.deleted before=%+v", before)
			}
			upd := store.Advisory{UID: "g1/a1", AdvisoryID: "CGA-1", ArtifactName: "openssl",
				CreateTime: ts("2024-12-01T00:00:00Z"), UpdateTime: ts("2025-01-01T00:00:00Z")}
			if n, err := st.ApplyAdvisories(ctx, []store.Advisory{upd}); err != nil || n != 1 {
				t.Fatalf("update an old advisory: events=%d err=%v, want 1 and nil", n, err)
			}
			if got, want := queryInt(
				t,
				db,
				`SELECT open_advisories FROM advisories_by_artifact WHERE artifact_name = 'openssl'`,
			), 1; got != want {
				t.Fatalf("open advisories=%d, want %d", got, want)
			}
			subs, err := st.Subscriptions(ctx)
			if err != nil || len(subs) != 1 {
				t.Fatalf("subscriptions=%v err=%v, want the old one", subs, err)
			}
			// Version 6: an old repo's path is its name, in the table and the
			// views; raw JSON is unknown; old runs count no failures.
			if got, want := queryString(t, db, `SELECT path FROM repos WHERE uid = 'g1/r1'`), "nginx"; got != want {
				t.Fatalf("path of an old repo=%q, want its name %q", got, want)
			}
			if got, want := queryString(t, db, `SELECT path FROM tag_moves WHERE tag = 'latest'`), "nginx"; got != want {
				t.Fatalf("tag_moves.path=%q, want %q", got, want)
			}
			if got, want := queryString(t, db, `SELECT path FROM repo_moves WHERE repo = 'nginx'`), "nginx"; got != want {
				t.Fatalf("repo_moves.path=%q, want %q", got, want)
			}
			if got := queryInt(t, db, `SELECT COUNT(*) FROM repos WHERE raw IS NOT NULL`); got != 0 {
				t.Fatalf("repos with raw JSON after the upgrade=%d, want 0", got)
			}
			if got, want := queryString(t, db, `SELECT outcome || '/' || failures FROM crawl_runs`), "ok/0"; got != want {
				t.Fatalf("old run=%q, want %q", got, want)
			}
			if r, ok, err := st.RepoByPath(ctx, "nginx"); err != nil || !ok || r.UID != "g1/r1" {
				t.Fatalf("RepoByPath(nginx)=%+v, %v, %v; want g1/r1", r, ok, err)
			}
			if _, err := st.RecordFailure(
				ctx,
				store.Failure{Kind: store.FailureRepo, UID: "g1/r1", Error: "boom"},
				nil,
			); err != nil {
				t.Fatalf("record a failure after the upgrade: %v", err)
			}
			// A page of tags of the old repo is scoped by its path.
			newTag := store.Tag{UID: "g1/r1/t2", Name: "stable", Digest: digest(3), UpdateTime: ts("2025-03-01T00:00:00Z")}
			if n := testutil.AnnounceTags(t, st, store.Repo{UID: "g1/r1", Name: "nginx"}, []store.Tag{newTag}); n != 1 {
				t.Fatalf("apply a tag of an old repo: events=%d, want 1", n)
			}
			evs = allEvents(t, st)
			if e := evs[len(evs)-1]; e.Scope != "nginx" {
				t.Fatalf("scope of a tag event of an old repo=%q, want nginx", e.Scope)
			}
		})
	}
}
