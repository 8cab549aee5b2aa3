package store_test

import (
	"context"
	"database/sql"
	"path/filepath"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestReplicaDigest_Maintained: the digest the triggers keep equals the
// one computed from the rows after every kind of write, a restore and a
// change behind syncd's back included, and two mirrors with the same
// replicated state have the same digest however they got it.
func TestReplicaDigest_Maintained(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{InitialEvents: "snapshot"})
	check := func(st *store.Store, when string) store.ReplicaDigest {
		t.Helper()
		kept, err := st.ReplicaDigest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		computed, err := st.ComputeReplicaDigest(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if diff := kept.Diff(computed); diff != "" {
			t.Fatalf("%s: kept digest differs from the rows' in %s\n kept:     %v\n computed: %v", when, diff, kept, computed)
		}
		return kept
	}
	empty := check(leader, "empty")
	repo := nginx()
	mustApplyRepos(t, leader, repo)
	need := mustApplyTags(t, leader, repo, tag("g1/r1/t1", "latest", 1), tag("g1/r1/t2", "1.0", 2))
	for _, ref := range need {
		if _, err := leader.ApplyHistory(
			ctx,
			ref,
			[]store.HistoryRecord{{Time: ts("2025-02-01T00:00:00Z"), Digest: digest(1)},
				{Time: ts("2025-02-02T00:00:00Z"), Digest: digest(3)}},
			true,
		); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := leader.ApplyAdvisories(
		ctx,
		[]store.Advisory{{UID: "a1", AdvisoryID: "CVE-1", ArtifactName: "nginx", UpdateTime: clk.Now()}},
	); err != nil {
		t.Fatal(err)
	}
	if _, err := leader.MarkTagsDeleted(ctx, []string{"g1/r1/t2"}); err != nil {
		t.Fatal(err)
	}
	full := check(leader, "after writes")
	if full.Diff(empty) == "" {
		t.Fatal("the digest did not change with the writes")
	}

	// A follower that applies the leader's events and restores its
	// snapshot holds the same state, and so the same digest.
	path := filepath.Join(t.TempDir(), "snap.db")
	if err := store.CreateEmpty(path); err != nil {
		t.Fatal(err)
	}
	if err := leader.Backup(ctx, path); err != nil {
		t.Fatal(err)
	}
	follower, fpath := openTemp(t, clk, true, store.Options{})
	if err := follower.Restore(ctx, path, store.SnapshotAt{Seq: 7}, store.Verified); err != nil {
		t.Fatal(err)
	}
	if diff := check(follower, "restored").Diff(full); diff != "" {
		t.Fatalf("restored mirror's digest differs from the leader's in %s", diff)
	}

	// A change behind syncd's back, through the same driver, shows.
	db := openWriter(t, fpath)
	if _, err := db.Exec(`UPDATE tags SET digest = 'sha256:forged' WHERE uid = 'g1/r1/t1'`); err != nil {
		t.Fatal(err)
	}
	if diff := check(follower, "changed behind its back").Diff(full); diff != "tags (2 rows here, 2 there)" {
		t.Fatalf("a changed tag: diff %q, want the tags table", diff)
	}
	if _, err := db.Exec(`DELETE FROM tag_history WHERE seq = 1`); err != nil {
		t.Fatal(err)
	}
	if diff := check(follower, "rows deleted").Diff(full); diff != "tags (2 rows here, 2 there)" {
		t.Fatalf("first difference %q, want tags (the first table in order)", diff)
	}
}

// openWriter opens the mirror at path with a connection of the test's own,
// as a process beside syncd would.
func openWriter(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
