package store_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestWaitBaselineOver: it waits while the mirror is in its baseline, ends
// with EndBaseline, at once past it, and with the context's error when the
// context ends first.
func TestWaitBaselineOver(t *testing.T) {
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	cctx, cancel := context.WithCancel(ctx)
	canceled := make(chan error, 1)
	go func() { canceled <- st.WaitBaselineOver(cctx) }()
	waited := make(chan error, 1)
	go func() { waited <- st.WaitBaselineOver(ctx) }()
	cancel()
	if err := <-canceled; !errors.Is(err, context.Canceled) {
		t.Fatalf("wait with its context canceled: %v", err)
	}
	select {
	case err := <-waited:
		t.Fatalf("the wait ended during the baseline: %v", err)
	default:
	}
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-waited:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the wait did not end with the baseline")
	}
	if err := st.WaitBaselineOver(ctx); err != nil {
		t.Fatalf("past the baseline: %v", err)
	}
}
