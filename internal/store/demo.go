package store

import (
	"context"
	"errors"
	"fmt"
	"os"
)

// ModeDemo is the "mode" meta of a mirror "syncd run --demo" made: the
// demo replaces only such a mirror.
const ModeDemo = "demo"

// ErrNotDemo is ResetDemo's refusal of a mirror of a real platform.
var ErrNotDemo = errors.New("holds a mirror of a real platform")

// ResetDemo removes a mirror left by an earlier demo, whose simulator is
// gone, so the demo starts from a fresh baseline. It refuses, with
// ErrNotDemo, to touch a mirror of a real platform.
func ResetDemo(ctx context.Context, path string) error {
	if _, err := os.Stat(path); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	st, err := Open(ctx, path, Options{})
	if err != nil {
		return fmt.Errorf("open mirror %s: %w", path, err)
	}
	mode, err := st.Meta(ctx, "mode")
	st.Close()
	if err != nil {
		return err
	}
	if mode != ModeDemo {
		return fmt.Errorf("%s %w; the demo will not overwrite it (set SYNCD_STORE_PATH to another file)", path, ErrNotDemo)
	}
	for _, suffix := range []string{"", "-wal", "-shm"} {
		if err := os.Remove(path + suffix); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("reset demo mirror: %w", err)
		}
	}
	return nil
}
