// Package cluster lets several syncd replicas share one upstream: a leader
// lease in a NATS KV bucket elects the one replica that crawls and
// publishes, and a follower applies the event stream to a replica's own
// mirror, so that standbys take over warm and analysts anywhere get a
// mirror without touching the upstream. The leader's duties and their
// shutdown (lead.go) are the same with one replica: "syncd run" without
// cluster mode runs them directly.
//
// Its main types: Lease (the leader lease in a KV bucket), Replica (one
// "syncd run" replica in cluster mode: standby, then leader while it holds
// the lease), Duties (what a leader runs, and their shutdown), Follower
// (applies the stream to a mirror and compares it with the leader's
// checkpoints) and Snapshotter (writes snapshots of the mirror to a
// JetStream object store, which a follower restores from).
package cluster
