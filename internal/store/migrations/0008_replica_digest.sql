-- Schema version 8: the replica digest.
--
-- For each table of the replicated state, the sum modulo 2^64 of a hash of
-- every row's replicated columns, and the row count (internal/store/digest.go).
-- Triggers, created when the store opens (they call functions syncd
-- registers with its SQLite driver), keep it in the transaction that writes
-- the rows, so a replica reads its digest without a scan.
CREATE TABLE replica_digest (
    name TEXT PRIMARY KEY,   -- the table
    sum  INTEGER NOT NULL,   -- wrapping sum of the rows' hashes
    rows INTEGER NOT NULL
) WITHOUT ROWID;
