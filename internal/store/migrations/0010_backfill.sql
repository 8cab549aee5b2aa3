-- Schema version 10: the history backfill.
--
-- The first complete listing ends the baseline: from then on the mirror
-- holds the current state of every repo, tag and advisory. The tags' digest
-- histories are read after it, in the backfill, and this table is what is
-- left of it: one row per live tag whose history the backfill has yet to
-- read. A restart goes on from it; a tag leaves it when its history is read.
CREATE TABLE backfill (
    tag_uid     TEXT PRIMARY KEY,
    -- The tag's update time as the first complete listing showed it: the
    -- records up to it are the silent baseline, those after it moves.
    listed_time TEXT,
    -- 1 once a later listing showed the tag changed: read before the others.
    moved       INTEGER NOT NULL DEFAULT 0
) WITHOUT ROWID;

-- The backfill's order: moved tags first, then the newest update first.
CREATE INDEX backfill_order ON backfill(moved DESC, listed_time DESC, tag_uid);
