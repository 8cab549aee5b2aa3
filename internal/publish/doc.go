// Package publish turns committed events into JetStream messages: it runs
// an embedded NATS server or connects to one, provisions the stream, encodes
// events as CloudEvents and relays the outbox with at-least-once delivery and
// per-resource order.
//
// Its main types: Conn (the NATS connection with JetStream, and the
// embedded server when there is one), Relay (drains the outbox to the
// stream, with its checkpoints and the KV buckets), Format and CloudEvent
// (the wire format of the events), KV (the state buckets), Auditor
// (compares the stream with the mirror's event log and republishes what
// the stream lost) and Checkpoint (a checkpoint message's body).
package publish
