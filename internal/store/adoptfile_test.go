package store_test

import (
	"bytes"
	"context"
	"database/sql"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
)

// adoptedLeader is a leader's mirror with tags, meta and a subscription of
// its own, and the header fields no migration sets planted in its backup;
// it returns the backup's path and the leader's replica digest.
func adoptedLeader(t *testing.T, clk *clock) (snap string, tags int, want store.ReplicaDigest) {
	t.Helper()
	ctx := context.Background()
	leader, _ := openTemp(t, clk, false, store.Options{InitialEvents: "snapshot"})
	n := len(leaderWithTags(t, leader, 200))
	if err := leader.SetMeta(ctx, "owner", "leader"); err != nil {
		t.Fatal(err)
	}
	if err := leader.UpsertSubscription(ctx, store.Subscription{UID: "sub-leader", GroupUID: "g1",
		Sink: leaderSink}); err != nil {
		t.Fatal(err)
	}
	snap = backupTo(t, leader)
	setPragmas(t, snap, "user_version = 77", "application_id = 5", "default_cache_size = 777777")
	want, err := leader.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return snap, n, want
}

// leaderSink is the sink of the leader's own subscription, which a
// mirror made from its snapshot must not hold.
const leaderSink = "https://leader-only.example/sink"

// TestAdoptFile_ANewMirrorIsTheSnapshot: the snapshot becomes the mirror
// file at a path that did not exist: the leader's rows and replica digest
// (which its rows give again), every event published, the snapshot's
// sequence recorded; nothing of the leader's own (meta, subscriptions, the
// planted header fields, the deleted sink's bytes); the file 0600, sound,
// in WAL mode once opened, and nothing left beside it but the mirror.
func TestAdoptFile_ANewMirrorIsTheSnapshot(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	snap, tags, want := adoptedLeader(t, clk)
	if err := os.Chmod(snap, 0o644); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "mirror.db")
	adopted := store.FileAdoptions()
	if err := store.AdoptFile(ctx, snap, path, store.SnapshotAt{Seq: 7}, store.Options{Now: clk.Now}); err != nil {
		t.Fatal(err)
	}
	if store.FileAdoptions() != adopted+1 {
		t.Errorf("file adoptions %d, want %d", store.FileAdoptions(), adopted+1)
	}
	if _, err := os.Stat(snap); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the snapshot file is still where it was downloaded (%v): want it renamed", err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(snap), "*")); len(left) != 0 {
		t.Errorf("left beside the snapshot: %v", left)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("the mirror file: %v (%v), want mode 0600", fi, err)
	}
	if b, err := os.ReadFile(path); err != nil || bytes.Contains(b, []byte(leaderSink)) {
		t.Errorf("the mirror file holds the leader's own subscription's sink (%v)", err)
	}
	st := mustOpen(t, path, store.Options{Now: clk.Now})
	if got, err := st.ReplicaDigest(ctx); err != nil || got.Diff(want) != "" {
		t.Errorf("replica digest differs from the leader's in %q (%v)", got.Diff(want), err)
	}
	if got, err := st.ComputeReplicaDigest(ctx); err != nil || got.Diff(want) != "" {
		t.Errorf("the rows' digest differs from the leader's in %q (%v)", got.Diff(want), err)
	}
	if due, err := st.AdoptedCheckDue(ctx); err != nil || !due {
		t.Errorf("the check is due %v (%v), want due until it has run", due, err)
	}
	if status, err := st.Status(ctx); err != nil || status.SnapshotSeq != "7" || status.AdoptedCheckDue == "" {
		t.Errorf("status: snapshot seq %q, check due since %q (%v), want 7 and a time", status.SnapshotSeq,
			status.AdoptedCheckDue, err)
	}
	if err := st.CheckAdopted(ctx); err != nil {
		t.Errorf("CheckAdopted: %v", err)
	}
	if status, err := st.Status(ctx); err != nil || status.AdoptedCheckDue != "" || status.AdoptedDamage != "" {
		t.Errorf("status after the check: due since %q, damage %q (%v), want neither", status.AdoptedCheckDue,
			status.AdoptedDamage, err)
	}
	if due, err := st.AdoptedCheckDue(ctx); err != nil || due {
		t.Errorf("after the check, it is due %v (%v), want not", due, err)
	}
	if d, err := st.AdoptedDamage(ctx); err != nil || d != "" {
		t.Errorf("damage %q (%v), want none", d, err)
	}
	if n := queryInt(t, st.Reader(), `SELECT count(*) FROM tags`); n != tags {
		t.Errorf("%d tags, want %d", n, tags)
	}
	if v, err := st.Meta(ctx, "owner"); err != nil || v != "" {
		t.Errorf("meta owner = %q (%v), want none: the leader's meta is its own", v, err)
	}
	if seq, err := st.SnapshotSeq(ctx); err != nil || seq != 7 {
		t.Errorf("snapshot seq %d (%v), want 7", seq, err)
	}
	if subs, err := st.Subscriptions(ctx); err != nil || len(subs) != 0 {
		t.Errorf("subscriptions %+v (%v), want none", subs, err)
	}
	checkAdoptedFile(t, st, "adopted")
	// The mirror goes on from the snapshot: a change is recorded, and the
	// digest the triggers keep follows its rows.
	mustApplyTags(t, st, nginx(), tag("g1/r1/t-new", "9.9", 999))
	kept, err := st.ReplicaDigest(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if rows, err := st.ComputeReplicaDigest(ctx); err != nil || rows.Diff(kept) != "" {
		t.Errorf("after a change, the kept digest differs from the rows' in %q (%v)", rows.Diff(kept), err)
	}
}

// TestAdoptFile_RefusesAMirrorThatExists: a path with a mirror, or only
// its write-ahead log, is refused (ErrMirrorExists) and left as it was;
// so is the snapshot.
func TestAdoptFile_RefusesAMirrorThatExists(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	snap, _, _ := adoptedLeader(t, clk)
	before, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	for _, existing := range []string{"mirror.db", "mirror.db-wal"} {
		dir := t.TempDir()
		path := filepath.Join(dir, "mirror.db")
		if err := os.WriteFile(filepath.Join(dir, existing), []byte("the mirror's own"), 0o600); err != nil {
			t.Fatal(err)
		}
		err := store.AdoptFile(ctx, snap, path, store.SnapshotAt{Seq: 7}, store.Options{Now: clk.Now})
		if !errors.Is(err, store.ErrMirrorExists) || !strings.Contains(err.Error(), existing) {
			t.Errorf("%s exists: %v, want ErrMirrorExists naming it", existing, err)
		}
		if b, err := os.ReadFile(filepath.Join(dir, existing)); err != nil || string(b) != "the mirror's own" {
			t.Errorf("%s was changed: %q (%v)", existing, b, err)
		}
		if after, err := os.ReadFile(snap); err != nil || !bytes.Equal(after, before) {
			t.Errorf("the snapshot was changed (%v)", err)
		}
	}
}

// TestAdoptFile_AFailureLeavesNoMirror: an adoption that fails (canceled,
// the rename, a snapshot with another schema) leaves nothing at the
// mirror's path, so that the follower starts again from no mirror, and
// nothing of its own beside the snapshot.
func TestAdoptFile_AFailureLeavesNoMirror(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	snap, _, _ := adoptedLeader(t, clk)
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	path := filepath.Join(t.TempDir(), "mirror.db")
	err := store.AdoptFile(canceled, snap, path, store.SnapshotAt{Seq: 7}, store.Options{Now: clk.Now})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("canceled: %v, want context.Canceled", err)
	}
	// The rename fails (the mirror's directory is not there): the snapshot
	// was prepared, and nothing but it is left beside it.
	gone := filepath.Join(t.TempDir(), "gone", "mirror.db")
	if err := store.AdoptFile(ctx, snap, gone, store.SnapshotAt{Seq: 7}, store.Options{Now: clk.Now}); err == nil ||
		errors.Is(err, store.ErrBadSnapshot) {
		t.Errorf("a rename into no directory: %v, want its error", err)
	}
	if left, _ := filepath.Glob(filepath.Join(filepath.Dir(snap), "*")); len(left) != 1 || left[0] != snap {
		t.Errorf("after a failed rename, beside the snapshot: %v, want the snapshot alone", left)
	}
	db, err := sql.Open("sqlite", "file:"+snap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`CREATE VIEW planted AS SELECT 1`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	err = store.AdoptFile(ctx, snap, path, store.SnapshotAt{Seq: 7}, store.Options{Now: clk.Now})
	if !errors.Is(err, store.ErrBadSnapshot) {
		t.Errorf("a snapshot with a view of its own: %v, want ErrBadSnapshot", err)
	}
	for _, p := range []string{path, path + "-wal", path + "-shm", gone} {
		if _, err := os.Stat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("after failed adoptions %s exists (%v)", p, err)
		}
	}
}

// TestAdoptFile_CheckFindsADigestThatIsNotTheRows: a snapshot whose kept
// replica digest is not its rows' (a leader's file that lies, or a bug)
// is adopted as it is; CheckAdopted finds it (ErrAdoptedUnsound, naming
// the table) and replaces the digest with the rows', which are the
// leader's, so that checkpoints compare the rows themselves.
func TestAdoptFile_CheckFindsADigestThatIsNotTheRows(t *testing.T) {
	ctx := context.Background()
	clk := newClock()
	snap, _, want := adoptedLeader(t, clk)
	db, err := sql.Open("sqlite", "file:"+snap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := db.Exec(`UPDATE replica_digest SET sum = sum + 1 WHERE name = 'tags'`); err != nil {
		t.Fatal(err)
	}
	db.Close()
	path := filepath.Join(t.TempDir(), "mirror.db")
	if err := store.AdoptFile(ctx, snap, path, store.SnapshotAt{Seq: 7}, store.Options{Now: clk.Now}); err != nil {
		t.Fatal(err)
	}
	st := mustOpen(t, path, store.Options{Now: clk.Now})
	if got, err := st.ReplicaDigest(ctx); err != nil || !strings.HasPrefix(got.Diff(want), "tags ") {
		t.Fatalf("the adopted digest differs from the leader's in %q (%v), want in tags as planted", got.Diff(want), err)
	}
	err = st.CheckAdopted(ctx)
	if !errors.Is(err, store.ErrAdoptedUnsound) || !strings.Contains(err.Error(), "tags") {
		t.Errorf("CheckAdopted: %v, want ErrAdoptedUnsound naming tags", err)
	}
	if got, err := st.ReplicaDigest(ctx); err != nil || got.Diff(want) != "" {
		t.Errorf("after the check the digest differs from the leader's rows' in %q (%v)", got.Diff(want), err)
	}
	if err := st.CheckAdopted(ctx); err != nil {
		t.Errorf("CheckAdopted again: %v, want the digest the rows'", err)
	}
}

// TestAdoptFile_CheckFindsADamagedFile: a mirror made from a snapshot's
// file whose page was damaged, of an index no check reads rows through or
// of a table the digest reads, fails the check; the damage is recorded
// (AdoptedDamage) and the check is no longer due.
func TestAdoptFile_CheckFindsADamagedFile(t *testing.T) {
	for _, object := range []string{"tags_digest", "tags"} {
		t.Run(object, func(t *testing.T) {
			ctx := context.Background()
			clk := newClock()
			snap, _, _ := adoptedLeader(t, clk)
			path := filepath.Join(t.TempDir(), "mirror.db")
			if err := store.AdoptFile(ctx, snap, path, store.SnapshotAt{Seq: 7}, store.Options{Now: clk.Now}); err != nil {
				t.Fatal(err)
			}
			spoilRootPage(t, path, object)
			st := mustOpen(t, path, store.Options{Now: clk.Now})
			err := st.CheckAdopted(ctx)
			if !errors.Is(err, store.ErrAdoptedUnsound) {
				t.Fatalf("CheckAdopted of a damaged file: %v, want ErrAdoptedUnsound", err)
			}
			if d, err := st.AdoptedDamage(ctx); err != nil || d == "" {
				t.Errorf("recorded damage %q (%v), want the finding", d, err)
			}
			if due, err := st.AdoptedCheckDue(ctx); err != nil || due {
				t.Errorf("after the check, it is due %v (%v), want not", due, err)
			}
		})
	}
}

// spoilRootPage overwrites the page type of the root page of the table
// or index named object in the database at path.
func spoilRootPage(t *testing.T, path, object string) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	var root, pageSize int64
	if err := db.QueryRow(`SELECT rootpage FROM sqlite_schema WHERE name = ?`, object).Scan(&root); err != nil {
		t.Fatal(err)
	}
	if err := db.QueryRow(`PRAGMA page_size`).Scan(&pageSize); err != nil {
		t.Fatal(err)
	}
	db.Close()
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteAt([]byte{0xff, 0xff, 0xff, 0xff}, (root-1)*pageSize); err != nil {
		t.Fatal(err)
	}
}
