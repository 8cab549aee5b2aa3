package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// commits counts the commits other connections made to st's file, as a
// reader sees them: a transaction that wrote nothing does not count.
type commits struct {
	tb   testing.TB
	conn *sql.Conn
	last int64
}

func watchCommits(tb testing.TB, st *store.Store) *commits {
	tb.Helper()
	conn, err := st.Reader().Conn(context.Background())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { conn.Close() })
	c := &commits{tb: tb, conn: conn}
	c.last = c.version()
	return c
}

func (c *commits) version() int64 {
	c.tb.Helper()
	var v int64
	if err := c.conn.QueryRowContext(context.Background(), `PRAGMA data_version`).Scan(&v); err != nil {
		c.tb.Fatal(err)
	}
	return v
}

// wrote reports whether anything was committed since the last call.
func (c *commits) wrote() bool {
	c.tb.Helper()
	v := c.version()
	changed := v != c.last
	c.last = v
	return changed
}

func TestRawJSON(t *testing.T) {
	ctx := context.Background()
	st, _ := openTemp(t, newClock(), false, store.Options{})
	db := st.Reader()
	w := watchCommits(t, st)

	repo := nginx()
	repo.Raw = json.RawMessage(`{ "uid": "g1/r1", "name": "nginx",
		"syncConfig": {"source": "cgr.dev/chainguard/nginx"} }`)
	tg := tag("g1/r1/t1", "latest", 1)
	tg.Raw = json.RawMessage(`{"name": "latest", "digest": "` + digest(1) + `", "bundles": []}`)
	adv := store.Advisory{
		UID:          "g1/a1",
		AdvisoryID:   "CGA-1",
		ArtifactName: "openssl",
		UpdateTime:   ts("2025-01-01T00:00:00Z"),
		Raw: json.RawMessage(
			`{"advisoryId": "CGA-1", "aliases": ["CVE-2025-1"], "severities": [{"type": "CVSS_V3", "score": "7.5"}]}`,
		),
	}
	apply := func(r store.Repo, tg store.Tag, a store.Advisory) int {
		t.Helper()
		n := mustApplyRepos(t, st, r)
		m := testutil.AnnounceTags(t, st, r, []store.Tag{tg})
		k, err := st.ApplyAdvisories(ctx, []store.Advisory{a})
		if err != nil {
			t.Fatal(err)
		}
		return n + m + k
	}
	if got, want := apply(repo, tg, adv), 3; got != want {
		t.Fatalf("events on first sight=%d, want %d", got, want)
	}
	w.wrote()

	t.Run("StoredCompactAndQueryable", func(t *testing.T) {
		if got, want := queryString(t, db, `SELECT raw FROM repos WHERE uid = 'g1/r1'`),
			`{"uid":"g1/r1","name":"nginx","syncConfig":{"source":"cgr.dev/chainguard/nginx"}}`; got != want {
			t.Fatalf("repos.raw=%s, want %s", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT json_extract(raw, '$.syncConfig.source') FROM repos`,
		), "cgr.dev/chainguard/nginx"; got != want {
			t.Fatalf("json_extract on repos.raw=%q, want %q", got, want)
		}
		if got, want := queryString(t, db, `SELECT json_extract(raw, '$.name') FROM tags`), "latest"; got != want {
			t.Fatalf("json_extract on tags.raw=%q, want %q", got, want)
		}
		if got, want := queryString(
			t,
			db,
			`SELECT a.value FROM advisories, json_each(advisories.raw, '$.aliases') a`,
		), "CVE-2025-1"; got != want {
			t.Fatalf("alias from advisories.raw=%q, want %q", got, want)
		}
		r, ok, err := st.RepoByPath(ctx, "nginx")
		if err != nil || !ok || !json.Valid(r.Raw) || !strings.Contains(string(r.Raw), "syncConfig") {
			t.Fatalf("RepoByPath raw=%s ok=%v err=%v", r.Raw, ok, err)
		}
	})
	t.Run("NeverInEvents", func(t *testing.T) {
		for _, e := range allEvents(t, st) {
			if strings.Contains(string(e.Data), "syncConfig") || strings.Contains(string(e.Data), "severities") ||
				strings.Contains(string(e.Data), `"bundles":[]`) {
				t.Fatalf("%s event data carries raw JSON: %s", e.Type, e.Data)
			}
		}
	})
	t.Run("UnchangedIsNotWritten", func(t *testing.T) {
		// The same resources, with the platform's whitespace varied.
		r2, t2, a2 := repo, tg, adv
		r2.Raw = json.RawMessage(strings.ReplaceAll(string(repo.Raw), ": ", ":  "))
		t2.Raw = json.RawMessage(" " + string(tg.Raw) + "\n")
		if got := apply(r2, t2, a2); got != 0 {
			t.Fatalf("events for unchanged resources=%d, want 0", got)
		}
		if w.wrote() {
			t.Fatal("an idle pass committed writes")
		}
	})
	t.Run("NoRawKeepsTheStoredOne", func(t *testing.T) {
		r2, t2, a2 := repo, tg, adv
		r2.Raw, t2.Raw, a2.Raw = nil, nil, nil
		if got := apply(r2, t2, a2); got != 0 {
			t.Fatalf("events=%d, want 0", got)
		}
		if w.wrote() {
			t.Fatal("resources without raw JSON were rewritten")
		}
		if got := queryInt(
			t,
			db,
			`SELECT (SELECT COUNT(*) FROM repos WHERE raw IS NULL) + (SELECT COUNT(*) FROM tags WHERE raw IS NULL) +
			(SELECT COUNT(*) FROM advisories WHERE raw IS NULL)`,
		); got != 0 {
			t.Fatalf("rows that lost their raw JSON=%d, want 0", got)
		}
	})
	t.Run("RawAloneChangedIsWrittenWithoutEvent", func(t *testing.T) {
		r2, t2, a2 := repo, tg, adv
		r2.Raw = json.RawMessage(
			`{"uid": "g1/r1", "name": "nginx", "syncConfig": {"source": "cgr.dev/chainguard/nginx-fips"}}`,
		)
		t2.Raw = json.RawMessage(`{"name": "latest", "newField": true}`)
		a2.Raw = json.RawMessage(`{"advisoryId": "CGA-1", "aliases": ["CVE-2025-1", "GHSA-x"]}`)
		before := len(allEvents(t, st))
		if got := apply(r2, t2, a2); got != 0 {
			t.Fatalf("events for a change of raw JSON alone=%d, want 0", got)
		}
		if got := len(allEvents(t, st)); got != before {
			t.Fatalf("event rows=%d, want %d", got, before)
		}
		if !w.wrote() {
			t.Fatal("a change of raw JSON was not written")
		}
		for q, want := range map[string]string{
			`SELECT json_extract(raw, '$.syncConfig.source') FROM repos`: "cgr.dev/chainguard/nginx-fips",
			`SELECT json_extract(raw, '$.newField') FROM tags`:           "1",
			`SELECT json_array_length(raw, '$.aliases') FROM advisories`: "2",
			// The three events, without the tag's history.recorded.
			`SELECT COUNT(*) FROM outbox JOIN event_log USING (seq) WHERE resource <> 'history'`: "3",
		} {
			if got := queryString(t, db, q); got != want {
				t.Errorf("%s = %q, want %q", q, got, want)
			}
		}
	})
	t.Run("InvalidRawIsAnError", func(t *testing.T) {
		r2 := repo
		r2.Raw = json.RawMessage(`{"uid": `)
		if _, err := st.ApplyRepos(ctx, []store.Repo{r2}); err == nil || !strings.Contains(err.Error(), "g1/r1") {
			t.Fatalf("ApplyRepos with broken raw JSON: err=%v, want one naming the repo", err)
		}
	})
}
