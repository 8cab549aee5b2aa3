package store_test

import (
	"context"
	"database/sql"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestOpenReadOnly reads a mirror that another Store writes, changes
// nothing, and refuses what it cannot read: no file, a file whose schema
// is not there yet, and a schema newer than this binary.
func TestOpenReadOnly(t *testing.T) {
	ctx := context.Background()
	st, path := openTemp(t, newClock(), false, store.Options{})
	mustApplyRepos(t, st, nginx())

	ro, err := store.OpenReadOnly(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := ro.Status(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if s.Tables["repos"] != 1 {
		t.Fatalf("read-only status counts %d repos, want 1", s.Tables["repos"])
	}
	if err := ro.SetMeta(ctx, "x", "y"); err == nil {
		t.Fatal("a write through a read-only store succeeded")
	}
	// The writer goes on while the reader is open.
	mustApplyRepos(t, st, store.Repo{UID: "g1/r9", Name: "redis"})
	if s, _ := ro.Status(ctx); s.Tables["repos"] != 2 {
		t.Fatalf("read-only status counts %d repos after a write, want 2", s.Tables["repos"])
	}
	if err := ro.Close(); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	if _, err := store.OpenReadOnly(ctx, filepath.Join(dir, "none.db")); err == nil {
		t.Error("opened a mirror that does not exist")
	}
	if _, err := os.Stat(filepath.Join(dir, "none.db")); err == nil {
		t.Error("OpenReadOnly created the file")
	}
	empty := filepath.Join(dir, "empty.db")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := store.OpenReadOnly(ctx, empty); err == nil || !strings.Contains(err.Error(), "no schema yet") {
		t.Errorf("empty file: err=%v, want one saying the schema is not there yet", err)
	}

	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(
		`INSERT INTO schema_migrations (version, name, applied_time) VALUES (999, 'future', '')`,
	); err != nil {
		t.Fatal(err)
	}
	if _, err := store.OpenReadOnly(ctx, path); err == nil || !strings.Contains(err.Error(), "newer than this syncd") {
		t.Errorf("newer schema: err=%v, want a refusal naming it", err)
	}
}

// TestReaders_StayOpen: the read pool keeps every reader it opened, so
// that a burst of reads does not close readers and open them again, each
// preparing its statements anew (database/sql keeps two idle by default).
func TestReaders_StayOpen(t *testing.T) {
	ctx := context.Background()
	st := mustOpen(t, filepath.Join(t.TempDir(), "mirror.db"), store.Options{Readers: 4})
	var conns []*sql.Conn
	for range 4 {
		c, err := st.Reader().Conn(ctx)
		if err != nil {
			t.Fatal(err)
		}
		conns = append(conns, c)
	}
	for _, c := range conns {
		c.Close()
	}
	if s := st.Reader().Stats(); s.Idle != 4 || s.MaxIdleClosed != 0 {
		t.Errorf("after 4 readers at once: %d idle, %d closed for the idle limit; want 4 and 0", s.Idle, s.MaxIdleClosed)
	}
}
