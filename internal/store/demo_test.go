package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/syncd-dev/syncd/internal/store"
)

func TestResetDemo(t *testing.T) {
	ctx := context.Background()
	mirror := func(t *testing.T, mode string) string {
		path := filepath.Join(t.TempDir(), "syncd.db")
		st, err := store.Open(ctx, path, store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		if mode != "" {
			if err := st.SetMeta(ctx, "mode", mode); err != nil {
				t.Fatal(err)
			}
		}
		st.Close()
		return path
	}
	t.Run("NoMirror", func(t *testing.T) {
		if err := store.ResetDemo(ctx, filepath.Join(t.TempDir(), "syncd.db")); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("DemoMirrorRemoved", func(t *testing.T) {
		path := mirror(t, store.ModeDemo)
		if err := store.ResetDemo(ctx, path); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("stat %s: %v, want it gone", path, err)
		}
	})
	t.Run("RealMirrorRefused", func(t *testing.T) {
		path := mirror(t, "")
		if err := store.ResetDemo(ctx, path); !errors.Is(err, store.ErrNotDemo) {
			t.Fatalf("err=%v, want ErrNotDemo", err)
		}
		if _, err := os.Stat(path); err != nil {
			t.Errorf("the real mirror is gone: %v", err)
		}
	})
}
