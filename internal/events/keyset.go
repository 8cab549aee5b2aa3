package events

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sync"
	"time"

	"github.com/go-jose/go-jose/v4"
)

// DefaultKeyRefreshInterval is how often, at most, the issuer's key set is
// fetched again.
const DefaultKeyRefreshInterval = 5 * time.Minute

// maxJWKSBytes bounds the key set read from the issuer.
const maxJWKSBytes = 1 << 20

// signingAlgs are the JWS algorithms a delivery's token may use; the
// verifier narrows them to what the issuer's discovery document lists.
var signingAlgs = []jose.SignatureAlgorithm{jose.RS256, jose.RS384, jose.RS512, jose.ES256, jose.ES384, jose.ES512,
	jose.PS256, jose.PS384, jose.PS512, jose.EdDSA}

// keySet is the issuer's JSON Web Key Set, cached. go-oidc's RemoteKeySet
// fetches the set again whenever a signature does not verify, so every
// forged token cost a request to the issuer (200 forgeries, 200 fetches,
// enough to have syncd rate-limited there). This one fetches again only
// for a token naming a key id the cached set lacks (or naming none), and
// at most once per interval: a key rotation is picked up within one
// interval, and a forgery under a known key id costs nothing.
type keySet struct {
	url      string
	client   *http.Client
	now      func() time.Time
	interval time.Duration

	mu      sync.Mutex // held while fetching, so that one fetch serves all
	keys    []jose.JSONWebKey
	fetched time.Time // the last fetch attempt, successful or not
}

func newKeySet(url string, client *http.Client, now func() time.Time, interval time.Duration) *keySet {
	return &keySet{url: url, client: client, now: now, interval: interval}
}

// VerifySignature implements oidc.KeySet.
func (k *keySet) VerifySignature(ctx context.Context, raw string) ([]byte, error) {
	jws, err := jose.ParseSigned(raw, signingAlgs)
	if err != nil {
		return nil, fmt.Errorf("malformed token: %w", err)
	}
	kid := ""
	if len(jws.Signatures) > 0 {
		kid = jws.Signatures[0].Header.KeyID
	}
	keys, err := k.keysFor(ctx, kid)
	if err != nil {
		return nil, err
	}
	for _, key := range keys {
		if kid == "" || key.KeyID == kid {
			if payload, err := jws.Verify(&key); err == nil {
				return payload, nil
			}
		}
	}
	return nil, errors.New("no key of the issuer verifies the token's signature")
}

// keysFor returns the keys to try for a token naming kid: the cached set,
// fetched again first when it lacks kid (or kid is empty) and the last
// fetch is an interval old.
func (k *keySet) keysFor(ctx context.Context, kid string) ([]jose.JSONWebKey, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if kid != "" && hasKey(k.keys, kid) {
		return k.keys, nil
	}
	if !k.fetched.IsZero() && k.now().Sub(k.fetched) < k.interval {
		if kid != "" {
			return nil, fmt.Errorf(
				"the token names key id %q, which the issuer's key set (fetched %s ago) lacks; it is fetched again at most every %s",
				kid,
				k.now().Sub(k.fetched).Round(time.Second),
				k.interval,
			)
		}
		return k.keys, nil
	}
	k.fetched = k.now()
	keys, err := k.fetch(ctx)
	if err != nil {
		return nil, fmt.Errorf("fetch the issuer's keys: %w", err)
	}
	k.keys = keys
	return keys, nil
}

func hasKey(keys []jose.JSONWebKey, kid string) bool {
	for _, key := range keys {
		if key.KeyID == kid {
			return true
		}
	}
	return false
}

// fetch reads the key set, skipping keys of types go-jose does not know
// rather than failing on them, as go-oidc does.
func (k *keySet) fetch(ctx context.Context) ([]jose.JSONWebKey, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, k.url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := k.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxJWKSBytes))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", k.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", k.url, resp.Status)
	}
	var set struct {
		Keys []json.RawMessage `json:"keys"`
	}
	if err := json.Unmarshal(body, &set); err != nil {
		return nil, fmt.Errorf("decode %s: %w", k.url, err)
	}
	var keys []jose.JSONWebKey
	for _, raw := range set.Keys {
		var key jose.JSONWebKey
		if err := key.UnmarshalJSON(raw); err == nil && key.Valid() {
			keys = append(keys, key)
		}
	}
	return keys, nil
}
