package store_test

import (
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
)

// backupOf writes a snapshot of a fresh mirror past its baseline.
func backupOf(t *testing.T) string {
	t.Helper()
	st, _ := openTemp(t, newClock(), false, store.Options{})
	return backupTo(t, st)
}

// backupTo writes a snapshot of st to a file of the test's and returns its
// path.
func backupTo(t *testing.T, st *store.Store) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "snap.db")
	if err := store.CreateEmpty(path); err != nil {
		t.Fatal(err)
	}
	if err := st.Backup(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCheckSnapshot: a mirror's backup passes; one with an extra view (a
// recursive one, which would run for ever) or trigger, or damaged pages,
// is refused with ErrBadSnapshot, and a restore of it copies nothing.
func TestCheckSnapshot(t *testing.T) {
	ctx := context.Background()
	if err := store.CheckSnapshot(ctx, backupOf(t)); err != nil {
		t.Fatalf("a mirror's own backup: %v", err)
	}
	for _, c := range []struct{ name, sql string }{
		{
			"recursive view",
			`CREATE VIEW boom AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c`,
		},
		{"trigger", `CREATE TRIGGER evil AFTER INSERT ON repos BEGIN DELETE FROM tags; END`},
		{"changed index", `DROP INDEX tag_history_time; CREATE INDEX tag_history_time ON tag_history(digest)`},
	} {
		t.Run(c.name, func(t *testing.T) {
			path := backupOf(t)
			db, err := sql.Open("sqlite", path)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := db.Exec(c.sql); err != nil {
				t.Fatal(err)
			}
			db.Close()
			if err := store.CheckSnapshot(ctx, path); !errors.Is(err, store.ErrBadSnapshot) {
				t.Fatalf("CheckSnapshot: %v, want ErrBadSnapshot", err)
			}
			follower, _ := openTemp(t, newClock(), false, store.Options{})
			err = follower.Restore(ctx, path, store.SnapshotAt{Seq: 7}, store.Verified)
			if !errors.Is(err, store.ErrBadSnapshot) {
				t.Fatalf("Restore: %v, want ErrBadSnapshot", err)
			}
			if seq, err := follower.SnapshotSeq(ctx); err != nil || seq != 0 {
				t.Errorf("the refused restore recorded snapshot seq %d (%v)", seq, err)
			}
		})
	}
	t.Run("damaged", func(t *testing.T) {
		path := backupOf(t)
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		// Past the first page (the header and sqlite_schema's root): the
		// tables' pages.
		for i := 4096 + 100; i < len(b); i += 7 {
			b[i] ^= 0x5a
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := store.CheckSnapshot(ctx, path); !errors.Is(err, store.ErrBadSnapshot) {
			t.Fatalf("CheckSnapshot: %v, want ErrBadSnapshot", err)
		}
	})
}

// TestCheckSnapshot_DuringTheFirstSync: a leader writes snapshots while its
// first sync still goes without the history indexes (DeferIndexes); such
// a snapshot passes the check, and a mirror restored from it has them.
// Before, every such snapshot was refused for lacking tag_history_digest,
// and a follower that joined then built its mirror from the stream alone.
func TestCheckSnapshot_DuringTheFirstSync(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), true, store.Options{InitialEvents: "snapshot"})
	if err := st.DeferIndexes(ctx); err != nil {
		t.Fatal(err)
	}
	if n := queryInt(
		t,
		st.Reader(),
		`SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name IN ('tag_history_time', 'tag_history_digest')`,
	); n != 0 {
		t.Fatalf("the mirror in its first sync has %d of the 2 history indexes, want none", n)
	}
	path := filepath.Join(t.TempDir(), "snap.db")
	if err := store.CreateEmpty(path); err != nil {
		t.Fatal(err)
	}
	if err := st.Backup(ctx, path); err != nil {
		t.Fatal(err)
	}
	if err := store.CheckSnapshot(ctx, path); err != nil {
		t.Fatalf("a snapshot without the deferred indexes: %v", err)
	}
	// Adopted (verified) and copied (unverified), each from a copy of the
	// file: a restore that adopts it changes it.
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, from := range []store.Provenance{store.Verified, store.Unverified} {
		p := filepath.Join(t.TempDir(), "snap.db")
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
		follower, _ := openTemp(t, newClock(), false, store.Options{})
		if err := follower.Restore(ctx, p, store.SnapshotAt{Seq: 3}, from); err != nil {
			t.Fatal(err)
		}
		if n := queryInt(
			t,
			follower.Reader(),
			`SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND name IN ('tag_history_time', 'tag_history_digest')`,
		); n != 2 {
			t.Errorf("the mirror restored (provenance %d) has %d of the 2 history indexes", from, n)
		}
	}
}
