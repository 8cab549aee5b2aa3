package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// One process writes a mirror at a time. Two syncd on one mirror (and, with
// the embedded NATS server, on one JetStream store beside it) would each
// believe the other's work is theirs: events marked published that the
// stream never kept, baselines taken twice. LockMirror is taken before
// anything is opened, and held for the process's life.

// Holder says who holds a mirror's lock.
type Holder struct {
	PID     int       `json:"pid"`
	Command string    `json:"command"`
	Since   time.Time `json:"since"`
}

// LockedError reports a mirror another process holds.
type LockedError struct {
	Path   string
	Holder Holder // zero when the holder did not say
}

func (e *LockedError) Error() string {
	if e.Holder.PID == 0 {
		return fmt.Sprintf(
			"mirror %s is in use by another process; stop it first, or set [store] path to another file",
			e.Path,
		)
	}
	return fmt.Sprintf("mirror %s is in use by pid %d (%s) since %s; stop it first, or set [store] path to another file",
		e.Path, e.Holder.PID, e.Holder.Command, e.Holder.Since.UTC().Format(time.RFC3339))
}

// Lock is a process's exclusive hold on a mirror.
type Lock struct {
	f    *os.File
	path string
}

// LockPath is the file whose lock stands for the mirror at dbPath.
func LockPath(dbPath string) string { return dbPath + ".lock" }

// LockMirror takes the exclusive lock of the mirror at dbPath for this
// process, recording command as what holds it; it fails at once with a
// *LockedError when another process holds it. The directory is created
// (0700) if needed, the lock file 0600; the lock goes with the process, so
// a crash never leaves a mirror locked.
func LockMirror(dbPath, command string) (*Lock, error) {
	if err := os.MkdirAll(filepath.Dir(dbPath), 0o700); err != nil {
		return nil, fmt.Errorf("lock mirror %s: %w", dbPath, err)
	}
	p := LockPath(dbPath)
	f, err := os.OpenFile(p, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock mirror %s: %w", dbPath, err)
	}
	if err := flock(f); err != nil {
		defer f.Close()
		if errors.Is(err, errLocked) {
			le := &LockedError{Path: dbPath}
			if b, rerr := os.ReadFile(p); rerr == nil {
				_ = json.Unmarshal(b, &le.Holder)
			}
			return nil, le
		}
		return nil, fmt.Errorf("lock mirror %s: %w", dbPath, err)
	}
	b, _ := json.Marshal(Holder{PID: os.Getpid(), Command: command, Since: time.Now().UTC()})
	if err := writeHolder(f, b); err != nil {
		unlock(f)
		f.Close()
		return nil, fmt.Errorf("lock mirror %s: %w", dbPath, err)
	}
	return &Lock{f: f, path: dbPath}, nil
}

// writeHolder replaces the lock file's content with b.
func writeHolder(f *os.File, b []byte) error {
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt(b, 0); err != nil {
		return err
	}
	return f.Sync()
}

// Release gives the lock up. The file stays: removing it would let a
// process that opened it before the removal lock a file nobody else sees.
func (l *Lock) Release() error {
	if l == nil || l.f == nil {
		return nil
	}
	unlock(l.f)
	err := l.f.Close()
	l.f = nil
	return err
}
