package cluster

import (
	"maps"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/signing"
)

// TestSignManifest_CoversTheStream: a snapshot's stream (stream_created)
// is signed: changed, or its signature removed, the snapshot does not
// verify, so that a snapshot of a stream since lost cannot be passed off
// as one of the current stream (its sequence taken for a place in it).
// Removed with its signature, the snapshot verifies as an older syncd's,
// which the restore takes for the current stream's only if it is newer
// than the stream (SnapshotInfo.after). The first two signatures are
// what they were, so that a follower of the version before verifies a new
// leader's snapshots; and an older syncd's snapshot verifies as it did.
func TestSignManifest_CoversTheStream(t *testing.T) {
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	key, err := signing.ParseSigner(seed)
	if err != nil {
		t.Fatal(err)
	}
	v, err := signing.NewVerifier([]string{key.PublicKey()})
	if err != nil {
		t.Fatal(err)
	}
	const name = snapshotPrefix + "20260301T100000.000Z"
	signed := func(md map[string]string) map[string]string {
		md = maps.Clone(md)
		signManifest(name, md, "rawdigest", "SHA-256=objectdigest", key)
		return md
	}
	info := func(md map[string]string) SnapshotInfo {
		oi := &jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: name, Metadata: md}}
		return SnapshotInfo{Name: name, manifest: manifestOf(oi), signature: md[snapshotSigKey],
			objectSignature: md[snapshotObjectSigKey], streamSignature: md[snapshotStreamSigKey]}
	}
	verify := func(md map[string]string) error {
		_, err := verifySnapshot(v, info(md))
		return err
	}
	base := map[string]string{snapshotSeqKey: "42", snapshotCreatedKey: "2026-03-01T10:00:00Z", snapshotRawKey: "4096"}
	withStream := maps.Clone(base)
	withStream[snapshotStreamKey] = "2026-02-01T09:00:00.123456789Z"

	md := signed(withStream)
	if err := verify(md); err != nil {
		t.Fatalf("a signed snapshot with its stream: %v", err)
	}
	for what, change := range map[string]func(map[string]string){
		"another stream":               func(m map[string]string) { m[snapshotStreamKey] = "2026-02-02T09:00:00Z" },
		"its signature removed":        func(m map[string]string) { delete(m, snapshotStreamSigKey) },
		"another snapshot's signature": func(m map[string]string) { m[snapshotStreamSigKey] = m[snapshotSigKey] },
	} {
		forged := maps.Clone(md)
		change(forged)
		if err := verify(forged); err == nil {
			t.Errorf("stream_created with %s: verified, want refused", what)
		}
	}
	stripped := maps.Clone(md)
	delete(stripped, snapshotStreamKey)
	delete(stripped, snapshotStreamSigKey)
	if err := verify(stripped); err != nil {
		t.Errorf("stream_created removed with its signature: %v; want it verified as an older syncd's", err)
	}
	// A follower of the version before knows no stream_created: the file's
	// and the object's manifests verify without it.
	old := info(md)
	old.manifest.stream = ""
	if object, err := verifySnapshot(v, old); err != nil || !object {
		t.Errorf("a new snapshot as the version before verifies it: object %v, %v; want the object's manifest", object, err)
	}
	old.objectSignature = ""
	if _, err := verifySnapshot(v, old); err != nil {
		t.Errorf("a new snapshot's file manifest as the version before verifies it: %v", err)
	}
	if err := verify(signed(base)); err != nil {
		t.Errorf("a snapshot that records no stream (an older syncd's): %v", err)
	}
}
