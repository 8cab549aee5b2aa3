package store_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

func TestOpen(t *testing.T) {
	ctx := context.Background()
	t.Run("FilesAre0600", func(t *testing.T) {
		// The mirror is an organization's inventory: only its owner reads it.
		path := filepath.Join(t.TempDir(), "sub", "mirror.db")
		st := mustOpen(t, path, store.Options{})
		mustApplyRepos(t, st, nginx()) // writes the WAL
		for _, p := range []string{path, path + "-wal", path + "-shm"} {
			fi, err := os.Stat(p)
			if err != nil {
				t.Fatal(err)
			}
			if got, want := fi.Mode().Perm(), os.FileMode(0o600); got != want {
				t.Fatalf("%s mode=%v, want %v", filepath.Base(p), got, want)
			}
		}
		fi, err := os.Stat(filepath.Dir(path))
		if err != nil {
			t.Fatal(err)
		}
		if got, want := fi.Mode().Perm(), os.FileMode(0o700); got != want {
			t.Fatalf("directory mode=%v, want %v", got, want)
		}
	})
	t.Run("ReaderIsReadOnly", func(t *testing.T) {
		st := mustOpen(t, filepath.Join(t.TempDir(), "m.db"), store.Options{})
		if _, err := st.Reader().Exec(`INSERT INTO meta (key, value) VALUES ('x', 'y')`); err == nil {
			t.Fatal("a write through Reader succeeded")
		}
		if got, err := st.Meta(ctx, "x"); err != nil || got != "" {
			t.Fatalf("meta x=%q err=%v, want empty", got, err)
		}
	})
	t.Run("BeforeCommitErrorRollsBackThePage", func(t *testing.T) {
		fail := errors.New("injected")
		st := mustOpen(t, filepath.Join(t.TempDir(), "m.db"), store.Options{
			BeforeCommit: func(context.Context) error { return fail },
		})
		if err := st.EndBaseline(ctx); err != nil {
			t.Fatal(err)
		}
		if _, err := st.ApplyRepos(ctx, []store.Repo{nginx()}); !errors.Is(err, fail) {
			t.Fatalf("err=%v, want the hook's error", err)
		}
		if got := queryInt(t, st.Reader(), `SELECT (SELECT COUNT(*) FROM repos) + (SELECT COUNT(*) FROM events)`); got != 0 {
			t.Fatalf("rows and events after a rolled back page=%d, want 0", got)
		}
	})
	t.Run("RefusesNewerSchema", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "m.db")
		st, err := store.Open(ctx, path, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		v, err := st.SchemaVersion(ctx)
		if err != nil {
			t.Fatal(err)
		}
		st.Close()
		db, err := sql.Open("sqlite", path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := db.Exec(
			`INSERT INTO schema_migrations (version, name, applied_time) VALUES (?, 'future.sql', '')`,
			v+1,
		); err != nil {
			t.Fatal(err)
		}
		db.Close()
		if _, err := store.Open(ctx, path, store.Options{}); err == nil || !strings.Contains(err.Error(), "newer") {
			t.Fatalf("open of a newer schema: err=%v, want a refusal", err)
		}
	})
}

func TestOutbox(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	mustApplyRepos(t, st, nginx(), store.Repo{UID: "g1/r2", Name: "redis"}, store.Repo{UID: "g1/r3", Name: "kafka"})
	select {
	case <-st.Notify():
	default:
		t.Fatal("no notification after a commit that added events")
	}
	evs, err := st.Unpublished(ctx, 0, 2)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := len(evs), 2; got != want {
		t.Fatalf("unpublished page=%d, want %d", got, want)
	}
	if err := st.MarkPublished(ctx, []int64{evs[0].Seq, evs[1].Seq}); err != nil {
		t.Fatal(err)
	}
	n, oldest, err := st.UnpublishedCount(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 || !oldest.Equal(clk.Now()) {
		t.Fatalf("unpublished=%d oldest=%v, want 1 and %v", n, oldest, clk.Now())
	}
	clk.Advance(48 * time.Hour)
	pruned, err := st.PruneEvents(ctx, clk.Now().Add(-24*time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if got, want := pruned, int64(2); got != want {
		t.Fatalf("pruned=%d, want %d", got, want)
	}
	if got, want := queryInt(t, st.Reader(), `SELECT COUNT(*) FROM events WHERE published_time IS NULL`), 1; got != want {
		t.Fatalf("unpublished left=%d, want %d: unpublished events are never pruned", got, want)
	}
}

// TestOutbox_PublishRuns marks events out of order, with a gap and a
// duplicate, and reads back what the events view and the outbox say.
func TestOutbox_PublishRuns(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	st, _ := openTemp(t, clk, false, store.Options{})
	var repos []store.Repo
	for i := range 6 {
		repos = append(repos, store.Repo{UID: fmt.Sprintf("g1/r%d", i), Name: fmt.Sprintf("repo-%d", i)})
	}
	mustApplyRepos(t, st, repos...)
	evs, err := st.Unpublished(ctx, 0, 100)
	if err != nil || len(evs) != 6 {
		t.Fatalf("unpublished=%d err=%v, want 6", len(evs), err)
	}
	for _, e := range evs {
		if e.Resource != "repo" || e.Action != "created" || e.Type != "repo.created" {
			t.Fatalf("event %d: resource=%q action=%q type=%q", e.Seq, e.Resource, e.Action, e.Type)
		}
	}
	seq := func(i int) int64 { return evs[i].Seq }
	// Acknowledged out of order, with the third event missing: runs 0-1 and 3-4.
	clk.Advance(time.Second)
	first := clk.Now()
	if err := st.MarkPublished(ctx, []int64{seq(4), seq(0), seq(3), seq(1)}); err != nil {
		t.Fatal(err)
	}
	// A duplicate acknowledgement changes nothing.
	clk.Advance(time.Second)
	if err := st.MarkPublished(ctx, []int64{seq(1), seq(5)}); err != nil {
		t.Fatal(err)
	}
	db := st.Reader()
	if got, want := queryInt(t, db, `SELECT COUNT(*) FROM event_publishes`), 3; got != want {
		t.Fatalf("publication runs=%d, want %d", got, want)
	}
	want := []string{
		store.FormatTime(first),
		store.FormatTime(first),
		"",
		store.FormatTime(first),
		store.FormatTime(first),
		store.FormatTime(clk.Now()),
	}
	for i, w := range want {
		if got := queryString(t, db, `SELECT COALESCE(published_time, '') FROM events WHERE seq = ?`, seq(i)); got != w {
			t.Errorf("event %d published_time=%q, want %q", i, got, w)
		}
	}
	left, err := st.Unpublished(ctx, 0, 100)
	if err != nil || len(left) != 1 || left[0].Seq != seq(2) {
		t.Fatalf("outbox=%v err=%v, want the third event alone", left, err)
	}
	// Pruning takes the published events and their runs, and keeps the gap.
	clk.Advance(48 * time.Hour)
	if n, err := st.PruneEvents(ctx, clk.Now().Add(-24*time.Hour)); err != nil || n != 5 {
		t.Fatalf("pruned=%d err=%v, want 5", n, err)
	}
	if got := queryInt(t, db, `SELECT COUNT(*) FROM event_publishes`); got != 0 {
		t.Fatalf("publication runs after pruning=%d, want 0", got)
	}
	if got := queryInt(t, db, `SELECT COUNT(*) FROM events WHERE published_time IS NULL`); got != 1 {
		t.Fatalf("unpublished after pruning=%d, want 1", got)
	}
}

func TestSubscriptions(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), false, store.Options{})
	a := store.Subscription{
		UID:        "g1/s1",
		GroupUID:   "g1",
		Sink:       "https://syncd.example/hook",
		CreateTime: ts("2026-01-01T00:00:00Z"),
	}
	b := store.Subscription{
		UID:        "g1/s2",
		GroupUID:   "g1",
		Sink:       "https://other.example/hook",
		CreateTime: ts("2026-01-02T00:00:00Z"),
	}
	for _, s := range []store.Subscription{b, a, a} {
		if err := st.UpsertSubscription(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	subs, err := st.Subscriptions(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(subs) != 2 || subs[0].UID != a.UID || subs[1].UID != b.UID || subs[0].Sink != a.Sink ||
		!subs[0].CreateTime.Equal(a.CreateTime) {
		t.Fatalf("subscriptions=%+v, want a then b", subs)
	}
	if err := st.DeleteSubscription(ctx, a.UID); err != nil {
		t.Fatal(err)
	}
	if subs, err = st.Subscriptions(ctx); err != nil || len(subs) != 1 || subs[0].UID != b.UID {
		t.Fatalf("after delete: %+v err=%v, want only b", subs, err)
	}
	if got, want := queryInt(
		t,
		st.Reader(),
		`SELECT COUNT(*) FROM subscriptions WHERE deleted_time IS NOT NULL`,
	), 1; got != want {
		t.Fatalf("tombstoned subscriptions=%d, want %d", got, want)
	}
	if err := st.UpsertSubscription(ctx, a); err != nil {
		t.Fatal(err)
	}
	if subs, err = st.Subscriptions(ctx); err != nil || len(subs) != 2 {
		t.Fatalf("after re-registering: %+v err=%v, want two", subs, err)
	}
}
