package cluster

import "time"

// SetDownloadStall sets downloadStall for a test and returns its undoing.
func SetDownloadStall(d time.Duration) func() {
	old := downloadStall
	downloadStall = d
	return func() { downloadStall = old }
}
