package events_test

import (
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/syncd-dev/syncd/internal/events"
)

// issuer is a local OIDC issuer the receiver trusts, for deliveries whose
// claims the simulator never makes: no jti, an old or future iat, a short
// exp. Its clock is fixed, and shared with the receivers it serves.
type issuer struct {
	url    string
	now    time.Time
	signer jose.Signer
}

// newSigner makes an RS256 key and a JWT signer naming it kid.
func newSigner(t *testing.T, kid string) (*rsa.PrivateKey, jose.Signer) {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := jose.NewSigner(
		jose.SigningKey{Algorithm: jose.RS256, Key: key},
		(&jose.SignerOptions{}).WithType("JWT").WithHeader("kid", kid),
	)
	if err != nil {
		t.Fatal(err)
	}
	return key, signer
}

func newIssuer(t *testing.T) *issuer {
	t.Helper()
	key, signer := newSigner(t, "local")
	is := &issuer{now: time.Now().Truncate(time.Second), signer: signer}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).Encode(map[string]any{"issuer": is.url, "jwks_uri": is.url + "/keys",
			"id_token_signing_alg_values_supported": []string{"RS256"}})
	})
	mux.HandleFunc("GET /keys", func(w http.ResponseWriter, _ *http.Request) {
		json.NewEncoder(w).
			Encode(
				jose.JSONWebKeySet{Keys: []jose.JSONWebKey{{Key: &key.PublicKey, KeyID: "local", Algorithm: "RS256", Use: "sig"}}},
			)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	is.url = srv.URL
	return is
}

// receiver serves a receiver trusting this issuer, with its clock.
func (is *issuer) receiver(t *testing.T, mod func(*events.Config)) (*events.Receiver, *recordedJobs, string) {
	t.Helper()
	cfg := events.Config{
		Issuer:     is.url,
		Groups:     []string{"org1"},
		TypePrefix: "dev.chainguard.",
		Now:        func() time.Time { return is.now },
	}
	if mod != nil {
		mod(&cfg)
	}
	return serveReceiver(t, cfg, &memDeliveries{})
}

// deliver signs a delivery of body as the platform would for group org1:
// iat now, exp in 10 minutes, no jti; mod changes the claims.
func (is *issuer) deliver(t *testing.T, id, typ, subject string, body any, mod func(claims map[string]any)) delivery {
	t.Helper()
	raw, err := json.Marshal(map[string]any{"actor": map[string]any{"subject": "test"}, "body": body})
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(raw)
	claims := map[string]any{
		"iss": is.url, "aud": "customer", "sub": "webhook:org1",
		"iat": is.now.Unix(), "exp": is.now.Add(10 * time.Minute).Unix(),
		"webhook": map[string]string{"digest": "sha256:" + hex.EncodeToString(sum[:])},
	}
	if mod != nil {
		mod(claims)
	}
	tok, err := jwt.Signed(is.signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	h := http.Header{}
	h.Set("Authorization", "Bearer "+tok)
	h.Set("Content-Type", "application/json")
	h.Set("Ce-Specversion", "1.0")
	h.Set("Ce-Id", id)
	h.Set("Ce-Type", typ)
	if subject != "" {
		h.Set("Ce-Subject", subject)
	}
	return delivery{header: h, body: raw}
}

const pushType = "dev.chainguard.registry.push.v1"

// pushBody is a push of org1/r:latest.
var pushBody = map[string]any{"repository": "org1/r", "repo_id": "org1/r", "tag": "latest", "type": "manifest"}
