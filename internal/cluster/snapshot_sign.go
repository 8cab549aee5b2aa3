package cluster

import (
	"fmt"

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
//
// A second manifest names the compressed object's digest instead, in the
// object store's own form (ObjectInfo.Digest), which the object store's
// client checks against what it reads as it reads it: a follower that
// verifies it need not hash the file it decompresses (hashed, a third of
// the time a restore of the benchmark's mirror took beyond its download).
// A snapshot of an older leader has only the first, and is checked by it.
//
// A third signature, stream_signature, covers the stream the sequence
// counts (stream_created, with the name, the file's digest, stream_seq and
// created): kept apart, the first two stay what an older follower
// verifies, so that a leader upgraded first still has its snapshots
// restored by the followers not upgraded yet. A follower that verifies
// refuses a snapshot whose stream_created has no valid signature; one
// without stream_created is taken for an older syncd's (SnapshotInfo.after).

// Object metadata keys of a snapshot's digests and signatures.
const (
	snapshotSHAKey       = "raw_sha256"
	snapshotSigKey       = "signature"
	snapshotObjectKey    = "object_digest"
	snapshotObjectSigKey = "object_signature"
	snapshotStreamSigKey = "stream_signature"
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
	return signing.Payload(key, "snapshot "+m.name, m.digest, []byte(m.seq+" "+m.created))
}

// objectPayload is the byte string signed for key: the manifest of the
// compressed object, with the size of the file it decompresses to.
func (m manifest) objectPayload(key string) []byte {
	return signing.Payload(key, "snapshot object "+m.name, m.object, []byte(m.seq+" "+m.created+" "+m.raw))
}

// streamPayload is the byte string signed for key: the stream the
// snapshot's sequence counts.
func (m manifest) streamPayload(key string) []byte {
	return signing.Payload(key, "snapshot stream "+m.name, m.digest, []byte(m.seq+"@"+m.stream+" "+m.created))
}

// signManifest adds the digests of the snapshot object name about to be
// written, its file's raw and its compressed object's (the object store's
// form), and the signatures of both manifests to md, its metadata.
func signManifest(name string, md map[string]string, raw, object string, s *signing.Signer) {
	md[snapshotSHAKey], md[snapshotObjectKey] = raw, object
	m := manifestOf(&jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: name, Metadata: md}})
	md[snapshotSigKey] = s.SignBytes(m.payload(s.PublicKey()))
	md[snapshotObjectSigKey] = s.SignBytes(m.objectPayload(s.PublicKey()))
	if m.stream != "" {
		md[snapshotStreamSigKey] = s.SignBytes(m.streamPayload(s.PublicKey()))
	}
}

// verifySnapshot checks the signatures of a listed snapshot: object says
// that of the compressed object's manifest verified (restoreOne checks
// the object's digest then), otherwise that of the file's did.
// It refuses a stream_created without its own signature verified, once a
// manifest did.
func verifySnapshot(v *signing.Verifier, info SnapshotInfo) (object bool, err error) {
	if info.objectSignature != "" && v.VerifyBytes(info.objectSignature, info.manifest.objectPayload) == nil {
		object = true
	} else if err := v.VerifyBytes(info.signature, info.manifest.payload); err != nil {
		return false, err
	}
	if info.manifest.stream != "" {
		if err := v.VerifyBytes(info.streamSignature, info.manifest.streamPayload); err != nil {
			return false, fmt.Errorf("stream_created: %w", err)
		}
	}
	return object, nil
}
