package store

import (
	"context"
	"path/filepath"
	"testing"
)

// TestOpen_BackgroundReaderDoesNotMap: the backfill's reads go through a
// connection that does not map the file (Store.bg), the query readers
// through ones that do.
func TestOpen_BackgroundReaderDoesNotMap(t *testing.T) {
	ctx := context.Background()
	s, err := Open(ctx, filepath.Join(t.TempDir(), "m.db"), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var bg, r int64
	if err := s.background().QueryRowContext(ctx, `PRAGMA mmap_size`).Scan(&bg); err != nil {
		t.Fatal(err)
	}
	if err := s.r.QueryRowContext(ctx, `PRAGMA mmap_size`).Scan(&r); err != nil {
		t.Fatal(err)
	}
	if bg != 0 || r == 0 {
		t.Fatalf("mmap_size: background %d, readers %d; want 0 and more", bg, r)
	}
}
