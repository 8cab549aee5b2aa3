package cluster

import (
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/signing"
)

// A snapshot's manifest is signed like the stream's messages: the leader
// signs the object's name, the SHA-256 of the database file it holds
// (before compression), and its stream_seq, stream_created and created
// metadata, and
// stores the digest and the signature as metadata beside them, in the one
// Put. A follower with verify keys restores only a snapshot whose manifest
// verifies and whose downloaded file has the signed digest: a planted
// object, or a genuine one whose content, sequence or time was changed, is
// not restored.
//
// A second manifest names the compressed object's digest instead, in the
// object store's own form (ObjectInfo.Digest), which the object store's
// client checks against what it reads as it reads it: a follower that
// verifies it need not hash the file it decompresses (hashed, a third of
// the time a restore of the benchmark's mirror took beyond its download).
// A snapshot of an older leader has only the first, and is checked by it.

// Object metadata keys of a snapshot's digests and signatures.
const (
	snapshotSHAKey       = "raw_sha256"
	snapshotSigKey       = "signature"
	snapshotObjectKey    = "object_digest"
	snapshotObjectSigKey = "object_signature"
)

// manifest is what a snapshot's signatures cover, as stored: digest is
// the file's, object the compressed object's, raw the file's size.
type manifest struct {
	name, digest, object, seq, stream, created, raw string
}

func manifestOf(oi *jetstream.ObjectInfo) manifest {
	return manifest{
		name:    oi.Name,
		digest:  oi.Metadata[snapshotSHAKey],
		object:  oi.Metadata[snapshotObjectKey],
		seq:     oi.Metadata[snapshotSeqKey],
		stream:  oi.Metadata[snapshotStreamKey],
		created: oi.Metadata[snapshotCreatedKey],
		raw:     oi.Metadata[snapshotRawKey],
	}
}

// payload is the byte string signed for key: the manifest of the file.
func (m manifest) payload(key string) []byte {
	return signing.Payload(key, "snapshot "+m.name, m.digest, []byte(m.place()+" "+m.created))
}

// objectPayload is the byte string signed for key: the manifest of the
// compressed object, with the size of the file it decompresses to.
func (m manifest) objectPayload(key string) []byte {
	return signing.Payload(key, "snapshot object "+m.name, m.object, []byte(m.place()+" "+m.created+" "+m.raw))
}

// place is the stream sequence as signed, with the stream's creation time
// when the snapshot records it: a snapshot of an older syncd, which has
// none, verifies as it did, and one whose stream_created was removed does
// not.
func (m manifest) place() string {
	if m.stream == "" {
		return m.seq
	}
	return m.seq + "@" + m.stream
}

// signManifest adds the digests of the snapshot object name about to be
// written, its file's raw and its compressed object's (the object store's
// form), and the signatures of both manifests to md, its metadata.
func signManifest(name string, md map[string]string, raw, object string, s *signing.Signer) {
	md[snapshotSHAKey], md[snapshotObjectKey] = raw, object
	m := manifestOf(&jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: name, Metadata: md}})
	md[snapshotSigKey] = s.SignBytes(m.payload(s.PublicKey()))
	md[snapshotObjectSigKey] = s.SignBytes(m.objectPayload(s.PublicKey()))
}

// verifySnapshot checks the signatures of a listed snapshot: object says
// that of the compressed object's manifest verified (restoreOne checks
// the object's digest then), otherwise that of the file's did.
func verifySnapshot(v *signing.Verifier, info SnapshotInfo) (object bool, _ error) {
	if info.objectSignature != "" && v.VerifyBytes(info.objectSignature, info.manifest.objectPayload) == nil {
		return true, nil
	}
	return false, v.VerifyBytes(info.signature, info.manifest.payload)
}
