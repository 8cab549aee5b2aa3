package signing_test

import (
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/signing"
)

// newSeed returns a fresh user nkey seed and its public key.
func newSeed(t *testing.T) ([]byte, string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	return seed, pub
}

func writeKey(t *testing.T, b []byte, mode os.FileMode) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "signing.nk")
	if err := os.WriteFile(path, b, mode); err != nil {
		t.Fatal(err)
	}
	return path
}

func message() *nats.Msg {
	return &nats.Msg{Subject: "syncd.tag.created.g%2Fr", Data: []byte(`{"id":"e1"}`),
		Header: nats.Header{jetstream.MsgIDHeader: []string{"e1"}}}
}

// TestSignVerify: a sealed message verifies with its key's public key; a
// change of its subject, data, Nats-Msg-Id or signature, a key not
// trusted and a missing header are each rejected with the right reason.
func TestSignVerify(t *testing.T) {
	seed, pub := newSeed(t)
	s, err := signing.LoadSigner(writeKey(t, append(seed, '\n'), 0o600))
	if err != nil {
		t.Fatal(err)
	}
	if s.PublicKey() != pub {
		t.Fatalf("public key %s, want %s", s.PublicKey(), pub)
	}
	_, other := newSeed(t)
	v, err := signing.NewVerifier([]string{other, pub})
	if err != nil {
		t.Fatal(err)
	}
	m := s.Seal(message())
	if err := v.Verify(m.Subject, m.Header, m.Data); err != nil {
		t.Fatalf("genuine message: %v", err)
	}
	if id := m.Header.Get(jetstream.MsgIDHeader); !strings.HasPrefix(id, "e1.") || id == s.MsgID("e2") {
		t.Errorf("Nats-Msg-Id %q", id)
	}
	tamper := map[string]func(m *nats.Msg){
		"subject":   func(m *nats.Msg) { m.Subject = "syncd.tag.deleted.g%2Fr" },
		"data":      func(m *nats.Msg) { m.Data = []byte(`{"id":"e2"}`) },
		"msg id":    func(m *nats.Msg) { m.Header.Set(jetstream.MsgIDHeader, "e1") },
		"signature": func(m *nats.Msg) { m.Header.Set(signing.Header, flipSignatureBit(t, m.Header.Get(signing.Header))) },
		"truncated": func(m *nats.Msg) { h := m.Header.Get(signing.Header); m.Header.Set(signing.Header, h[:60]) },
		"no dot":    func(m *nats.Msg) { m.Header.Set(signing.Header, pub) },
		"unsigned":  func(m *nats.Msg) { m.Header.Del(signing.Header) },
		"other key": func(
			m *nats.Msg,
		) {
			h := m.Header.Get(signing.Header)
			m.Header.Set(signing.Header, other+h[len(pub):])
		},
		"nil header": func(m *nats.Msg) { m.Header = nil },
	}
	for name, fn := range tamper {
		m := s.Seal(message())
		fn(m)
		err := v.Verify(m.Subject, m.Header, m.Data)
		want := signing.ErrBadSignature
		if name == "unsigned" || name == "nil header" {
			want = signing.ErrUnsigned
		}
		if !errors.Is(err, want) {
			t.Errorf("%s: %v, want %v", name, err, want)
		}
	}
	// Signed by a key the verifier does not trust.
	untrusted, _ := newSeed(t)
	u, err := signing.ParseSigner(untrusted)
	if err != nil {
		t.Fatal(err)
	}
	m = u.Seal(message())
	if err := v.Verify(m.Subject, m.Header, m.Data); !errors.Is(err, signing.ErrBadSignature) ||
		signing.Reason(err) != signing.ReasonBadSignature {
		t.Errorf("untrusted key: %v", err)
	}
	if signing.Reason(signing.ErrUnsigned) != signing.ReasonUnsigned {
		t.Error("reason of ErrUnsigned")
	}
	// The Nats-Msg-Id depends on the key: another key's differs.
	if u.MsgID("e1") == s.MsgID("e1") {
		t.Error("two keys derive the same Nats-Msg-Id")
	}
}

// TestLoadSigner_PEM: a PKCS#8 Ed25519 key signs as the nkey of the same
// seed does.
func TestLoadSigner_PEM(t *testing.T) {
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	der, err := x509.MarshalPKCS8PrivateKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	s, err := signing.LoadSigner(writeKey(t, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o400))
	if err != nil {
		t.Fatal(err)
	}
	kp, _ := nkeys.FromRawSeed(nkeys.PrefixByteUser, priv.Seed())
	pub, _ := kp.PublicKey()
	if s.PublicKey() != pub {
		t.Fatalf("public key %s, want %s", s.PublicKey(), pub)
	}
}

// TestLoadSigner_Errors: each bad key file fails naming its problem, and
// no error repeats the key.
func TestLoadSigner_Errors(t *testing.T) {
	seed, pub := newSeed(t)
	rsa := pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: []byte("x")})
	broken := append([]byte(nil), seed...)
	broken[10] ^= 1
	for name, c := range map[string]struct {
		path func() string
		want string
	}{
		"missing":     {func() string { return filepath.Join(t.TempDir(), "none") }, "no such file"},
		"directory":   {func() string { return t.TempDir() }, "is a directory"},
		"world":       {func() string { return writeKey(t, seed, 0o644) }, "chmod 600"},
		"public key":  {func() string { return writeKey(t, []byte(pub), 0o600) }, "neither an nkey seed"},
		"broken seed": {func() string { return writeKey(t, broken, 0o600) }, "malformed nkey seed"},
		"rsa":         {func() string { return writeKey(t, rsa, 0o600) }, `want an Ed25519 "PRIVATE KEY"`},
	} {
		_, err := signing.LoadSigner(c.path())
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want %q", name, err, c.want)
		}
		if err != nil && strings.Contains(err.Error(), string(seed[2:20])) {
			t.Errorf("%s: error contains the seed", name)
		}
	}
	if _, err := signing.NewVerifier([]string{pub, "UNOTAKEY"}); err == nil ||
		!strings.Contains(err.Error(), "not an nkey public key") {
		t.Errorf("bad verify key: %v", err)
	}
}

// BenchmarkSeal is the relay's cost per event of a signing key: a
// Nats-Msg-Id derived and an Ed25519 signature over a typical event.
func BenchmarkSeal(b *testing.B) {
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	s, err := signing.ParseSigner(seed)
	if err != nil {
		b.Fatal(err)
	}
	data := []byte(strings.Repeat("x", 700))
	b.ReportAllocs()
	for b.Loop() {
		s.Seal(
			&nats.Msg{
				Subject: "syncd.tag.moved.nginx",
				Data:    data,
				Header:  nats.Header{jetstream.MsgIDHeader: []string{"0123456789abcdef0123456789abcdef"}},
			},
		)
	}
}

// BenchmarkVerify is a follower's cost per message of verifying.
func BenchmarkVerify(b *testing.B) {
	kp, _ := nkeys.CreateUser()
	seed, _ := kp.Seed()
	s, _ := signing.ParseSigner(seed)
	v, _ := signing.NewVerifier([]string{s.PublicKey()})
	m := s.Seal(&nats.Msg{Subject: "syncd.tag.moved.nginx", Data: []byte(strings.Repeat("x", 700)),
		Header: nats.Header{jetstream.MsgIDHeader: []string{"0123456789abcdef0123456789abcdef"}}})
	b.ReportAllocs()
	for b.Loop() {
		if err := v.Verify(m.Subject, m.Header, m.Data); err != nil {
			b.Fatal(err)
		}
	}
}

// flipSignatureBit returns the header value h with one bit of its
// signature changed. (Replacing its last characters with "AA" changed
// nothing when the signature's last byte was 0, one signature in 256.)
func flipSignatureBit(t *testing.T, h string) string {
	t.Helper()
	key, enc, ok := strings.Cut(h, ".")
	sig, err := base64.RawURLEncoding.DecodeString(enc)
	if !ok || err != nil || len(sig) == 0 {
		t.Fatalf("signature header %q: %v", h, err)
	}
	sig[len(sig)-1] ^= 1
	return key + "." + base64.RawURLEncoding.EncodeToString(sig)
}

// TestEventID: the event id of a Nats-Msg-Id syncd publishes under, signed
// by any key or unsigned; an id of another form names none.
func TestEventID(t *testing.T) {
	seed, _ := newSeed(t)
	s, err := signing.ParseSigner(seed)
	if err != nil {
		t.Fatal(err)
	}
	const id = "5c220caf73295f579263b38c4b46f66b"
	for _, c := range []struct {
		msgID, want string
		ok          bool
	}{
		{s.MsgID(id), id, true},
		{id, id, true},
		{id + ".short", "", false},
		{"", "", false},
	} {
		if got, ok := signing.EventID(c.msgID); got != c.want || ok != c.ok {
			t.Errorf("EventID(%q) = %q, %v; want %q, %v", c.msgID, got, ok, c.want, c.ok)
		}
	}
}
