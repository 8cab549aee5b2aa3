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
