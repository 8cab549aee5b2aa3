// Package testutil is what syncd's tests share: waiting for a condition by
// polling it, loopback listeners on :0, and the platform simulator served
// over HTTP. Tests only import it.
//
// Its main types: NATSServer and NATSCluster (embedded NATS servers with
// JetStream on loopback ports, which a test can stop and start), Clock (a
// clock moved by hand) and Buffer (a log sink safe for concurrent use);
// MirrorState, SameState and SameMirror compare a follower's mirror with
// its leader's.
package testutil
