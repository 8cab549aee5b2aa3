-- Schema version 5: the outbox and the publication times leave the event rows.
--
-- Marking an event published used to rewrite its row in events, data and
-- all, so relaying a burst of events wrote every one of their pages to the
-- WAL a second time, which cost the relay most of its rate. Now the change
-- log is event_log, written once; outbox holds the seqs JetStream has not
-- yet acknowledged (a row per event, a few bytes each); and event_publishes
-- records, for each run of consecutive seqs marked in one transaction, when
-- JetStream acknowledged them. The events view puts the three together with
-- the columns events always had, published_time included.
DROP INDEX events_unpublished;
ALTER TABLE events RENAME TO event_log;

CREATE TABLE outbox (
    seq INTEGER PRIMARY KEY -- an event_log seq not yet acknowledged by JetStream
);
INSERT INTO outbox (seq) SELECT seq FROM event_log WHERE published_time IS NULL;

CREATE TABLE event_publishes (
    first_seq      INTEGER PRIMARY KEY, -- the run of event_log seqs first_seq..last_seq
    last_seq       INTEGER NOT NULL,
    published_time TEXT NOT NULL        -- when JetStream acknowledged them
);
INSERT INTO event_publishes (first_seq, last_seq, published_time)
    SELECT seq, seq, published_time FROM event_log WHERE published_time IS NOT NULL;

ALTER TABLE event_log DROP COLUMN published_time;

-- Every event enters the outbox with the transaction that records it.
CREATE TRIGGER event_log_outbox AFTER INSERT ON event_log
BEGIN
    INSERT INTO outbox (seq) VALUES (new.seq);
END;

CREATE VIEW events AS
SELECT l.seq, l.id, l.type, l.resource, l.action, l.scope, l.subject, l.time, l.data, l.created_time,
       (SELECT CASE WHEN p.last_seq >= l.seq THEN p.published_time END
        FROM event_publishes p WHERE p.first_seq <= l.seq
        ORDER BY p.first_seq DESC LIMIT 1) AS published_time
FROM event_log l;
