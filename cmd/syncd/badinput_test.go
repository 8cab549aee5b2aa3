package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestSync_BadDatabaseFails: a damaged mirror, a full disk and an unusable
// path each stop syncd with a clear error and a non-zero exit, before any
// request to the platform, and leave what was there as it was.
func TestSync_BadDatabaseFails(t *testing.T) {
	damaged := func(t *testing.T) string {
		p := filepath.Join(t.TempDir(), "syncd.db")
		junk := make([]byte, 8192)
		rand.Read(junk)
		copy(junk, "SQLite format 3\x00")
		if err := os.WriteFile(p, junk, 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	full := func(t *testing.T) string {
		if _, err := os.Stat("/dev/full"); err != nil {
			t.Skip("no /dev/full on this system to stand in for a full disk")
		}
		p := filepath.Join(t.TempDir(), "syncd.db")
		if err := os.Symlink("/dev/full", p); err != nil {
			t.Fatal(err)
		}
		return p
	}
	underFile := func(t *testing.T) string {
		f := filepath.Join(t.TempDir(), "a-file")
		os.WriteFile(f, []byte("x"), 0o600)
		return filepath.Join(f, "syncd.db")
	}
	for _, tc := range []struct {
		name string
		path func(*testing.T) string
		want string
	}{
		{"Damaged", damaged, "is not a syncd mirror or is damaged"},
		{"DiskFull", full, "free space on the disk"},
		{"PathUnderAFile", underFile, "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			sim, simURL := startSim(t, 5, platformsim.Scale{Repos: 1, TagsPerRepo: 1, HistoryPerTag: 1})
			ns := testutil.NATS(t)
			path := tc.path(t)
			before := snapshot(path)
			cfg := e2eConfig(t, simURL, ns.URL(), path, "@hourly")
			code, _, stderr := runMain(context.Background(), "sync", "--once", "--config", cfg)
			if code == exitOK {
				t.Fatal("sync succeeded on a bad database")
			}
			if !strings.Contains(stderr, tc.want) {
				t.Errorf("stderr=%q, want it to say %q", stderr, tc.want)
			}
			if after := snapshot(path); !bytes.Equal(before, after) {
				t.Error("the file was changed")
			}
			if n := sim.Stats().Total; n != 0 {
				t.Errorf("%d requests to the platform; want none before the mirror is usable", n)
			}
		})
	}
}

// snapshot is a file's content, or for a symlink (the full disk stands in
// as a link to /dev/full, which reads forever) its target.
func snapshot(path string) []byte {
	if target, err := os.Readlink(path); err == nil {
		return []byte("link:" + target)
	}
	b, _ := os.ReadFile(path)
	return b
}
