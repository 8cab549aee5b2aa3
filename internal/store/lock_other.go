//go:build !unix

package store

import (
	"errors"
	"os"
)

var errLocked = errors.New("locked by another process")

// flock does nothing where flock(2) does not exist: syncd is built for
// Unix, and elsewhere two processes on one mirror are not refused.
func flock(*os.File) error { return nil }

func unlock(*os.File) {}
