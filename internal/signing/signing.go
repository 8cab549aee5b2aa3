package signing

import (
	"bytes"
	"crypto/ed25519"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/binary"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// Header carries a message's signature: <public key>.<base64url signature>,
// the public key naming the key that signed (an nkey, "U…").
const Header = "Syncd-Signature"

// Why a message was rejected, as the reason label of
// syncd_rejected_messages_total.
const (
	ReasonUnsigned     = "unsigned"
	ReasonBadSignature = "bad_signature"
)

// ErrUnsigned is a message without a signature; ErrBadSignature one whose
// signature is malformed, by a key not trusted, or does not match.
var (
	ErrUnsigned     = errors.New("message is not signed")
	ErrBadSignature = errors.New("bad signature")
)

// Reason is the reason label of err, a Verify error.
func Reason(err error) string {
	if errors.Is(err, ErrUnsigned) {
		return ReasonUnsigned
	}
	return ReasonBadSignature
}

// Signer signs messages with one key.
type Signer struct {
	// priv is the key itself: nkeys' KeyPair.Sign decodes the seed and
	// derives the key again at every signature, which doubled its cost.
	priv ed25519.PrivateKey
	pub  string
	// idKey is the secret of MsgID, derived from the private key: only
	// the key's holder can compute a Nats-Msg-Id.
	idKey []byte
}

// LoadSigner reads the signing key in path, which must be readable by its
// owner only: an nkey seed ("SU…", or any nkey seed), as written by
// "nsc generate nkey --user" or "nk -gen user", or a PEM PKCS#8 Ed25519
// private key ("openssl genpkey -algorithm ed25519").
func LoadSigner(path string) (*Signer, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	if st.IsDir() {
		return nil, fmt.Errorf("signing key %q is a directory, want a file", path)
	}
	// A key others can read is a key others may sign with.
	if perm := st.Mode().Perm(); perm&0o077 != 0 {
		return nil, fmt.Errorf("signing key %q is readable by others (mode %04o): chmod 600 it", path, perm)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("signing key: %w", err)
	}
	s, err := ParseSigner(b)
	if err != nil {
		return nil, fmt.Errorf("signing key %q: %w", path, err)
	}
	return s, nil
}

// ParseSigner reads a signing key: an nkey seed, or a PEM PKCS#8 Ed25519
// private key. Errors never contain the key.
func ParseSigner(b []byte) (*Signer, error) {
	raw, err := rawSeed(b)
	if err != nil {
		return nil, err
	}
	kp, err := nkeys.FromRawSeed(nkeys.PrefixByteUser, raw)
	if err != nil {
		return nil, errors.New("not a valid Ed25519 seed")
	}
	pub, err := kp.PublicKey()
	if err != nil {
		return nil, errors.New("not a valid Ed25519 seed")
	}
	mac := hmac.New(sha256.New, raw)
	mac.Write([]byte("syncd Nats-Msg-Id v1"))
	return &Signer{priv: ed25519.NewKeyFromSeed(raw), pub: pub, idKey: mac.Sum(nil)}, nil
}

// rawSeed is the 32-byte Ed25519 seed of an nkey seed or a PEM key.
func rawSeed(b []byte) ([]byte, error) {
	if blk, _ := pem.Decode(b); blk != nil {
		if blk.Type != "PRIVATE KEY" {
			return nil, fmt.Errorf("PEM block %q: want an Ed25519 \"PRIVATE KEY\" (PKCS#8)", blk.Type)
		}
		k, err := x509.ParsePKCS8PrivateKey(blk.Bytes)
		if err != nil {
			return nil, errors.New("PEM private key is not PKCS#8")
		}
		ed, ok := k.(ed25519.PrivateKey)
		if !ok {
			return nil, fmt.Errorf("PEM private key is %T, want Ed25519", k)
		}
		return ed.Seed(), nil
	}
	seed := bytes.TrimSpace(b)
	if !bytes.HasPrefix(seed, []byte("S")) {
		return nil, errors.New("neither an nkey seed (S…) nor a PEM Ed25519 private key")
	}
	_, raw, err := nkeys.DecodeSeed(seed)
	if err != nil {
		return nil, errors.New("malformed nkey seed (bad length, encoding or checksum)")
	}
	return raw, nil
}

// PublicKey is the signing key's public key, as verify_keys lists it.
func (s *Signer) PublicKey() string { return s.pub }

// MsgID is the Nats-Msg-Id of the message whose id is id: id, a dot and
// 22 characters of an HMAC-SHA256 of id keyed with a secret derived from
// the signing key. It is as deterministic as id (the same event, published
// again by any replica with this key, is a duplicate), and nobody without
// the key can compute it.
func (s *Signer) MsgID(id string) string {
	mac := hmac.New(sha256.New, s.idKey)
	mac.Write([]byte(id))
	return id + "." + base64.RawURLEncoding.EncodeToString(mac.Sum(nil)[:msgIDMACBytes])
}

// msgIDMACBytes is how much of the HMAC a MsgID carries.
const msgIDMACBytes = 16

// EventID is the id a Nats-Msg-Id that syncd publishes under names: the
// id itself (unsigned), or the id of a MsgID under any key; false for an
// id of neither form. It does not tell whether the key was the leader's
// (the message's signature does: Verifier).
func EventID(msgID string) (string, bool) {
	id, mac, signed := strings.Cut(msgID, ".")
	if signed && len(mac) != base64.RawURLEncoding.EncodedLen(msgIDMACBytes) {
		return "", false
	}
	return id, id != ""
}

// Seal makes m, built with its id as Nats-Msg-Id, ready to publish: its
// Nats-Msg-Id becomes MsgID(id), and it is signed.
func (s *Signer) Seal(m *nats.Msg) *nats.Msg {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); id != "" {
		m.Header[jetstream.MsgIDHeader] = []string{s.MsgID(id)}
	}
	s.Sign(m)
	return m
}

// Sign adds the signature header to m, covering its subject, Nats-Msg-Id
// and data.
func (s *Signer) Sign(m *nats.Msg) {
	if m.Header == nil {
		m.Header = nats.Header{}
	}
	m.Header[Header] = []string{s.signature(Payload(s.pub, m.Subject, m.Header.Get(jetstream.MsgIDHeader), m.Data))}
}

// SignBytes signs what Payload returned, for what is not a message (a
// snapshot's manifest), and returns the value of a signature header.
func (s *Signer) SignBytes(payload []byte) string { return s.signature(payload) }

func (s *Signer) signature(payload []byte) string {
	return s.pub + "." + base64.RawURLEncoding.EncodeToString(ed25519.Sign(s.priv, payload))
}

// Payload is the byte string a signature covers: a version tag, then the
// signing key's public key, the subject and the Nats-Msg-Id, each after its
// length (so that no two messages share a payload), then the data.
func Payload(key, subject, msgID string, data []byte) []byte {
	const tag = "syncd-signature-v1"
	b := make([]byte, 0, len(tag)+len(key)+len(subject)+len(msgID)+len(data)+16)
	b = append(b, tag...)
	for _, f := range []string{key, subject, msgID} {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	return append(b, data...)
}

// Verifier checks signatures against the public keys it trusts.
type Verifier struct {
	// keys are the trusted public keys, by their nkey encoding, decoded
	// once.
	keys map[string]ed25519.PublicKey
}

// NewVerifier trusts the nkey public keys given ("U…", or any nkey public
// key); it fails naming the first that is malformed.
func NewVerifier(keys []string) (*Verifier, error) {
	if len(keys) == 0 {
		return nil, errors.New("no verify keys")
	}
	v := &Verifier{keys: make(map[string]ed25519.PublicKey, len(keys))}
	for _, k := range keys {
		k = strings.TrimSpace(k)
		if _, err := ParsePublicKey(k); err != nil {
			return nil, err
		}
		raw, err := nkeys.Decode(nkeys.Prefix(k), []byte(k))
		if err != nil || len(raw) != ed25519.PublicKeySize {
			return nil, fmt.Errorf("%.12q…: not an Ed25519 public key", k)
		}
		v.keys[k] = ed25519.PublicKey(raw)
	}
	return v, nil
}

// ParsePublicKey reads an nkey public key.
func ParsePublicKey(k string) (nkeys.KeyPair, error) {
	kp, err := nkeys.FromPublicKey(k)
	if err != nil {
		return nil, fmt.Errorf("%.12q…: not an nkey public key (56 characters, U… for a user key): %v", k, err)
	}
	return kp, nil
}

// Verify checks the signature of a message with subject, headers h and
// data; the error wraps ErrUnsigned or ErrBadSignature.
func (v *Verifier) Verify(subject string, h nats.Header, data []byte) error {
	return v.VerifyBytes(h.Get(Header), func(key string) []byte {
		return Payload(key, subject, h.Get(jetstream.MsgIDHeader), data)
	})
}

// VerifyBytes checks sig, a signature header's value, over the payload
// built for the key it names.
func (v *Verifier) VerifyBytes(sig string, payload func(key string) []byte) error {
	if sig == "" {
		return ErrUnsigned
	}
	key, enc, ok := strings.Cut(sig, ".")
	if !ok {
		return fmt.Errorf("%w: malformed %s header", ErrBadSignature, Header)
	}
	pub, ok := v.keys[key]
	if !ok {
		return fmt.Errorf("%w: key %.12s… is not among the verify keys", ErrBadSignature, key)
	}
	raw, err := base64.RawURLEncoding.DecodeString(enc)
	if err != nil || len(raw) != ed25519.SignatureSize {
		return fmt.Errorf("%w: malformed %s header", ErrBadSignature, Header)
	}
	if !ed25519.Verify(pub, payload(key), raw) {
		return fmt.Errorf("%w: does not match the message (key %.12s…)", ErrBadSignature, key)
	}
	return nil
}
