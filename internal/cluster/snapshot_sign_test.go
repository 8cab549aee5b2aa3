package cluster

import (
	"maps"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/signing"
)

// TestSignManifest_CoversTheStream: a snapshot's signatures cover the
// stream its sequence counts (stream_created): changed or removed, they
// no longer verify, so that a snapshot of a stream since lost cannot be
// passed off as one of the current stream (its sequence taken for a place
// in it). A snapshot of an older syncd, which records no stream, verifies
// as it did.
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
	verify := func(md map[string]string) error {
		oi := &jetstream.ObjectInfo{ObjectMeta: jetstream.ObjectMeta{Name: name, Metadata: md}}
		info := SnapshotInfo{Name: name, manifest: manifestOf(oi), signature: md[snapshotSigKey],
			objectSignature: md[snapshotObjectSigKey]}
		_, err := verifySnapshot(v, info)
		return err
	}
	base := map[string]string{snapshotSeqKey: "42", snapshotCreatedKey: "2026-03-01T10:00:00Z", snapshotRawKey: "4096"}
	withStream := maps.Clone(base)
	withStream[snapshotStreamKey] = "2026-02-01T09:00:00.123456789Z"

	md := signed(withStream)
	if err := verify(md); err != nil {
		t.Fatalf("a signed snapshot with its stream: %v", err)
	}
	for _, change := range []func(map[string]string){
		func(m map[string]string) { delete(m, snapshotStreamKey) },
		func(m map[string]string) { m[snapshotStreamKey] = "2026-02-02T09:00:00Z" },
	} {
		forged := maps.Clone(md)
		change(forged)
		// Both signatures must fail: the object's, and the file's it falls
		// back to.
		if err := verify(forged); err == nil {
			t.Errorf("stream_created %q: verified, want refused", forged[snapshotStreamKey])
		}
	}
	if err := verify(signed(base)); err != nil {
		t.Errorf("a snapshot that records no stream (an older syncd's): %v", err)
	}
}
