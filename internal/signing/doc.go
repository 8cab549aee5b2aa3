// Package signing makes what the syncd leader writes on NATS verifiable:
// the leader signs each message it puts on the stream with an Ed25519 key
// (an nkey), and followers, standbys and the leader's own readers accept
// only messages signed by a key they were told to trust. Anyone with
// publish permission on the account can write to the stream's subjects;
// only the holder of the signing key can write there what syncd applies.
//
// It also derives the Nats-Msg-Id under which the leader publishes an
// event from a secret only the signing key's holder knows, so that an
// outsider who can compute an event's (deterministic) id cannot publish a
// message under the Nats-Msg-Id the leader will use and have JetStream
// drop the leader's real event as a duplicate.
package signing
