package events_test

import (
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/syncd-dev/syncd/internal/events"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

const jwksEndpoint = "GET /.well-known/jwks.json"

// TestReceiver_ForgedTokensDoNotFetchKeys: 200 forged deliveries, half
// under the issuer's own key id and half under key ids it never had, make
// at most one request for the issuer's key set, where each made one
// (go-oidc fetches again on every signature that does not verify); and a
// genuine key rotation is still picked up, once the refresh interval has
// passed since the last fetch.
func TestReceiver_ForgedTokensDoNotFetchKeys(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	rcv, jobs, url := f.receiver(t, nil)
	runQueue(t, rcv)
	if code, body := post(t, url, f.pushed.header, f.pushed.body); code != http.StatusAccepted {
		t.Fatalf("genuine delivery: status=%d body=%s, want 202", code, body)
	}
	f.sim.ResetStats()
	realKid := keyID(t, f.pushed.header)
	attacker, _ := newSigner(t, "attacker")
	for i := range 200 {
		kid := realKid
		if i%2 == 1 {
			kid = fmt.Sprintf("forged-%d", i)
		}
		d := forgery(t, f, attacker, kid, fmt.Sprintf("forged-%d", i))
		if code, body := post(t, url, d.header, d.body); code != http.StatusForbidden ||
			!strings.Contains(body, events.ReasonBadToken) {
			t.Fatalf("forgery %d (kid %s): status=%d body=%s, want 403 %s", i, kid, code, body, events.ReasonBadToken)
		}
	}
	if got := f.sim.Stats().ByEndpoint[jwksEndpoint]; got > 1 {
		t.Errorf("200 forged deliveries made %d key set requests, want at most 1", got)
	}
	if got := len(jobs.list()); got != 1 {
		t.Fatalf("jobs=%d, want only the genuine delivery's", got)
	}

	// The issuer rotates its key. Within the interval of the last fetch
	// the new key id is not fetched for; after it, the first token naming
	// it fetches the set once, and verifies.
	f.sim.RotateSigningKey()
	if code, _ := pushAndPost(t, f, url); code != http.StatusForbidden {
		t.Fatalf("rotated key within the interval: status=%d, want 403", code)
	}
	f.sim.Advance(events.DefaultKeyRefreshInterval)
	f.sim.ResetStats()
	if code, body := pushAndPost(t, f, url); code != http.StatusAccepted {
		t.Fatalf("rotated key after the interval: status=%d body=%s, want 202", code, body)
	}
	if got := f.sim.Stats().ByEndpoint[jwksEndpoint]; got != 1 {
		t.Errorf("the rotation made %d key set requests, want 1", got)
	}
	if got := waitJobs(t, jobs, 2); len(got) != 2 {
		t.Errorf("jobs=%q, want the first delivery's and the rotated key's", got)
	}
}

// pushAndPost has the simulator push a move of its first tag, signed by
// its current key, and posts that delivery to url.
func pushAndPost(t *testing.T, f *fixture, url string) (int, string) {
	t.Helper()
	d := f.push(t, f.sim.Truth().Tags[0])
	return post(t, url, d.header, d.body)
}

// TestReceiver_UnknownKeyFetchedAtOnce: a rotation is picked up at the
// first token naming the new key id when the key set was fetched longer
// than the interval ago.
func TestReceiver_UnknownKeyFetchedAtOnce(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	rcv, _, url := f.receiver(t, func(c *events.Config) { c.KeyRefreshInterval = time.Minute })
	runQueue(t, rcv)
	if code, _ := post(t, url, f.pushed.header, f.pushed.body); code != http.StatusAccepted {
		t.Fatalf("genuine delivery: status=%d, want 202", code)
	}
	f.sim.Advance(time.Minute)
	f.sim.RotateSigningKey()
	if code, body := pushAndPost(t, f, url); code != http.StatusAccepted {
		t.Fatalf("rotated key: status=%d body=%s, want 202", code, body)
	}
}

// keyID is the kid in the header of a delivery's token.
func keyID(t *testing.T, h http.Header) string {
	t.Helper()
	tok := strings.TrimPrefix(h.Get("Authorization"), "Bearer ")
	head, _, _ := strings.Cut(tok, ".")
	raw, err := base64.RawURLEncoding.DecodeString(head)
	if err != nil {
		t.Fatal(err)
	}
	var v struct {
		Kid string `json:"kid"`
	}
	if err := json.Unmarshal(raw, &v); err != nil || v.Kid == "" {
		t.Fatalf("token header %s has no kid (%v)", raw, err)
	}
	return v.Kid
}

// forgery is a delivery of the fixture's pushed body with every claim the
// platform would make, under a new jti, signed by the attacker's key with
// a header naming kid.
func forgery(t *testing.T, f *fixture, key *rsa.PrivateKey, kid, id string) delivery {
	t.Helper()
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: jose.RS256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid),
	)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(f.pushed.body)
	now := f.sim.Now()
	tok, err := jwt.Signed(signer).Claims(map[string]any{
		"iss": f.simURL, "aud": "customer", "sub": "webhook:org1", "iat": now.Unix(), "exp": now.Add(10 * time.Minute).Unix(),
		"jti": id, "webhook": map[string]string{"digest": "sha256:" + hex.EncodeToString(sum[:])},
	}).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	h := f.pushed.header.Clone()
	h.Set("Authorization", "Bearer "+tok)
	h.Set("Ce-Id", id)
	return delivery{header: h, body: f.pushed.body}
}
