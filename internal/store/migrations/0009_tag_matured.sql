-- Schema version 9: tags that mature ([maturity] after).
--
-- For each tag and age, the digest that matured last (the history record
-- the tag pointed to that long ago), as the tag.matured
-- event that set it announced it. The leader writes a row with its event;
-- a follower writes the same row from the event. No foreign key: a
-- follower may apply a tag.matured before the tag's own event.
CREATE TABLE tag_matured (
    tag_uid      TEXT NOT NULL,
    age          TEXT NOT NULL,    -- the age's name: 72h, 90m, 5s
    seq          INTEGER NOT NULL, -- the record's position in tag_history
    update_time  TEXT NOT NULL,    -- the record's time: when the tag moved to digest
    digest       TEXT NOT NULL,
    matured_time TEXT NOT NULL,    -- update_time + age
    event_id     TEXT NOT NULL,    -- the tag.matured event that set this row
    PRIMARY KEY (tag_uid, age)
) WITHOUT ROWID;
