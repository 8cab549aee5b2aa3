package cluster

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/signing"
)

// A snapshot's manifest is signed like the stream's messages: the leader
// signs the object's name, the SHA-256 of the database file it holds
// (before compression), and its stream_seq and created metadata, and
// stores the digest and the signature as metadata beside them, in the one
// Put. A follower with verify keys restores only a snapshot whose manifest
// verifies and whose downloaded file has the signed digest: a planted
// object, or a genuine one whose content, sequence or time was changed, is
// not restored.

// Object metadata keys of a snapshot's digest and signature.
const (
	snapshotSHAKey = "raw_sha256"
	snapshotSigKey = "signature"
)

// manifest is what a snapshot's signature covers, as stored.
type manifest struct {
	name, digest, seq, created string
}

func manifestOf(oi *jetstream.ObjectInfo) manifest {
	return manifest{
		name:    oi.Name,
		digest:  oi.Metadata[snapshotSHAKey],
		seq:     oi.Metadata[snapshotSeqKey],
		created: oi.Metadata[snapshotCreatedKey],
	}
}

// payload is the byte string signed for key.
func (m manifest) payload(key string) []byte {
	return signing.Payload(key, "snapshot "+m.name, m.digest, []byte(m.seq+" "+m.created))
}

// signManifest adds the SHA-256 of the database file f (read from its
// start, and left at it) and the signature of the manifest to md, the
// metadata of the object name about to be written.
func signManifest(f io.ReadSeeker, name string, md map[string]string, s *signing.Signer) error {
	sum, err := fileSHA256(f)
	if err != nil {
		return fmt.Errorf("digest of the snapshot file: %w", err)
	}
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return fmt.Errorf("digest of the snapshot file: %w", err)
	}
	md[snapshotSHAKey] = sum
	m := manifest{name: name, digest: sum, seq: md[snapshotSeqKey], created: md[snapshotCreatedKey]}
	md[snapshotSigKey] = s.SignBytes(m.payload(s.PublicKey()))
	return nil
}

func fileSHA256(r io.Reader) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, r); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// checkDownload checks that the file at path, a download of info, has the
// digest its signed manifest names.
func checkDownload(path string, info SnapshotInfo) error {
	f, err := os.Open(path)
	if err != nil {
		return err
	}
	defer f.Close()
	sum, err := fileSHA256(f)
	if err != nil {
		return fmt.Errorf("digest of snapshot %s: %w", info.Name, err)
	}
	if sum != info.manifest.digest {
		return fmt.Errorf("snapshot %s: the content does not have the signed digest", info.Name)
	}
	return nil
}

// verifySnapshot checks the signature of a listed snapshot.
func verifySnapshot(v *signing.Verifier, info SnapshotInfo) error {
	return v.VerifyBytes(info.signature, info.manifest.payload)
}
