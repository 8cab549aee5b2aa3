-- Schema version 1: the mirror, the outbox and crawl bookkeeping.
-- Timestamps are ISO 8601 UTC text with milliseconds ("2026-01-02T03:04:05.678Z").

CREATE TABLE meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE repos (
    id              INTEGER PRIMARY KEY,
    uid             TEXT NOT NULL UNIQUE,
    name            TEXT NOT NULL,
    description     TEXT NOT NULL DEFAULT '',
    catalog_tier    TEXT NOT NULL DEFAULT '',
    aliases         TEXT NOT NULL DEFAULT '[]', -- JSON array of strings
    active_tags     TEXT NOT NULL DEFAULT '[]', -- JSON array of strings
    bundles         TEXT NOT NULL DEFAULT '[]', -- JSON array of strings
    create_time     TEXT,
    update_time     TEXT,
    first_seen_time TEXT NOT NULL,
    deleted_time    TEXT
);
CREATE INDEX repos_name ON repos(name);

CREATE TABLE tags (
    id              INTEGER PRIMARY KEY,
    uid             TEXT NOT NULL UNIQUE,
    repo_uid        TEXT NOT NULL REFERENCES repos(uid),
    name            TEXT NOT NULL,
    digest          TEXT NOT NULL DEFAULT '',
    deprecated      INTEGER NOT NULL DEFAULT 0,
    bundles         TEXT NOT NULL DEFAULT '[]',
    create_time     TEXT,
    update_time     TEXT,
    first_seen_time TEXT NOT NULL,
    deleted_time    TEXT,
    -- Bookmark of the tag history walk: the tag's updateTime when its history
    -- was last read completely, the newest record's time, and how many records
    -- share that time (so an overlapping window can skip them).
    history_update_time TEXT,
    history_last_time   TEXT,
    history_last_count  INTEGER NOT NULL DEFAULT 0,
    history_last_digest TEXT NOT NULL DEFAULT '',
    history_count       INTEGER NOT NULL DEFAULT 0,
    -- 1 when the tag was first seen by the baseline crawl, whose history
    -- is taken as the starting point rather than as news.
    baseline        INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX tags_repo ON tags(repo_uid, name);
CREATE INDEX tags_digest ON tags(digest);

CREATE TABLE tag_history (
    id          INTEGER PRIMARY KEY,
    tag_uid     TEXT NOT NULL REFERENCES tags(uid),
    seq         INTEGER NOT NULL, -- 0 for the oldest record of the tag
    update_time TEXT NOT NULL,
    digest      TEXT NOT NULL,
    UNIQUE (tag_uid, seq)
);
CREATE INDEX tag_history_time ON tag_history(update_time);
CREATE INDEX tag_history_digest ON tag_history(digest);

CREATE TABLE advisories (
    id              INTEGER PRIMARY KEY,
    uid             TEXT NOT NULL UNIQUE,
    advisory_id     TEXT NOT NULL,
    artifact_name   TEXT NOT NULL,
    update_time     TEXT,
    first_seen_time TEXT NOT NULL,
    deleted_time    TEXT
);
CREATE INDEX advisories_artifact ON advisories(artifact_name);
CREATE INDEX advisories_advisory_id ON advisories(advisory_id);

CREATE TABLE subscriptions (
    uid          TEXT PRIMARY KEY,
    group_uid    TEXT NOT NULL,
    sink         TEXT NOT NULL,
    create_time  TEXT,
    synced_time  TEXT NOT NULL,
    deleted_time TEXT
);

-- The outbox and the change log in one: every change the mirror saw, in
-- commit order (seq). published_time is NULL until JetStream acknowledged it.
CREATE TABLE events (
    seq            INTEGER PRIMARY KEY AUTOINCREMENT,
    id             TEXT NOT NULL UNIQUE, -- deterministic: the same change has the same id
    type           TEXT NOT NULL,        -- <resource>.<action>, e.g. tag.moved
    resource       TEXT NOT NULL,        -- repo, tag, advisory
    action         TEXT NOT NULL,
    scope          TEXT NOT NULL,        -- repo name (advisories: artifact name), unescaped
    subject        TEXT NOT NULL,        -- uid of the resource
    time           TEXT NOT NULL,        -- when the change happened upstream
    data           TEXT NOT NULL,        -- JSON {"before": …, "after": …}
    created_time   TEXT NOT NULL,        -- when syncd recorded it
    published_time TEXT
);
CREATE INDEX events_unpublished ON events(seq) WHERE published_time IS NULL;
CREATE INDEX events_type_time ON events(type, time);
CREATE INDEX events_subject ON events(subject, seq);

CREATE TABLE crawl_runs (
    id            INTEGER PRIMARY KEY,
    job           TEXT NOT NULL,
    started_time  TEXT NOT NULL,
    finished_time TEXT,
    outcome       TEXT NOT NULL DEFAULT 'running', -- running, ok, failed, canceled
    requests      INTEGER NOT NULL DEFAULT 0,
    changes       INTEGER NOT NULL DEFAULT 0,
    error         TEXT
);
CREATE INDEX crawl_runs_job ON crawl_runs(job, started_time);

-- Views for the questions analysts ask most.
CREATE VIEW current_tags AS
SELECT r.name AS repo, t.name AS tag, t.digest, t.deprecated, t.update_time, t.uid AS tag_uid, r.uid AS repo_uid
FROM tags t JOIN repos r ON r.uid = t.repo_uid
WHERE t.deleted_time IS NULL AND r.deleted_time IS NULL;

CREATE VIEW tag_moves AS
SELECT r.name AS repo, t.name AS tag, h.update_time AS moved_time,
       (SELECT p.digest FROM tag_history p WHERE p.tag_uid = h.tag_uid AND p.seq = h.seq - 1) AS before_digest,
       h.digest AS after_digest, h.tag_uid
FROM tag_history h JOIN tags t ON t.uid = h.tag_uid JOIN repos r ON r.uid = t.repo_uid
WHERE h.seq > 0;

CREATE VIEW deprecated_tags AS
SELECT r.name AS repo, t.name AS tag, t.digest, t.update_time
FROM tags t JOIN repos r ON r.uid = t.repo_uid
WHERE t.deprecated = 1 AND t.deleted_time IS NULL;
