package testutil

import (
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
)

// Eventually polls cond every 20ms until it returns nil, and fails tb with
// cond's last error once within has passed.
func Eventually(tb testing.TB, within time.Duration, cond func() error) {
	tb.Helper()
	deadline := time.Now().Add(within)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("not within %s: %v", within, err)
		}
		<-tick.C
	}
}

// WaitFor polls cond until it holds, failing tb after within with what was
// awaited.
func WaitFor(tb testing.TB, within time.Duration, what string, cond func() bool) {
	tb.Helper()
	Eventually(tb, within, func() error {
		if cond() {
			return nil
		}
		return errors.New("waiting for " + what)
	})
}

// Listen listens on a loopback port the system picks, until the test ends.
// A test that must name an address before its server starts passes the
// listener itself, so no other process can take the port in between.
func Listen(tb testing.TB) net.Listener {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ln.Close() })
	return ln
}

// Sim populates a simulator with sc and serves it on a loopback port until
// the test ends; wrap, when given, wraps its handler (to count or break
// requests). It returns the simulator and its URL, which is also the
// simulator's own base URL.
func Sim(
	tb testing.TB,
	opts platformsim.Options,
	sc platformsim.Scale,
	wrap ...func(http.Handler) http.Handler,
) (*platformsim.Sim, string) {
	tb.Helper()
	sim := platformsim.New(opts)
	sim.Populate(sc)
	h := sim.Handler()
	for _, w := range wrap {
		h = w(h)
	}
	srv := httptest.NewServer(h)
	tb.Cleanup(srv.Close)
	tb.Cleanup(sim.Close)
	sim.SetBaseURL(srv.URL)
	return sim, srv.URL
}

// Clock is a clock a test moves by hand, safe for concurrent use.
type Clock struct {
	mu sync.Mutex
	t  time.Time
	// waiters are After's channels, each with its instant.
	waiters []clockWaiter
}

type clockWaiter struct {
	at time.Time
	ch chan time.Time
}

// NewClock returns a Clock standing at t.
func NewClock(t time.Time) *Clock { return &Clock{t: t} }

// Now returns the clock's time.
func (c *Clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

// Advance moves the clock on by d, and fires the channels of After whose
// instant it reached.
func (c *Clock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.fire()
	c.mu.Unlock()
}

// After returns a channel that receives the clock's time once Advance has
// moved it d on (at once when d <= 0), as time.After does in real time.
func (c *Clock) After(d time.Duration) <-chan time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := make(chan time.Time, 1)
	c.waiters = append(c.waiters, clockWaiter{at: c.t.Add(d), ch: ch})
	c.fire()
	return ch
}

// Waiting reports whether a channel of After waits for the instant at:
// whether the code under test armed a timer for it.
func (c *Clock) Waiting(at time.Time) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, w := range c.waiters {
		if w.at.Equal(at) {
			return true
		}
	}
	return false
}

// fire sends on the waiters' channels whose instant has come; c.mu is held.
func (c *Clock) fire() {
	kept := c.waiters[:0]
	for _, w := range c.waiters {
		if w.at.After(c.t) {
			kept = append(kept, w)
			continue
		}
		w.ch <- c.t
	}
	c.waiters = kept
}

// TagHistory is a tag of the simulator with its repo's registry path and
// its history, oldest first.
type TagHistory struct {
	Path    string
	Tag     platformsim.TruthTag
	History []platformsim.TruthRecord
}

// TagsWithHistory are truth's tags that have a history, by repo path and
// tag name.
func TagsWithHistory(truth platformsim.Truth) []TagHistory {
	paths := map[string]string{}
	for _, r := range truth.Repos {
		paths[r.UID] = r.Path
	}
	var out []TagHistory
	for _, tg := range truth.Tags {
		if h := truth.History[tg.UID]; len(h) > 0 {
			out = append(out, TagHistory{Path: paths[tg.RepoUID], Tag: tg, History: h})
		}
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Path != out[j].Path {
			return out[i].Path < out[j].Path
		}
		return out[i].Tag.Name < out[j].Tag.Name
	})
	return out
}
