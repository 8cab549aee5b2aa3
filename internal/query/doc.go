// Package query is the query service every replica runs (leader, standby
// and follower): a NATS micro service ("nats micro ls" lists it) whose
// endpoints answer from the replica's own mirror what the stream and the
// KV buckets do not: what a tag pointed at, at any instant; where a digest
// has been; a repo's tags; advisories by artifact, alias or component; and
// where the replica stands. Replicas share one queue group, so each request
// goes to one of them, and every answer carries the stream sequence it was
// read at. A request may ask for a sequence (min_seq); the replica waits a
// bounded time for its mirror to reach it.
//
// Requests are taken from NATS by micro's subscriptions and answered by a
// fixed number of workers; a request beyond [query] max_pending is refused
// at once (503 busy), so that a flood is answered or refused, never left
// to time out unanswered.
//
// Its main types: Service (answers from a Mirror, configured by Config),
// Client (asks the service over NATS), Position (the stream sequence the
// mirror has applied) and, per endpoint, a Request and a Reply type
// (TagAtRequest and TagAtReply, and so on), each reply with a Stamp.
package query
