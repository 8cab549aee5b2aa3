package crawler

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// A repo or tag whose reads fail (404, 403, 5xx past the retries) fails
// only itself: it is recorded in crawl_failures with its error, the rest of
// the crawl completes, and it is read again on a later run, with backoff.
// Nothing in a failed scope is deleted, since its listing did not finish.

// readError marks an error of reading the platform for one scope, as
// opposed to the store failing or the crawl being stopped, which stop the
// whole crawl.
type readError struct{ err error }

func (e *readError) Error() string { return e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// readErr wraps err as a read error when it is one scope's: the platform
// or registry answered the scope's own request with an error status (404,
// 403, 5xx past the retries). Errors of getting a credential (an STS that
// refuses or cannot be reached, a token command that fails) and of the
// network are everyone's, and stay errors of the crawl: recording them as
// failures of every tag would hold the whole mirror back once they pass.
func readErr(err error) error {
	if err == nil {
		return nil
	}
	var ae *platform.AuthError
	if errors.As(err, &ae) && strings.HasPrefix(ae.Service, "STS") {
		return err
	}
	var apiErr *platform.Error
	if !errors.As(err, &apiErr) {
		return err
	}
	return &readError{err}
}

// scopeFailed reports whether err fails only the scope it came from.
func scopeFailed(ctx context.Context, err error) bool {
	var re *readError
	return err != nil && ctx.Err() == nil && errors.As(err, &re)
}

// failureBackoff is how long a scope that failed attempts times in a row
// waits before it is read again: the next two runs try it again (a blip
// heals at once), then it waits a minute, doubling up to an hour.
func failureBackoff(attempts int) time.Duration {
	if attempts <= 2 {
		return 0
	}
	return min(time.Minute<<min(attempts-3, 6), time.Hour)
}

// failures is the crawler's view of crawl_failures, loaded once and kept
// in step with every record and clear.
type failures struct {
	store *store.Store
	now   func() time.Time

	mu     sync.Mutex
	loaded bool
	known  map[string]store.Failure // by uid; what load found, and since
}

func newFailures(st *store.Store, now func() time.Time) *failures {
	return &failures{store: st, now: now, known: make(map[string]store.Failure)}
}

func (f *failures) load(ctx context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.loaded {
		return nil
	}
	all, err := f.store.Failures(ctx)
	if err != nil {
		return err
	}
	for _, x := range all {
		if _, ok := f.known[x.UID]; !ok {
			f.known[x.UID] = x
		}
	}
	f.loaded = true
	return nil
}

// reload loads crawl_failures again, replacing what was known: a replica
// that follows the stream between its terms as leader finds there the
// failures another leader recorded and cleared meanwhile.
func (f *failures) reload(ctx context.Context) error {
	all, err := f.store.Failures(ctx)
	if err != nil {
		return err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	clear(f.known)
	for _, x := range all {
		f.known[x.UID] = x
	}
	f.loaded = true
	return nil
}

// count is how many failures are known.
func (f *failures) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.known)
}

// heldBack returns the failure of uid when its next attempt is still to
// come at now.
func (f *failures) heldBack(uid string, now time.Time) (store.Failure, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	x, ok := f.known[uid]
	return x, ok && x.NextAttempt.After(now)
}

// has reports whether uid has a recorded failure.
func (f *failures) has(uid string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.known[uid]
	return ok
}

// record notes that reading the scope x failed with err.
func (f *failures) record(ctx context.Context, x store.Failure, err error) (store.Failure, error) {
	x.Error = err.Error()
	var apiErr *platform.Error
	if errors.As(err, &apiErr) {
		x.Status = apiErr.Status
	}
	var wrong *platform.WrongAudienceError
	if x.Status == 0 && errors.As(err, &wrong) {
		x.Status = http.StatusForbidden
	}
	x.LastFailed = f.now()
	rec, rerr := f.store.RecordFailure(ctx, x, failureBackoff)
	if rerr != nil {
		return rec, rerr
	}
	f.mu.Lock()
	f.known[rec.UID] = rec
	f.mu.Unlock()
	return rec, nil
}

// forget drops failures of scopes that are gone (deleted upstream); the
// store dropped their rows with the deletion.
func (f *failures) forget(uids []string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, uid := range uids {
		delete(f.known, uid)
	}
}

// clear forgets the failure of uid after a successful read; it reports
// whether there was one.
func (f *failures) clear(ctx context.Context, uid string) (bool, error) {
	f.mu.Lock()
	_, ok := f.known[uid]
	f.mu.Unlock()
	if !ok {
		return false, nil
	}
	if _, err := f.store.ClearFailure(ctx, uid); err != nil {
		return false, err
	}
	f.mu.Lock()
	delete(f.known, uid)
	f.mu.Unlock()
	return true, nil
}
