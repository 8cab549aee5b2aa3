package admin_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/store"
)

// TestReadyz_CurrentBeforeHistory: /readyz, the syncd_ready gauge and the
// backfill gauges of a real mirror through its phases: not ready in the
// baseline; 200 with history pending once the listing ended (503 when
// asked for ?phase=history); both ready once every history is read.
func TestReadyz_CurrentBeforeHistory(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m := admin.NewMetrics("test")
	m.WatchBackfill(st, 20)
	srv := httptest.NewServer(
		admin.Handler(m, []admin.ReadinessCheck{admin.BaselineCheck(st, nil), admin.HistoryCheck(st, 20, nil)}),
	)
	defer srv.Close()
	type readyz struct {
		Ready   bool              `json:"ready"`
		Phases  map[string]bool   `json:"phases"`
		Pending map[string]string `json:"pending"`
		Failed  map[string]string `json:"failed"`
	}
	get := func(path string) (int, readyz, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var r readyz
		json.Unmarshal(b, &r)
		return resp.StatusCode, r, string(b)
	}
	metric := func(want string) {
		t.Helper()
		_, _, body := get("/metrics")
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}

	if code, r, body := get("/readyz"); code != 503 || r.Phases["current"] || r.Phases["history"] {
		t.Fatalf("in the baseline: /readyz = %d %s, want 503 with neither phase ready", code, body)
	}
	metric(`syncd_ready{phase="current"} 0`)

	repo := store.Repo{UID: "g1/r1", Name: "nginx"}
	if _, err := st.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	need, _, err := st.ApplyTags(ctx, repo, []store.Tag{
		{UID: "g1/r1/t1", Name: "latest", Digest: "sha256:" + strings.Repeat("1", 64), UpdateTime: at},
		{UID: "g1/r1/t2", Name: "1.27", Digest: "sha256:" + strings.Repeat("2", 64), UpdateTime: at},
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	code, r, body := get("/readyz")
	if code != 200 || !r.Ready || !r.Phases["current"] || r.Phases["history"] ||
		!strings.Contains(r.Pending["history"], "2 tags' histories left") {
		t.Fatalf("after the listing: /readyz = %d %s, want 200, current ready, history pending with 2 tags left", code, body)
	}
	if code, _, body := get("/readyz?phase=history"); code != 503 {
		t.Fatalf("after the listing: /readyz?phase=history = %d %s, want 503", code, body)
	}
	metric(`syncd_ready{phase="current"} 1`)
	metric(`syncd_ready{phase="history"} 0`)
	metric(`syncd_backfill_remaining_tags 2`)
	metric(`syncd_backfill_eta_seconds 0.1`)

	for _, ref := range need {
		if _, err := st.ApplyHistory(
			ctx,
			ref,
			[]store.HistoryRecord{{Time: at, Digest: "sha256:" + strings.Repeat("1", 64)}},
			true,
		); err != nil {
			t.Fatal(err)
		}
	}
	if code, r, body := get("/readyz?phase=history"); code != 200 || !r.Phases["history"] || len(r.Pending) != 0 {
		t.Fatalf("after the backfill: /readyz?phase=history = %d %s, want 200 with history ready", code, body)
	}
	metric(`syncd_ready{phase="history"} 1`)
	metric(`syncd_backfill_remaining_tags 0`)
}
