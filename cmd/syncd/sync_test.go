package main

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestSyncOnce_MirrorsGroundTruth runs "syncd sync --once" against a fresh
// database and compares the mirror with the simulator's ground truth row for
// row: repos, tags and every history record in order.
func TestSyncOnce_MirrorsGroundTruth(t *testing.T) {
	sim, simURL := startSim(t, 11, platformsim.Scale{Repos: 6, TagsPerRepo: 4, HistoryPerTag: 30, Advisories: 3})
	ns := testutil.NATS(t)
	dbPath := filepath.Join(t.TempDir(), "syncd.db")
	cfg := e2eConfig(t, simURL, ns.URL(), dbPath, "@hourly")

	code, stdout, stderr := runMain(context.Background(), "sync", "--once", "--config", cfg)
	if code != exitOK {
		t.Fatalf("sync --once exited %d: %s", code, stderr)
	}
	if !strings.Contains(stdout, "synced 6 repos, 24 tags") {
		t.Errorf("summary=%q, want it to count 6 repos and 24 tags", stdout)
	}
	truth := sim.Truth()
	db := openReader(t, dbPath)

	got := map[string]string{}
	rows, err := db.Query(`SELECT uid, name FROM repos WHERE deleted_time IS NULL`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var uid, name string
		rows.Scan(&uid, &name)
		got[uid] = name
	}
	rows.Close()
	if len(got) != len(truth.Repos) {
		t.Errorf("repos=%d, want %d", len(got), len(truth.Repos))
	}
	for _, r := range truth.Repos {
		if got[r.UID] != r.Name {
			t.Errorf("repo %s: name=%q, want %q", r.UID, got[r.UID], r.Name)
		}
	}
	for _, tg := range truth.Tags {
		var name, digest string
		var deprecated bool
		if err := db.QueryRow(`SELECT name, digest, deprecated FROM tags WHERE uid = ?`, tg.UID).Scan(
			&name,
			&digest,
			&deprecated,
		); err != nil {
			t.Fatalf("tag %s: %v", tg.UID, err)
		}
		if name != tg.Name || digest != tg.Digest || deprecated != tg.Deprecated {
			t.Errorf("tag %s = (%s %s %v), want (%s %s %v)", tg.UID, name, digest, deprecated, tg.Name, tg.Digest, tg.Deprecated)
		}
		hrows, err := db.Query(`SELECT update_time, digest FROM tag_history WHERE tag_uid = ? ORDER BY seq`, tg.UID)
		if err != nil {
			t.Fatal(err)
		}
		var i int
		want := truth.History[tg.UID]
		for ; hrows.Next(); i++ {
			var ts, d string
			hrows.Scan(&ts, &d)
			if i < len(want) && (d != want[i].Digest || ts != want[i].UpdateTime.UTC().Format("2006-01-02T15:04:05.000Z")) {
				t.Errorf("tag %s history[%d] = (%s %s), want (%s %s)", tg.UID, i, ts, d, want[i].UpdateTime, want[i].Digest)
			}
		}
		hrows.Close()
		if i != len(want) {
			t.Errorf("tag %s: %d history rows, want %d", tg.UID, i, len(want))
		}
	}
	for _, a := range truth.Advisories {
		var id, artifact string
		if err := db.QueryRow(
			`SELECT advisory_id, artifact_name FROM advisories WHERE uid = ? AND deleted_time IS NULL`,
			a.UID,
		).Scan(
			&id,
			&artifact,
		); err != nil {
			t.Fatalf("advisory %s: %v", a.UID, err)
		}
		if id != a.AdvisoryID || artifact != a.ArtifactName {
			t.Errorf("advisory %s = (%s %s), want (%s %s)", a.UID, id, artifact, a.AdvisoryID, a.ArtifactName)
		}
	}
	var advisories, tags int
	db.QueryRow(`SELECT count(*) FROM advisories`).Scan(&advisories)
	db.QueryRow(`SELECT count(*) FROM tags`).Scan(&tags)
	if advisories != len(truth.Advisories) || tags != len(truth.Tags) {
		t.Errorf(
			"mirror has %d advisories and %d tags, want exactly %d and %d",
			advisories,
			tags,
			len(truth.Advisories),
			len(truth.Tags),
		)
	}
	// A second sync of an unchanged platform reads no history at all.
	code, stdout, stderr = runMain(context.Background(), "sync", "--once", "--config", cfg)
	if code != exitOK || !strings.Contains(stdout, " 0 history reads") {
		t.Fatalf("second sync: exit=%d stdout=%q stderr=%s; want 0 history reads", code, stdout, stderr)
	}
}

// TestStatus_ReportsTheMirror runs "syncd status" on a synced mirror, in
// both forms, while nothing else runs.
func TestStatus_ReportsTheMirror(t *testing.T) {
	_, simURL := startSim(t, 12, platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 3, Advisories: 2})
	ns := testutil.NATS(t)
	dbPath := filepath.Join(t.TempDir(), "syncd.db")
	cfg := e2eConfig(t, simURL, ns.URL(), dbPath, "@hourly")
	if code, _, stderr := runMain(context.Background(), "sync", "--once", "--config", cfg); code != exitOK {
		t.Fatalf("sync: %s", stderr)
	}
	code, out, stderr := runMain(context.Background(), "status", "--config", cfg)
	if code != exitOK {
		t.Fatalf("status exit %d: %s", code, stderr)
	}
	for _, want := range []string{"repos", "tags  ", "last sweep", "ok", "unpublished events  0"} {
		if !strings.Contains(out, want) {
			t.Errorf("status output lacks %q:\n%s", want, out)
		}
	}
	code, out, _ = runMain(context.Background(), "status", "--json", "--config", cfg)
	var rep admin.StatusReport
	if code != exitOK || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("status --json exit %d: %s", code, out)
	}
	if rep.Tables["tags"] != 4 || rep.Tables["advisories"] != 2 || len(rep.Jobs) != 1 || rep.Jobs[0].Outcome != "ok" ||
		rep.UnpublishedEvents != 0 {
		t.Fatalf("status --json = %+v", rep)
	}
}
