package store_test

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// clock is a settable clock for Options.Now.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// mustOpen opens the store at path and closes it when the test ends.
func mustOpen(tb testing.TB, path string, opts store.Options) *store.Store {
	tb.Helper()
	st, err := store.Open(context.Background(), path, opts)
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(func() {
		if err := st.Close(); err != nil {
			tb.Errorf("close store: %v", err)
		}
	})
	return st
}

// openTemp opens a fresh store in a temporary directory with clk as its
// clock, past the baseline unless baseline is set.
func openTemp(tb testing.TB, clk *clock, baseline bool, opts store.Options) (*store.Store, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "mirror.db")
	opts.Now = clk.Now
	st := mustOpen(tb, path, opts)
	if !baseline {
		if err := st.EndBaseline(context.Background()); err != nil {
			tb.Fatal(err)
		}
	}
	return st, path
}

// allEvents returns every change event, published or not, in commit order:
// the replication records (history.recorded, crawl.*) are left out, see
// replicationRecords.
func allEvents(tb testing.TB, st *store.Store) []store.Event {
	tb.Helper()
	return eventRows(tb, st, `resource NOT IN ('history', 'crawl')`)
}

// replicationRecords returns the history.recorded events in commit order.
func replicationRecords(tb testing.TB, st *store.Store) []store.Event {
	tb.Helper()
	return eventRows(tb, st, `type = 'history.recorded'`)
}

func eventRows(tb testing.TB, st *store.Store, where string) []store.Event {
	tb.Helper()
	rows, err := st.Reader().
		Query(
			`SELECT seq, id, type, resource, action, scope, subject, time, data FROM events WHERE ` + where + ` ORDER BY seq`,
		)
	if err != nil {
		tb.Fatal(err)
	}
	defer rows.Close()
	var evs []store.Event
	for rows.Next() {
		var e store.Event
		var t, data string
		if err := rows.Scan(&e.Seq, &e.ID, &e.Type, &e.Resource, &e.Action, &e.Scope, &e.Subject, &t, &data); err != nil {
			tb.Fatal(err)
		}
		e.Time, _ = store.ParseTime(t)
		e.Data = json.RawMessage(data)
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return evs
}

// types lists the types of evs.
func types(evs []store.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// payload decodes an event's data into before and after of type T; a
// null side is nil.
func payload[T any](tb testing.TB, e store.Event) (before, after *T) {
	tb.Helper()
	var d struct {
		Before *T `json:"before"`
		After  *T `json:"after"`
	}
	if err := json.Unmarshal(e.Data, &d); err != nil {
		tb.Fatalf("decode %s event data %s: %v", e.Type, e.Data, err)
	}
	return d.Before, d.After
}

// queryInt runs a query returning one integer on db.
func queryInt(tb testing.TB, db *sql.DB, q string, args ...any) int {
	tb.Helper()
	var n int
	if err := db.QueryRow(q, args...).Scan(&n); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
	return n
}

// queryString runs a query returning one string on db.
func queryString(tb testing.TB, db *sql.DB, q string, args ...any) string {
	tb.Helper()
	var s sql.NullString
	if err := db.QueryRow(q, args...).Scan(&s); err != nil {
		tb.Fatalf("%s: %v", q, err)
	}
	return s.String
}

func ts(s string) time.Time {
	t, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		panic(err)
	}
	return t
}

func digest(i int) string { return fmt.Sprintf("sha256:%064x", i) }

// nginx is the repo most tests use.
func nginx() store.Repo {
	return store.Repo{UID: "g1/r1", Name: "nginx", Description: "web server",
		CreateTime: ts("2025-01-01T00:00:00Z"), UpdateTime: ts("2025-01-01T00:00:00Z")}
}

func tag(uid, name string, d int) store.Tag {
	return store.Tag{UID: uid, Name: name, Digest: digest(d),
		CreateTime: ts("2025-02-01T00:00:00Z"), UpdateTime: ts("2025-02-01T00:00:00Z")}
}

// mustApplyRepos applies repos and returns the events recorded.
func mustApplyRepos(tb testing.TB, st *store.Store, repos ...store.Repo) int {
	tb.Helper()
	n, err := st.ApplyRepos(context.Background(), repos)
	if err != nil {
		tb.Fatal(err)
	}
	return n
}

// mustApplyTags applies tags of repo and returns the refs needing history.
func mustApplyTags(tb testing.TB, st *store.Store, repo store.Repo, tags ...store.Tag) []store.TagRef {
	tb.Helper()
	need, _, err := st.ApplyTags(context.Background(), repo, tags)
	if err != nil {
		tb.Fatal(err)
	}
	return need
}
