package events

import (
	"sync"
	"time"
)

// usedTokens remembers, for each token that carried an accepted delivery,
// that delivery's Ce-Id, until the token could no longer be accepted. Its
// size is bounded by how many tokens the platform signs for this receiver
// within one token life (at most MaxTokenAge plus ClockSkew), since a
// token is only ever remembered after it verified.
type usedTokens struct {
	mu        sync.Mutex
	byToken   map[string]usedToken
	nextSweep time.Time
}

type usedToken struct {
	ceID string
	end  time.Time // after this the token is refused anyway
}

// sweepEvery is how often expired tokens are dropped; between sweeps an
// expired token costs a few bytes and nothing else.
const sweepEvery = time.Minute

func newUsedTokens() *usedTokens { return &usedTokens{byToken: map[string]usedToken{}} }

// claim records that token carries the delivery ceID until end, unless the
// token is already remembered. It returns the Ce-Id the token carries and
// whether this call recorded it.
func (u *usedTokens) claim(token, ceID string, end, now time.Time) (string, bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if !now.Before(u.nextSweep) {
		for k, t := range u.byToken {
			if now.After(t.end) {
				delete(u.byToken, k)
			}
		}
		u.nextSweep = now.Add(sweepEvery)
	}
	if t, ok := u.byToken[token]; ok && !now.After(t.end) {
		return t.ceID, false
	}
	u.byToken[token] = usedToken{ceID: ceID, end: end}
	return ceID, true
}

// rebind changes the Ce-Id a remembered token carries.
func (u *usedTokens) rebind(token, ceID string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if t, ok := u.byToken[token]; ok {
		t.ceID = ceID
		u.byToken[token] = t
	}
}

// forget drops a token, so that it may carry a delivery again.
func (u *usedTokens) forget(token string) {
	u.mu.Lock()
	defer u.mu.Unlock()
	delete(u.byToken, token)
}

// len returns how many tokens are remembered.
func (u *usedTokens) len() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	return len(u.byToken)
}
