package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

const schemaDoc = "../../docs/schema.md"

// sqlBlocks returns the ```sql blocks of the document at path.
func sqlBlocks(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	blocks := regexp.MustCompile("(?s)```sql\n(.*?)```").FindAllStringSubmatch(string(b), -1)
	var out []string
	for _, m := range blocks {
		out = append(out, m[1])
	}
	return out
}

// populate builds a mirror with something for every example query to find:
// a baseline crawl, then moves, a deprecation, deletions, advisories, a
// withdrawal, crawl runs, a subscription, and published and unpublished
// events.
func populate(t *testing.T) *store.Store {
	t.Helper()
	ctx := context.Background()
	clk := newClock()
	clk.Advance(-30 * 24 * time.Hour) // the first crawl ran in December 2025
	st, _ := openTemp(t, clk, true, store.Options{})
	hex := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	nginx, redis := nginx(), store.Repo{UID: "g1/r2", Name: "redis", ActiveTags: []string{"latest", "7"}}
	nginx.ActiveTags = []string{"latest", "1.27"}
	nginx.Raw = json.RawMessage(`{"uid": "g1/r1", "name": "nginx", "catalogTier": "APPLICATION",
		"syncConfig": {"source": "cgr.dev/chainguard/nginx", "expiration": "2027-01-01T00:00:00Z"}}`)
	gone := store.Repo{UID: "g1/r3", Name: "kafka"}
	// A repo below the subgroup charts (g1/g2).
	certManager := store.Repo{UID: "g1/g2/r4", Name: "cert-manager", Path: "charts/cert-manager",
		Raw: json.RawMessage(`{"uid": "g1/g2/r4", "name": "cert-manager", "catalogTier": "BASE"}`)}

	run, err := st.StartRun(ctx, "crawl")
	if err != nil {
		t.Fatal(err)
	}
	mustApplyRepos(t, st, nginx, redis, gone, certManager)
	at := func(d, digest string) store.Tag {
		return store.Tag{
			Name:       d,
			Digest:     digest,
			CreateTime: ts("2025-06-01T00:00:00Z"),
			UpdateTime: ts("2025-12-20T00:00:00Z"),
		}
	}
	nginxTags := []store.Tag{at("latest", hex("1")), at("1.27", hex("1")), at("1.25", hex("5")), at("stable", hex("6"))}
	for i := range nginxTags {
		nginxTags[i].UID = nginx.UID + "/t" + nginxTags[i].Name
	}
	redisLatest := at("latest", hex("a"))
	redisLatest.UID = redis.UID + "/tlatest"
	cmLatest := at("v1.16", hex("c"))
	cmLatest.UID, cmLatest.Raw = certManager.UID+"/tv1.16", json.RawMessage(`{"name": "v1.16", "bundles": ["charts"]}`)
	history := map[string][]store.HistoryRecord{}
	for _, tg := range append(nginxTags, redisLatest, cmLatest) {
		history[tg.UID] = []store.HistoryRecord{{Time: ts("2025-12-20T00:00:00Z"), Digest: tg.Digest}}
	}
	mustApplyTags(t, st, gone, store.Tag{UID: gone.UID + "/tlatest", Name: "latest", Digest: hex("9")})
	for repo, tags := range map[*store.Repo][]store.Tag{
		&nginx:       nginxTags,
		&redis:       {redisLatest},
		&certManager: {cmLatest},
	} {
		for _, ref := range mustApplyTags(t, st, *repo, tags...) {
			if _, err := st.ApplyHistory(ctx, ref, history[ref.UID], true); err != nil {
				t.Fatal(err)
			}
		}
	}
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	if err := st.FinishRun(ctx, run, nil); err != nil {
		t.Fatal(err)
	}

	clk.Advance(30 * 24 * time.Hour) // January 2026
	run, err = st.StartRun(ctx, "crawl")
	if err != nil {
		t.Fatal(err)
	}
	// nginx:latest moved twice and redis:latest once since the last crawl.
	moved := func(repo store.Repo, tg store.Tag, recs ...store.HistoryRecord) {
		tg.Digest, tg.UpdateTime = recs[len(recs)-1].Digest, recs[len(recs)-1].Time
		for _, ref := range mustApplyTags(t, st, repo, tg) {
			all := append(history[tg.UID], recs...)
			if _, err := st.ApplyHistory(ctx, ref, all, true); err != nil {
				t.Fatal(err)
			}
		}
	}
	moved(nginx, nginxTags[0], store.HistoryRecord{Time: ts("2026-01-05T00:00:00Z"), Digest: hex("2")},
		store.HistoryRecord{Time: ts("2026-01-20T00:00:00Z"), Digest: hex("1")})
	moved(redis, redisLatest, store.HistoryRecord{Time: ts("2026-01-10T00:00:00Z"), Digest: hex("b")})
	dep := nginxTags[2]
	dep.Deprecated, dep.UpdateTime = true, ts("2026-01-15T00:00:00Z")
	mustApplyTags(t, st, nginx, dep)
	if _, err := st.MarkTagsDeleted(ctx, []string{nginxTags[3].UID}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.MarkReposDeleted(ctx, []string{gone.UID}); err != nil {
		t.Fatal(err)
	}
	// Lifecycle steps are dated relative to the real clock, as the
	// examples ask about the last days.
	ago := func(d time.Duration) time.Time { return time.Now().UTC().Add(-d).Truncate(time.Second) }
	approved := "REVIEW_STATE_APPROVED"
	detected := func(uid, how, details string) store.AdvisoryEvent {
		return store.AdvisoryEvent{
			UID:           uid + "/e1",
			Type:          store.StepDetected,
			CreateTime:    ts("2026-01-03T00:00:00Z"),
			Author:        "scanner@example.dev",
			ReviewState:   approved,
			DetectionType: how,
			Details:       json.RawMessage(details),
		}
	}
	v3 := func(vector string) store.AdvisorySeverity {
		return store.AdvisorySeverity{Type: "TYPE_CVSS_V3", Score: vector}
	}
	advs := []store.Advisory{
		{
			UID:           "g1/a1",
			AdvisoryID:    "CGA-1111",
			ArtifactName:  "openssl",
			CreateTime:    ts("2026-01-03T00:00:00Z"),
			UpdateTime:    ts("2026-01-03T00:00:00Z"),
			ArtifactType:  "apk",
			ComponentName: "libssl3",
			Aliases:       []string{"CVE-2026-0001", "GHSA-aaaa-bbbb-cccc"},
			Severities:    []store.AdvisorySeverity{v3("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H")},
			Events: []store.AdvisoryEvent{
				detected("g1/a1", "scanv1", `{"scanv1":{"scanner":"grype","componentVersion":"3.0.1"}}`),
			},
			Raw: json.RawMessage(`{"advisoryId": "CGA-1111", "aliases": ["CVE-2026-0001", "GHSA-aaaa-bbbb-cccc"]}`),
		},
		{
			UID:          "g1/a2",
			AdvisoryID:   "CGA-2222",
			ArtifactName: "openssl",
			CreateTime:   ts("2026-01-04T00:00:00Z"),
			UpdateTime:   ts("2026-01-04T00:00:00Z"),
		},
		{
			UID:           "g1/a3",
			AdvisoryID:    "CGA-3333",
			ArtifactName:  "curl",
			CreateTime:    ts("2026-01-04T00:00:00Z"),
			UpdateTime:    ts("2026-01-04T00:00:00Z"),
			ComponentName: "libcurl",
			Aliases:       []string{"CVE-2026-0001"},
			Severities: []store.AdvisorySeverity{v3("CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:H"),
				{Type: "TYPE_CVSS_V4", Score: "CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N"}},
			Events: []store.AdvisoryEvent{detected("g1/a3", "nvdapi", `{"nvdapi":{"cpeSearched":"curl"}}`),
				{
					UID:         "g1/a3/e2",
					Type:        store.StepTruePositive,
					CreateTime:  ago(20 * 24 * time.Hour),
					ReviewState: approved,
					Note:        "reachable",
					Details:     json.RawMessage(`{"note":"reachable"}`),
				}},
		},
		{
			UID:          "g1/a4",
			AdvisoryID:   "CGA-4444",
			ArtifactName: "curl",
			CreateTime:   ts("2026-01-04T00:00:00Z"),
			UpdateTime:   ts("2026-01-04T00:00:00Z"),
		},
		{
			UID:           "g1/a5",
			AdvisoryID:    "CGA-5555",
			ArtifactName:  "nginx",
			CreateTime:    ts("2026-01-04T00:00:00Z"),
			UpdateTime:    ts("2026-01-04T00:00:00Z"),
			ComponentName: "nginx",
			Aliases:       []string{"CVE-2026-0002"},
			Severities:    []store.AdvisorySeverity{{Type: "TYPE_CVSS_V2", Score: "AV:N/AC:M/Au:N/C:N/I:P/A:N"}},
			Events: []store.AdvisoryEvent{detected("g1/a5", "manual", `{"manual":{}}`),
				{
					UID:          "g1/a5/e2",
					Type:         store.StepFixed,
					CreateTime:   ago(24 * time.Hour),
					ReviewState:  "REVIEW_STATE_PENDING",
					FixedVersion: "1.27.4-r0",
					Details:      json.RawMessage(`{"fixedVersion":"1.27.4-r0"}`),
				}},
		},
	}
	if _, err := st.ApplyAdvisories(ctx, advs); err != nil {
		t.Fatal(err)
	}
	// CGA-1111 is found fixed two days ago.
	fixed := advs[0]
	fixed.UpdateTime = ago(48 * time.Hour)
	fixed.Events = append(
		fixed.Events,
		store.AdvisoryEvent{UID: "g1/a1/e2", Type: store.StepFixed, CreateTime: ago(48 * time.Hour),
			Author: "analyst@example.dev", ReviewState: approved, FixedVersion: "3.0.2-r0", Note: "fixed upstream",
			Details: json.RawMessage(`{"fixedVersion":"3.0.2-r0","note":"fixed upstream"}`)},
	)
	if _, err := st.ApplyAdvisories(ctx, []store.Advisory{fixed}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.MarkAdvisoriesWithdrawn(ctx, []string{"g1/a2"}); err != nil {
		t.Fatal(err)
	}
	// The platform withdraws CGA-4444 by setting its deleteTime.
	withdrawn := advs[3]
	withdrawn.DeleteTime = ts("2026-01-06T00:00:00Z")
	withdrawn.Raw = json.RawMessage(`{"advisoryId": "CGA-4444", "deleteTime": "2026-01-06T00:00:00Z"}`)
	if _, err := st.ApplyAdvisories(ctx, []store.Advisory{withdrawn}); err != nil {
		t.Fatal(err)
	}
	// The history of cert-manager's tag answers 404 in this crawl.
	if _, err := st.RecordFailure(ctx, store.Failure{Kind: store.FailureTag, UID: cmLatest.UID, RepoUID: certManager.UID,
		Path: certManager.Path, Tag: cmLatest.Name, Status: 404, Error: "read history: 404 Not Found"},
		func(int) time.Duration { return time.Hour }); err != nil {
		t.Fatal(err)
	}
	run.Failures = 1
	if err := st.UpsertSubscription(ctx, store.Subscription{UID: "g1/s1", GroupUID: "g1", Sink: "https://syncd.example/hook", CreateTime: clk.Now()}); err != nil {
		t.Fatal(err)
	}
	evs, err := st.Unpublished(ctx, 0, 3)
	if err != nil {
		t.Fatal(err)
	}
	var seqs []int64
	for _, e := range evs {
		seqs = append(seqs, e.Seq)
	}
	if err := st.MarkPublished(ctx, seqs); err != nil {
		t.Fatal(err)
	}
	if err := st.FinishRun(ctx, run, nil); err != nil {
		t.Fatal(err)
	}
	return st
}

func TestSchemaDoc_ExamplesRun(t *testing.T) {
	st := populate(t)
	blocks := sqlBlocks(t, schemaDoc)
	if len(blocks) < 10 {
		t.Fatalf("found %d sql examples in %s", len(blocks), schemaDoc)
	}
	for _, q := range blocks {
		name := strings.SplitN(strings.TrimSpace(q), "\n", 2)[0]
		t.Run(name, func(t *testing.T) {
			rows, err := st.Reader().Query(q)
			if err != nil {
				t.Fatalf("%s\n%v", q, err)
			}
			defer rows.Close()
			cols, err := rows.Columns()
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for rows.Next() {
				vals := make([]any, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				if err := rows.Scan(ptrs...); err != nil {
					t.Fatal(err)
				}
				n++
			}
			if err := rows.Err(); err != nil {
				t.Fatal(err)
			}
			// An example that finds nothing teaches nothing, and hides a
			// query that no longer means what the text says.
			if n == 0 {
				t.Fatalf("no rows from:\n%s", q)
			}
		})
	}
	t.Run("AnswersAreRight", func(t *testing.T) {
		db := st.Reader()
		if got, want := queryInt(
			t,
			db,
			`SELECT COUNT(*) FROM tag_moves WHERE moved_time >= '2026-01-01T00:00:00.000Z'`,
		), 3; got != want {
			t.Fatalf("moves in January=%d, want %d", got, want)
		}
		if got, want := queryString(t, db, `SELECT repo FROM repo_moves ORDER BY moves DESC LIMIT 1`), "nginx"; got != want {
			t.Fatalf("repo with most moves=%s, want %s", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT open_advisory_ids FROM advisories_by_artifact WHERE artifact_name = 'openssl'`,
		), "CGA-1111"; got != want {
			t.Fatalf("open openssl advisories=%q, want %q", got, want)
		}
		if got, want := queryInt(t, db, `SELECT COUNT(*) FROM events WHERE type = 'tag.moved'`), 3; got != want {
			t.Fatalf("tag.moved events=%d, want %d", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT tag FROM current_tags WHERE path = 'charts/cert-manager'`,
		), "v1.16"; got != want {
			t.Fatalf("tag of charts/cert-manager=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT json_extract(raw, '$.syncConfig.source') FROM repos WHERE path = 'nginx'`,
		), "cgr.dev/chainguard/nginx"; got != want {
			t.Fatalf("nginx sync source from raw=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT group_concat(artifact_name || ':' || fixed_version, ' ') FROM fixed_versions WHERE alias = 'CVE-2026-0001'`,
		),
			"openssl:3.0.2-r0"; got != want {
			t.Fatalf("where CVE-2026-0001 is fixed=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT group_concat(artifact_name || ':' || COALESCE(state, '-'), ' ') FROM (SELECT * FROM advisories_by_alias WHERE alias = 'CVE-2026-0001' ORDER BY artifact_name)`,
		),
			"curl:true_positive openssl:fixed"; got != want {
			t.Fatalf("advisories of CVE-2026-0001=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT group_concat(advisory_id || ':' || state || ':' || rating || ':' || base_score, ' ') FROM (SELECT * FROM open_advisories ORDER BY advisory_id)`,
		),
			"CGA-3333:true_positive:high:7.5 CGA-5555:detected:medium:4.3"; got != want {
			t.Fatalf("open advisories=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT group_concat(json_extract(data, '$.event.fixedVersion') || '@' || scope, ' ') FROM events WHERE type = 'advisory.fixed'`,
		),
			"1.27.4-r0@nginx 3.0.2-r0@openssl"; got != want {
			t.Fatalf("advisory.fixed events=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT group_concat(advisory_id || '@' || deleted_time, ' ') FROM advisories WHERE deleted_time IS NOT NULL AND raw IS NOT NULL`,
		),
			"CGA-4444@2026-01-06T00:00:00.000Z"; got != want {
			t.Fatalf("withdrawn by deleteTime=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT outcome || '/' || failures FROM crawl_runs ORDER BY id DESC LIMIT 1`,
		), "partial/1"; got != want {
			t.Fatalf("last run=%q, want %q", got, want)
		}
	})
}

// TestSchemaDoc_DocumentsEverything checks that docs/schema.md has a section
// for every table and view and names each of their columns.
func TestSchemaDoc_DocumentsEverything(t *testing.T) {
	st := mustOpen(t, t.TempDir()+"/m.db", store.Options{})
	b, err := os.ReadFile(schemaDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	db := st.Reader()
	rows, err := db.Query(
		`SELECT name FROM sqlite_master WHERE type IN ('table', 'view') AND name NOT LIKE 'sqlite_%' ORDER BY name`,
	)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			t.Fatal(err)
		}
		names = append(names, n)
	}
	rows.Close()
	if len(names) < 15 {
		t.Fatalf("found only %d tables and views: %v", len(names), names)
	}
	for _, name := range names {
		sec := section(doc, "### `"+name+"`")
		if sec == "" {
			t.Errorf("%s: no section", name)
			continue
		}
		for _, col := range columns(t, db, name) {
			if !strings.Contains(sec, "| `"+col+"` |") {
				t.Errorf("%s.%s: not in its section's table", name, col)
			}
		}
	}
}

// section returns the text from heading to the next heading of any level.
func section(doc, heading string) string {
	i := strings.Index(doc, heading+"\n")
	if i < 0 {
		return ""
	}
	rest := doc[i+len(heading):]
	if j := strings.Index(rest, "\n#"); j >= 0 {
		rest = rest[:j]
	}
	return rest
}

func columns(t *testing.T, db *sql.DB, table string) []string {
	t.Helper()
	rows, err := db.Query(`SELECT name FROM pragma_table_info(?)`, table)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var cols []string
	for rows.Next() {
		var c string
		if err := rows.Scan(&c); err != nil {
			t.Fatal(err)
		}
		cols = append(cols, c)
	}
	return cols
}
