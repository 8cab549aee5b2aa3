-- Schema version 2: what tombstones and advisories need.
--
-- deletions counts how often a resource was deleted upstream. It goes into
-- the ids of deletion and revival events, so that a resource deleted, revived
-- and deleted again gets a new event each time while the same deletion seen
-- twice (a retried transaction, a failover) keeps one id.

ALTER TABLE repos ADD COLUMN deletions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tags ADD COLUMN deletions INTEGER NOT NULL DEFAULT 0;
ALTER TABLE advisories ADD COLUMN deletions INTEGER NOT NULL DEFAULT 0;

-- Upstream advisories carry createTime like every v2 resource.
ALTER TABLE advisories ADD COLUMN create_time TEXT;

-- A deletion sweep lists the live tags of one repo.
CREATE INDEX tags_repo_live ON tags(repo_uid, uid) WHERE deleted_time IS NULL;

-- events(type, time) made every event of a history page an insert at a
-- random place in that index (history times interleave across tags), which
-- cost ingest a third of its speed. Time-range questions about moves are
-- answered by tag_history's time index (the tag_moves view), and the events
-- table is pruned to its retention, so this index only has to list a type's
-- events in commit order, which only ever appends.
DROP INDEX events_type_time;
CREATE INDEX events_type_seq ON events(type, seq);
