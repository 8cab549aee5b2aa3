package cluster

import (
	"context"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/signing"
)

// A snapshot's manifest is signed like the stream's messages: the leader
// signs the object's name, its digest (the SHA-256 of its content, which
// the object store checks when the object is read), and its stream_seq and
// created metadata, and stores the signature as metadata beside them. A
// follower with verify keys restores only a snapshot whose manifest
// verifies: a planted object, or a genuine one whose sequence or time was
// changed, is passed over.

// snapshotSigKey is the object metadata key of a snapshot's signature.
const snapshotSigKey = "signature"

// manifest is what a snapshot's signature covers, as stored.
type manifest struct {
	name, digest, seq, created string
}

func manifestOf(oi *jetstream.ObjectInfo) manifest {
	return manifest{name: oi.Name, digest: oi.Digest, seq: oi.Metadata[snapshotSeqKey], created: oi.Metadata[snapshotCreatedKey]}
}

// payload is the byte string signed for key.
func (m manifest) payload(key string) []byte {
	return signing.Payload(key, "snapshot "+m.name, m.digest, []byte(m.seq+" "+m.created))
}

// signSnapshot adds the signature of the object oi, just written, to its
// metadata: its digest is known only once it is written.
func signSnapshot(ctx context.Context, obj jetstream.ObjectStore, oi *jetstream.ObjectInfo, s *signing.Signer) error {
	meta := oi.ObjectMeta
	md := make(map[string]string, len(meta.Metadata)+1)
	for k, v := range meta.Metadata {
		md[k] = v
	}
	md[snapshotSigKey] = s.SignBytes(manifestOf(oi).payload(s.PublicKey()))
	meta.Metadata = md
	if err := obj.UpdateMeta(ctx, oi.Name, meta); err != nil {
		return fmt.Errorf("sign snapshot %s: %w", oi.Name, err)
	}
	return nil
}

// verifySnapshot checks the signature of a listed snapshot.
func verifySnapshot(v *signing.Verifier, info SnapshotInfo) error {
	return v.VerifyBytes(info.signature, info.manifest.payload)
}

// newestVerified is the newest snapshot of obj whose manifest v verifies
// (any, without v); reject is told of each newer one passed over.
func newestVerified(ctx context.Context, obj jetstream.ObjectStore, v *signing.Verifier, reject func(SnapshotInfo, error)) (SnapshotInfo, bool, error) {
	if v == nil {
		return newestSnapshot(ctx, obj)
	}
	all, err := listSnapshots(ctx, obj)
	if err != nil {
		return SnapshotInfo{}, false, err
	}
	for _, info := range all {
		if err := verifySnapshot(v, info); err != nil {
			reject(info, err)
			continue
		}
		return info, true, nil
	}
	return SnapshotInfo{}, false, nil
}
