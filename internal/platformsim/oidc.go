package platformsim

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"math/big"
	"net/http"
	"strings"
	"sync"
)

// oidcKey is the issuer's signing key, generated on first use because RSA
// key generation is slow and most simulators never sign anything, and
// again after rotate.
type oidcKey struct {
	mu  sync.Mutex
	key *rsa.PrivateKey
	kid string
}

// get returns the key, generating it on first use.
func (k *oidcKey) get() (*rsa.PrivateKey, string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.key == nil {
		key, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			return nil, "", fmt.Errorf("generate OIDC signing key: %w", err)
		}
		h := sha256.Sum256(key.N.Bytes())
		k.key, k.kid = key, hex.EncodeToString(h[:8])
	}
	return k.key, k.kid, nil
}

// rotate drops the key: the next use generates a new one, with a new key id.
func (k *oidcKey) rotate() {
	k.mu.Lock()
	k.key, k.kid = nil, ""
	k.mu.Unlock()
}

// RotateSigningKey replaces the OIDC issuer's signing key, as an issuer's
// key rotation does: tokens signed from now on name a new key id, and the
// JWKS serves the new key only.
func (s *Sim) RotateSigningKey() { s.oidcKey.rotate() }

func (s *Sim) signingKey() (*rsa.PrivateKey, string, error) { return s.oidcKey.get() }

// signJWT makes an RS256 JSON Web Token from the issuer's key.
func (s *Sim) signJWT(claims map[string]any) (string, error) { return signJWTWith(&s.oidcKey, claims) }

// signJWTWith makes an RS256 JSON Web Token signed by k.
func signJWTWith(k *oidcKey, claims map[string]any) (string, error) {
	key, kid, err := k.get()
	if err != nil {
		return "", err
	}
	header, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": kid})
	payload, err := json.Marshal(claims)
	if err != nil {
		return "", fmt.Errorf("encode claims: %w", err)
	}
	enc := base64.RawURLEncoding
	signing := enc.EncodeToString(header) + "." + enc.EncodeToString(payload)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(nil, key, crypto.SHA256, sum[:])
	if err != nil {
		return "", fmt.Errorf("sign token: %w", err)
	}
	return signing + "." + enc.EncodeToString(sig), nil
}

// isOIDCToken reports whether tok is a JWT signed by this simulator's issuer.
// Such tokens are for event receivers, never for the registry.
func (s *Sim) isOIDCToken(tok string) bool {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return false
	}
	sig, err := base64.RawURLEncoding.DecodeString(parts[2])
	if err != nil {
		return false
	}
	key, _, err := s.signingKey()
	if err != nil {
		return false
	}
	sum := sha256.Sum256([]byte(parts[0] + "." + parts[1]))
	return rsa.VerifyPKCS1v15(&key.PublicKey, crypto.SHA256, sum[:], sig) == nil
}

// Issuer returns the OIDC issuer URL, the simulator's base URL.
func (s *Sim) Issuer() string { return s.baseURL() }

func (s *Sim) serveDiscovery(w http.ResponseWriter, _ *http.Request, _ route) {
	writeDiscovery(w, s.baseURL(), s.baseURL()+"/.well-known/jwks.json")
}

func (s *Sim) serveJWKS(w http.ResponseWriter, _ *http.Request, _ route) {
	s.writeJWKS(w, &s.oidcKey)
}

// writeDiscovery answers an OpenID Provider configuration document.
func writeDiscovery(w http.ResponseWriter, issuer, jwksURI string) {
	writeJSON(w, http.StatusOK, map[string]any{
		"issuer":                                issuer,
		"jwks_uri":                              jwksURI,
		"response_types_supported":              []string{"id_token"},
		"subject_types_supported":               []string{"public"},
		"id_token_signing_alg_values_supported": []string{"RS256"},
		"claims_supported":                      []string{"iss", "sub", "aud", "iat", "exp", "webhook"},
	})
}

// writeJWKS answers the JSON Web Key Set holding k's public key.
func (s *Sim) writeJWKS(w http.ResponseWriter, k *oidcKey) {
	key, kid, err := k.get()
	if err != nil {
		writeError(w, s.newError(codeInternal, "Internal: "+err.Error()))
		return
	}
	enc := base64.RawURLEncoding
	writeJSON(w, http.StatusOK, map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "use": "sig", "alg": "RS256", "kid": kid,
		"n": enc.EncodeToString(key.N.Bytes()),
		"e": enc.EncodeToString(big.NewInt(int64(key.E)).Bytes()),
	}}})
}
