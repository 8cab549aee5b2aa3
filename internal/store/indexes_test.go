package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"testing"

	_ "modernc.org/sqlite"

	"github.com/syncd-dev/syncd/internal/store"
)

// deferred are the indexes a baseline goes without, as the migrations
// create them.
var deferred = map[string]string{
	"tag_history_time":   `CREATE INDEX tag_history_time ON tag_history(update_time)`,
	"tag_history_digest": `CREATE INDEX tag_history_digest ON tag_history(digest)`,
}

// indexSQL returns the deferred indexes the database has, by name.
func indexSQL(t *testing.T, db *sql.DB) map[string]string {
	t.Helper()
	rows, err := db.Query(
		`SELECT name, sql FROM sqlite_schema WHERE type = 'index' AND name IN ('tag_history_time', 'tag_history_digest')`,
	)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	got := map[string]string{}
	for rows.Next() {
		var name, sql string
		if err := rows.Scan(&name, &sql); err != nil {
			t.Fatal(err)
		}
		got[name] = sql
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return got
}

func sameIndexes(t *testing.T, when string, db *sql.DB, want map[string]string) {
	t.Helper()
	got := indexSQL(t, db)
	if len(got) != len(want) {
		t.Fatalf("%s: deferred indexes present = %v, want %v", when, got, want)
	}
	for name, sql := range want {
		if got[name] != sql {
			t.Fatalf("%s: index %s = %q, want %q", when, name, got[name], sql)
		}
	}
}

// TestDeferredIndexes: a baseline writes history without the indexes by
// time and digest, ending the baseline builds them exactly as the
// migrations define them (and queries use them), and a mirror past its
// baseline never goes without them.
func TestDeferredIndexes(t *testing.T) {
	ctx := context.Background()

	t.Run("BaselineDefersAndEndBuilds", func(t *testing.T) {
		st, path := openTemp(t, newClock(), true, store.Options{})
		sameIndexes(t, "fresh mirror", st.Reader(), deferred)
		if err := st.DeferIndexes(ctx); err != nil {
			t.Fatal(err)
		}
		sameIndexes(t, "deferred", st.Reader(), nil)
		firstCrawl(t, st)
		// A restart in the middle of the baseline (as after a crash) keeps
		// them deferred: the crawl goes on where it was.
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		st = mustOpen(t, path, store.Options{Now: newClock().Now})
		sameIndexes(t, "reopened in the baseline", st.Reader(), nil)
		if err := st.EndBaseline(ctx); err != nil {
			t.Fatal(err)
		}
		sameIndexes(t, "after the baseline", st.Reader(), deferred)
		// The history the baseline wrote is in the new indexes.
		if got := queryInt(
			t,
			st.Reader(),
			`SELECT COUNT(*) FROM tag_history INDEXED BY tag_history_digest WHERE digest = ?`,
			digest(2),
		); got != 2 {
			t.Fatalf("rows found by digest through the index = %d, want 2", got)
		}
		if got := queryInt(
			t,
			st.Reader(),
			`SELECT COUNT(*) FROM tag_history INDEXED BY tag_history_time WHERE update_time >= '2025-01-02'`,
		); got != 2 {
			t.Fatalf("rows found by time through the index = %d, want 2", got)
		}
		var plan []string
		rows, err := st.Reader().Query(`EXPLAIN QUERY PLAN SELECT tag_uid FROM tag_history WHERE digest = 'x'`)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var id, parent, unused int
			var detail string
			if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
				t.Fatal(err)
			}
			plan = append(plan, detail)
		}
		rows.Close()
		if !strings.Contains(strings.Join(plan, "; "), "tag_history_digest") {
			t.Fatalf("a lookup by digest does not use the index: %s", plan)
		}
		// The writer is back to its own settings: statement journals in
		// memory, its whole page cache, no sorting threads.
		for name, want := range map[string]string{
			"temp_store": "2",
			"cache_size": fmt.Sprint(-store.DefaultCacheKiB),
			"threads":    "0",
		} {
			if got, err := st.WriterPragma(ctx, name); err != nil || got != want {
				t.Fatalf("writer's %s = %q (%v), want %q", name, got, err, want)
			}
		}
		// Once the baseline is over, nothing defers them again.
		if err := st.DeferIndexes(ctx); err != nil {
			t.Fatal(err)
		}
		sameIndexes(t, "deferring past the baseline", st.Reader(), deferred)
	})

	t.Run("OpenRepairs", func(t *testing.T) {
		st, path := openTemp(t, newClock(), false, store.Options{})
		if err := st.Close(); err != nil {
			t.Fatal(err)
		}
		db, err := sql.Open("sqlite", "file:"+path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(`DROP INDEX tag_history_time; DROP INDEX tag_history_digest`); err != nil {
			t.Fatal(err)
		}
		db.Close()
		st = mustOpen(t, path, store.Options{})
		sameIndexes(t, "reopened past the baseline", st.Reader(), deferred)
	})

	t.Run("FollowingEndsTheBaseline", func(t *testing.T) {
		clk := newClock()
		leader, _ := openTemp(t, clk, false, store.Options{})
		follower := mustOpen(t, filepath.Join(t.TempDir(), "follower.db"), store.Options{Now: clk.Now})
		if err := follower.DeferIndexes(ctx); err != nil {
			t.Fatal(err)
		}
		sameIndexes(t, "follower deferred", follower.Reader(), nil)
		mustApplyRepos(t, leader, nginx())
		evs, err := leader.Unpublished(ctx, 0, 10)
		if err != nil || len(evs) == 0 {
			t.Fatalf("leader's events: %d, %v", len(evs), err)
		}
		var stream []store.StreamEvent
		for _, e := range evs {
			stream = append(stream, store.StreamEvent{ID: e.ID, Type: e.Type, Subject: e.Subject, Time: e.Time, Data: e.Data})
		}
		if _, err := follower.ApplyStreamEvents(ctx, stream); err != nil {
			t.Fatal(err)
		}
		if b, err := follower.InBaseline(ctx); err != nil || b {
			t.Fatalf("follower InBaseline=%v (%v) after following", b, err)
		}
		sameIndexes(t, "follower past its baseline", follower.Reader(), deferred)
	})

	t.Run("CatchUpDefersUntilBuilt", func(t *testing.T) {
		// A follower catching up from the stream's start goes without them
		// while it applies the leader's baseline, past the baseline's end
		// its first batch records; a mirror reopened meanwhile (a crash)
		// builds them, and BuildIndexes does once it has caught up.
		clk := newClock()
		leader, _ := openTemp(t, clk, false, store.Options{})
		firstCrawl(t, leader)
		evs := stream(t, leader)
		path := filepath.Join(t.TempDir(), "follower.db")
		follower, err := store.Open(ctx, path, store.Options{Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		if deferred, err := follower.DeferIndexesForCatchUp(ctx); err != nil || !deferred {
			t.Fatalf("DeferIndexesForCatchUp of an empty mirror = %v, %v; want true", deferred, err)
		}
		sameIndexes(t, "empty follower deferred", follower.Reader(), nil)
		half := len(evs) / 2
		if _, err := follower.ApplyStream(ctx, evs[:half]); err != nil {
			t.Fatal(err)
		}
		if b, err := follower.InBaseline(ctx); err != nil || b {
			t.Fatalf("follower InBaseline=%v (%v) after following", b, err)
		}
		sameIndexes(t, "follower past its baseline, catching up", follower.Reader(), nil)
		// Not empty any more: nothing defers them again.
		if deferred, err := follower.DeferIndexesForCatchUp(ctx); err != nil || deferred {
			t.Fatalf("DeferIndexesForCatchUp of a mirror that holds events = %v, %v; want false", deferred, err)
		}

		// Stopped during its catch-up and opened again: Open builds them.
		if err := follower.Close(); err != nil {
			t.Fatal(err)
		}
		reopened := mustOpen(t, path, store.Options{Now: clk.Now})
		sameIndexes(t, "follower reopened during its catch-up", reopened.Reader(), deferred)
		if deferred, err := reopened.DeferIndexesForCatchUp(ctx); err != nil || deferred {
			t.Fatalf("DeferIndexesForCatchUp after a restart = %v, %v; want false", deferred, err)
		}
		sameIndexes(t, "reopened follower asked to defer", reopened.Reader(), deferred)

		// Another follower that catches up whole: BuildIndexes builds them,
		// holding every history row.
		other := mustOpen(t, filepath.Join(t.TempDir(), "other.db"), store.Options{Now: clk.Now})
		if deferred, err := other.DeferIndexesForCatchUp(ctx); err != nil || !deferred {
			t.Fatalf("DeferIndexesForCatchUp = %v, %v; want true", deferred, err)
		}
		if _, err := other.ApplyStream(ctx, evs); err != nil {
			t.Fatal(err)
		}
		sameIndexes(t, "caught up, not built yet", other.Reader(), nil)
		if err := other.BuildIndexes(ctx); err != nil {
			t.Fatal(err)
		}
		sameIndexes(t, "built", other.Reader(), deferred)
		want := queryInt(t, leader.Reader(), `SELECT COUNT(*) FROM tag_history WHERE digest = ?`, digest(2))
		if got := queryInt(
			t,
			other.Reader(),
			`SELECT COUNT(*) FROM tag_history INDEXED BY tag_history_digest WHERE digest = ?`,
			digest(2),
		); got != want || got == 0 {
			t.Fatalf("rows found by digest through the built index = %d, want the leader's %d", got, want)
		}
	})
}
