-- Schema version 4: the ids of pushed events syncd accepted, so that a
-- redelivery after a restart is recognised. Old rows are pruned.
CREATE TABLE webhook_deliveries (
    ce_id         TEXT PRIMARY KEY,
    received_time TEXT NOT NULL
);
CREATE INDEX webhook_deliveries_time ON webhook_deliveries(received_time);
