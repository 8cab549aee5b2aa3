package store_test

import (
	"context"
	"database/sql"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestAuditStream: what the audit saw of the stream is kept across calls;
// a sweep moves the audit's position back to the log's start in the same
// write; a value that is not the audit's (garbled, or past its bound) is
// an error that names the key, not a zero value that would make the next
// audit sweep for nothing or miss a loss.
func TestAuditStream(t *testing.T) {
	ctx := context.Background()
	st, path := openTemp(t, newClock(), false, store.Options{})
	if rec, err := st.AuditStream(ctx); err != nil || !rec.Created.IsZero() || rec.LastSeq != 0 {
		t.Fatalf("AuditStream before any = %+v, %v; want the zero value", rec, err)
	}
	if err := st.SetAuditPosition(ctx, 7, 9, nil); err != nil {
		t.Fatal(err)
	}
	rec := store.AuditStream{
		Created: time.Date(2026, 11, 27, 10, 0, 0, 123456789, time.UTC),
		LastSeq: 9,
		Deleted: 2,
		Swept:   time.Date(2026, 11, 27, 11, 0, 0, 0, time.UTC),
		Again:   true,
	}
	if err := st.SetAuditStream(ctx, rec, false); err != nil {
		t.Fatal(err)
	}
	got, err := st.AuditStream(ctx)
	if err != nil || !got.Created.Equal(rec.Created) || !got.Swept.Equal(rec.Swept) || got.LastSeq != rec.LastSeq ||
		got.Deleted != rec.Deleted || got.Again != rec.Again {
		t.Errorf("AuditStream = %+v, %v; want %+v", got, err, rec)
	}
	if pos, err := st.AuditPosition(ctx); err != nil || pos != 7 {
		t.Errorf("AuditPosition = %d, %v; want 7, unchanged", pos, err)
	}
	if err := st.SetAuditStream(ctx, rec, true); err != nil {
		t.Fatal(err)
	}
	if pos, err := st.AuditPosition(ctx); err != nil || pos != 0 {
		t.Errorf("AuditPosition after a sweep began = %d, %v; want 0", pos, err)
	}

	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for _, c := range []struct{ value, want string }{
		{`{"created":`, "meta audit_stream"},
		{strings.Repeat(" ", 5000), "more than"},
	} {
		if _, err := db.Exec(`UPDATE meta SET value = ? WHERE key = ?`, c.value, store.AuditStreamKey); err != nil {
			t.Fatal(err)
		}
		if _, err := st.AuditStream(ctx); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("AuditStream of %.20q = %v, want an error with %q", c.value, err, c.want)
		}
	}
}
