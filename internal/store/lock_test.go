package store_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
)

func TestLockMirror_OneHolder(t *testing.T) {
	db := filepath.Join(t.TempDir(), "data", "syncd.db")
	l, err := store.LockMirror(db, "syncd run")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(store.LockPath(db)); err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("lock file: %v, mode %v; want 0600", err, st.Mode().Perm())
	}
	// A second holder (another open file, as another process has) is
	// refused at once, told who holds the mirror.
	_, err = store.LockMirror(db, "syncd sync --once")
	var le *store.LockedError
	if !errors.As(err, &le) {
		t.Fatalf("second lock: %v, want a *LockedError", err)
	}
	if le.Holder.PID != os.Getpid() || le.Holder.Command != "syncd run" || le.Holder.Since.IsZero() {
		t.Errorf("holder %+v, want this pid, \"syncd run\" and a time", le.Holder)
	}
	for _, want := range []string{db, "syncd run", "in use by pid"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, err := os.Stat(db); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the refused lock touched the mirror: %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatal(err)
	}
	l2, err := store.LockMirror(db, "syncd sync --once")
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	l2.Release()
}
