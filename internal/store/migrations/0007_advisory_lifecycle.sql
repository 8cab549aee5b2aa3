-- Schema version 7: advisories as the platform serves them.
--
-- An advisory's scalar fields become columns, and its lists tables: the
-- CVE and GHSA ids it covers (advisory_aliases), their CVSS severities
-- (advisory_severities) and its lifecycle (advisory_events, one row per
-- step, with the step's kind and its fields).
--
-- The rows of older versions lack all of it. complete is 0 for them, and
-- the next advisories listing rewrites every such row whatever its
-- updateTime, without announcing as news what it finds in it (it has no
-- earlier lifecycle to compare with): syncd needs no full re-crawl, but
-- until that listing the new columns and tables are empty for those rows.
ALTER TABLE advisories ADD COLUMN author TEXT NOT NULL DEFAULT '';
ALTER TABLE advisories ADD COLUMN artifact_type TEXT NOT NULL DEFAULT '';
ALTER TABLE advisories ADD COLUMN artifact_architecture TEXT NOT NULL DEFAULT '';
ALTER TABLE advisories ADD COLUMN component_name TEXT NOT NULL DEFAULT '';
ALTER TABLE advisories ADD COLUMN component_location TEXT NOT NULL DEFAULT '';
ALTER TABLE advisories ADD COLUMN component_type TEXT NOT NULL DEFAULT '';
ALTER TABLE advisories ADD COLUMN legacy_advisory_id TEXT;
ALTER TABLE advisories ADD COLUMN complete INTEGER NOT NULL DEFAULT 0;
CREATE INDEX advisories_component ON advisories(component_name);

CREATE TABLE advisory_aliases (
    advisory_uid TEXT NOT NULL REFERENCES advisories(uid),
    seq          INTEGER NOT NULL, -- position in the advisory's list
    alias        TEXT NOT NULL,
    PRIMARY KEY (advisory_uid, seq)
);
CREATE INDEX advisory_aliases_alias ON advisory_aliases(alias);

CREATE TABLE advisory_severities (
    advisory_uid TEXT NOT NULL REFERENCES advisories(uid),
    seq          INTEGER NOT NULL,
    type         TEXT NOT NULL, -- TYPE_CVSS_V2, TYPE_CVSS_V3, TYPE_CVSS_V4, as sent
    score        TEXT NOT NULL, -- a CVSS vector or a number, as sent
    base_score   REAL,          -- computed by syncd; NULL when it cannot be
    rating       TEXT,          -- critical, high, medium, low or none; NULL with base_score
    PRIMARY KEY (advisory_uid, seq)
);

CREATE TABLE advisory_events (
    advisory_uid        TEXT NOT NULL REFERENCES advisories(uid),
    seq                 INTEGER NOT NULL, -- position in the advisory's lifecycle, oldest first
    uid                 TEXT NOT NULL,
    type                TEXT NOT NULL,    -- detected, fixed, false_positive, ...
    create_time         TEXT,
    author              TEXT NOT NULL DEFAULT '',
    reviewer            TEXT NOT NULL DEFAULT '',
    review_state        TEXT NOT NULL DEFAULT '',
    issue               TEXT,
    note                TEXT NOT NULL DEFAULT '',
    fixed_version       TEXT,
    patched_versions    TEXT,             -- JSON array of strings
    false_positive_type TEXT,
    detection_type      TEXT,
    findings            TEXT,
    details             TEXT,             -- the kind's own object, as sent
    PRIMARY KEY (advisory_uid, seq)
);
CREATE INDEX advisory_events_time ON advisory_events(create_time);
CREATE INDEX advisory_events_type ON advisory_events(type, create_time);

-- The state of each advisory: its latest event that counts (approved, or
-- without a review state), as the platform's latest_event_type filter
-- reads it, and its latest event whatever its review.
CREATE VIEW advisory_states AS
SELECT a.uid, a.advisory_id, a.artifact_name, a.artifact_type, a.artifact_architecture, a.component_name,
       (SELECT group_concat(alias, ' ') FROM (SELECT x.alias FROM advisory_aliases x WHERE x.advisory_uid = a.uid ORDER BY x.seq)) AS aliases,
       s.type AS state, s.create_time AS state_time, s.fixed_version, s.note AS state_note,
       l.type AS latest_event, l.review_state AS latest_review_state, l.create_time AS latest_event_time,
       a.deleted_time
FROM advisories a
LEFT JOIN advisory_events s ON s.rowid = (
    SELECT e.rowid FROM advisory_events e
    WHERE e.advisory_uid = a.uid AND e.review_state IN ('REVIEW_STATE_APPROVED', 'REVIEW_STATE_UNSPECIFIED', '')
    ORDER BY e.create_time DESC, e.seq DESC LIMIT 1)
LEFT JOIN advisory_events l ON l.rowid = (
    SELECT e.rowid FROM advisory_events e WHERE e.advisory_uid = a.uid
    ORDER BY e.create_time DESC, e.seq DESC LIMIT 1);

-- CVE and GHSA ids to the advisories that cover them.
CREATE VIEW advisories_by_alias AS
SELECT al.alias, st.artifact_name, st.advisory_id, st.uid AS advisory_uid, st.component_name,
       st.state, st.fixed_version, st.deleted_time
FROM advisory_aliases al JOIN advisory_states st ON st.uid = al.advisory_uid;

-- Where each alias is fixed: one row per alias of each standing advisory
-- whose state is fixed.
CREATE VIEW fixed_versions AS
SELECT st.artifact_name, al.alias, st.fixed_version, st.state_time AS fixed_time,
       st.advisory_id, st.uid AS advisory_uid, st.component_name
FROM advisory_states st JOIN advisory_aliases al ON al.advisory_uid = st.uid
WHERE st.state = 'fixed' AND st.deleted_time IS NULL;

-- Standing advisories not resolved (neither fixed, patched nor a false
-- positive), with the severity of their newest CVSS version syncd scores.
CREATE VIEW open_advisories AS
SELECT st.uid, st.advisory_id, st.artifact_name, st.component_name, st.aliases, st.state, st.state_time,
       sev.rating, sev.base_score, sev.type AS severity_type, sev.score AS severity_score
FROM advisory_states st
LEFT JOIN advisory_severities sev ON sev.rowid = (
    SELECT x.rowid FROM advisory_severities x
    WHERE x.advisory_uid = st.uid AND x.base_score IS NOT NULL
    ORDER BY x.type DESC, x.seq LIMIT 1)
WHERE st.deleted_time IS NULL AND (st.state IS NULL OR st.state NOT IN ('fixed', 'patched', 'false_positive'));

-- Every lifecycle step with its advisory, for questions over a time range.
CREATE VIEW advisory_lifecycle AS
SELECT e.create_time AS event_time, a.artifact_name, a.advisory_id, e.type, e.fixed_version, e.review_state,
       e.author, e.note,
       (SELECT group_concat(alias, ' ') FROM (SELECT x.alias FROM advisory_aliases x WHERE x.advisory_uid = a.uid ORDER BY x.seq)) AS aliases,
       e.advisory_uid, e.uid AS event_uid, e.seq
FROM advisory_events e JOIN advisories a ON a.uid = e.advisory_uid;
