package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/robfig/cron/v3"

	"github.com/syncd-dev/syncd/internal/admin"
	"github.com/syncd-dev/syncd/internal/store"
)

func TestFreshness_StaleAfterFactorTimesInterval(t *testing.T) {
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	f := admin.NewFreshness(map[string]cron.Schedule{
		"crawl": cron.Every(time.Minute),
		"sweep": cron.Every(time.Hour),
	}, 3, clock)
	if s := f.Stale(); len(s) != 0 {
		t.Fatalf("stale at start: %v", s)
	}
	now = now.Add(3*time.Minute + time.Second)
	if s := f.Stale(); len(s) != 1 || s["crawl"] == 0 {
		t.Fatalf("after 3m1s: stale=%v, want crawl only", s)
	}
	f.Succeeded("crawl", now)
	if s := f.Stale(); len(s) != 0 {
		t.Fatalf("after a crawl success: stale=%v", s)
	}
	now = now.Add(3*time.Hour + time.Minute)
	f.Succeeded("crawl", now)
	if s := f.Stale(); len(s) != 1 || s["sweep"] == 0 {
		t.Fatalf("after 3h without a sweep: stale=%v, want sweep only", s)
	}
}

func TestHandler_ReadyzReportsFailedChecks(t *testing.T) {
	m := admin.NewMetrics("test")
	m.ObserveRequest("GET /registry/v2/repos", 200, false)
	m.ObserveRequest("GET /registry/v2/repos", 503, true)
	fail := true
	srv := httptest.NewServer(admin.Handler(m, []admin.ReadinessCheck{
		{Name: "ok", Run: func(context.Context) error { return nil }},
		{Name: "nats", Run: func(context.Context) error {
			if fail {
				return errors.New("not connected")
			}
			return nil
		}},
	}))
	defer srv.Close()
	get := func(path string) (int, string) {
		resp, err := http.Get(srv.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, body := get("/readyz"); code != 503 || !strings.Contains(body, `"nats":"not connected"`) ||
		strings.Contains(body, `"ok"`) {
		t.Fatalf("/readyz = %d %s, want 503 naming only nats", code, body)
	}
	fail = false
	if code, body := get("/readyz"); code != 200 || !strings.Contains(body, `"ready":true`) {
		t.Fatalf("/readyz = %d %s, want 200", code, body)
	}
	_, metrics := get("/metrics")
	for _, want := range []string{
		`syncd_platform_requests_total{code="503",endpoint="GET /registry/v2/repos"} 1`,
		`syncd_platform_retries_total{endpoint="GET /registry/v2/repos"} 1`,
		`syncd_build_info{version="test"} 1`,
	} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %q", want)
		}
	}
}

// TestMetrics_RejectedMessages: what a follower sets aside is counted by
// reason in syncd_rejected_messages_total.
func TestMetrics_RejectedMessages(t *testing.T) {
	m := admin.NewMetrics("test")
	m.MessageRejected("apply")
	m.MessageRejected("apply")
	m.MessageRejected("snapshot")
	families, err := m.Registry().Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if f.GetName() != "syncd_rejected_messages_total" {
			continue
		}
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				if l.GetName() == "reason" && s.GetCounter().GetValue() != 0 {
					got[l.GetValue()] = s.GetCounter().GetValue() // the signature reasons start at 0
				}
			}
		}
	}
	if got["apply"] != 2 || got["snapshot"] != 1 || len(got) != 2 {
		t.Errorf("syncd_rejected_messages_total by reason: %v, want apply 2, snapshot 1", got)
	}
}

// TestStatusReport_TheSnapshotRestoredFrom: "syncd status" names the
// snapshot a mirror was restored from, whether its file's check is still
// to run, and a damaged file with what to do; a mirror never restored
// shows no such line.
func TestStatusReport_TheSnapshotRestoredFrom(t *testing.T) {
	for _, c := range []struct {
		status store.Status
		want   []string
		not    []string
	}{
		{store.Status{}, nil, []string{"restored from"}},
		{store.Status{SnapshotSeq: "41"}, []string{"restored from ", "the snapshot of stream sequence 41\n"},
			[]string{"check", "DAMAGED"}},
		{store.Status{SnapshotSeq: "41", AdoptedCheckDue: "2026-11-26T14:00:00Z"},
			[]string{"sequence 41; its file's check is still to run (made 2026-11-26T14:00:00Z)"}, []string{"DAMAGED"}},
		{store.Status{SnapshotSeq: "41", AdoptedDamage: "quick_check: page 7 is never used"},
			[]string{"its file is DAMAGED (quick_check: page 7 is never used): stop syncd, remove the mirror"}, nil},
		// The stream was created again since (store.SetStreamIncarnation).
		{store.Status{SnapshotSeq: "0"},
			[]string{"restored from ", "a snapshot of the stream before it was created again (or lost its tail)\n"},
			[]string{"sequence 0"}},
	} {
		rep := admin.NewStatusReport("m.db", c.status)
		var b strings.Builder
		if err := rep.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		for _, w := range c.want {
			if !strings.Contains(b.String(), w) {
				t.Errorf("%+v: the table lacks %q:\n%s", c.status, w, b.String())
			}
		}
		for _, n := range c.not {
			if strings.Contains(b.String(), n) {
				t.Errorf("%+v: the table says %q:\n%s", c.status, n, b.String())
			}
		}
		if js, err := json.Marshal(rep); err != nil || (c.status.SnapshotSeq != "") != strings.Contains(string(js),
			`"snapshot":{"stream_seq":"`+c.status.SnapshotSeq+`"`) {
			t.Errorf("%+v: JSON %s (%v)", c.status, js, err)
		}
	}
}
