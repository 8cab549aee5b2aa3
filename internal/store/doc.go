// Package store owns syncd's SQLite mirror: the schema and its migrations,
// upserts with change detection, and the change log (event_log, read by
// analysts through the events view) with the outbox the publisher drains.
//
// One writer connection takes every write, in transactions that begin
// IMMEDIATE, so ingest never meets SQLITE_BUSY from itself; a separate pool
// of read-only connections serves queries, and WAL mode keeps readers and the
// writer out of each other's way.
//
// Its main types: Store (opened by Open, or OpenReadOnly beside the
// writer), the rows it keeps (Repo, Tag, TagRef with its Bookmark,
// HistoryRecord, Advisory), Event (a row of the change log) and
// StreamEvent (an event as a follower applies it), ReplicaDigest (what
// replicas compare) and Lock (one process's hold on a mirror).
package store
