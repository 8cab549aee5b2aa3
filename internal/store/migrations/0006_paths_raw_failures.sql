-- Schema version 6: what the real platform needs beyond its spec.
--
-- Nested repos. A repo can sit below subgroups, and its registry path (what
-- image references, history requests and registry token scopes use) is the
-- chain of names of its uid's segments below the organization, for example
-- charts/cert-manager. For a repo directly under the root group it is the
-- repo's name, which is what every repo mirrored before this version was.
ALTER TABLE repos ADD COLUMN path TEXT NOT NULL DEFAULT '';
UPDATE repos SET path = name;
CREATE INDEX repos_path ON repos(path);

-- 1 for a repo whose tags the baseline did not list in full (its crawl had
-- failed when the baseline ended): until its tags are listed, what is found
-- in it is the starting point, as the baseline would have taken it, not news.
ALTER TABLE repos ADD COLUMN baseline_pending INTEGER NOT NULL DEFAULT 0;

-- Each resource as the platform sent it (compact JSON), so that fields syncd
-- does not model are queryable with json_extract. NULL until received.
ALTER TABLE repos ADD COLUMN raw TEXT;
ALTER TABLE tags ADD COLUMN raw TEXT;
ALTER TABLE advisories ADD COLUMN raw TEXT;

-- A crawl in which some repos or tags failed, and everything else was done,
-- is 'partial'; failures counts the scopes that failed.
ALTER TABLE crawl_runs ADD COLUMN failures INTEGER NOT NULL DEFAULT 0;

-- The repos and tags whose reads fail, so that one failing scope fails
-- nothing else: the crawler skips each until its next attempt, and deletes
-- its row when it succeeds.
CREATE TABLE crawl_failures (
    uid               TEXT PRIMARY KEY,        -- the repo's or the tag's uid
    kind              TEXT NOT NULL CHECK (kind IN ('repo', 'tag')),
    repo_uid          TEXT NOT NULL,
    path              TEXT NOT NULL DEFAULT '', -- the repo's registry path
    tag               TEXT NOT NULL DEFAULT '', -- tag name, for a tag
    status            INTEGER NOT NULL DEFAULT 0, -- HTTP status, 0 if none
    error             TEXT NOT NULL,
    attempts          INTEGER NOT NULL,
    first_failed_time TEXT NOT NULL,
    last_failed_time  TEXT NOT NULL,
    next_attempt_time TEXT NOT NULL
);
CREATE INDEX crawl_failures_repo ON crawl_failures(repo_uid);

-- The views that name a repo gain its path, as their last column.
DROP VIEW current_tags;
CREATE VIEW current_tags AS
SELECT r.name AS repo, t.name AS tag, t.digest, t.deprecated, t.update_time, t.uid AS tag_uid, r.uid AS repo_uid, r.path AS path
FROM tags t JOIN repos r ON r.uid = t.repo_uid
WHERE t.deleted_time IS NULL AND r.deleted_time IS NULL;

DROP VIEW tag_moves;
CREATE VIEW tag_moves AS
SELECT r.name AS repo, t.name AS tag, h.update_time AS moved_time,
       (SELECT p.digest FROM tag_history p WHERE p.tag_uid = h.tag_uid AND p.seq = h.seq - 1) AS before_digest,
       h.digest AS after_digest, h.tag_uid, r.path AS path
FROM tag_history h JOIN tags t ON t.uid = h.tag_uid JOIN repos r ON r.uid = t.repo_uid
WHERE h.seq > 0;

DROP VIEW deprecated_tags;
CREATE VIEW deprecated_tags AS
SELECT r.name AS repo, t.name AS tag, t.digest, t.update_time, r.path AS path
FROM tags t JOIN repos r ON r.uid = t.repo_uid
WHERE t.deprecated = 1 AND t.deleted_time IS NULL;

DROP VIEW repo_moves;
CREATE VIEW repo_moves AS
SELECT r.name AS repo, r.uid AS repo_uid,
       SUM(MAX(t.history_count - 1, 0)) AS moves,
       SUM(t.history_count > 1) AS tags_moved,
       MAX(CASE WHEN t.history_count > 1 THEN t.history_last_time END) AS last_moved_time,
       r.deleted_time AS repo_deleted_time,
       r.path AS path
FROM repos r JOIN tags t ON t.repo_uid = r.uid
GROUP BY r.uid;
