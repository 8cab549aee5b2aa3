-- Schema version 3: views for the questions analysts ask beyond version 1's
-- current_tags, tag_moves and deprecated_tags.

-- Repos by how often their tags moved (each history record after a tag's
-- first is a move), with the newest move. It reads the tags' history
-- bookmarks, which count the history rows in the same transaction that
-- writes them, so it costs one row per tag however long the history. Moves
-- within a time range come from tag_moves instead.
CREATE VIEW repo_moves AS
SELECT r.name AS repo, r.uid AS repo_uid,
       SUM(MAX(t.history_count - 1, 0)) AS moves,
       SUM(t.history_count > 1) AS tags_moved,
       MAX(CASE WHEN t.history_count > 1 THEN t.history_last_time END) AS last_moved_time,
       r.deleted_time AS repo_deleted_time
FROM repos r JOIN tags t ON t.repo_uid = r.uid
GROUP BY r.uid;

-- Advisories not withdrawn.
CREATE VIEW current_advisories AS
SELECT artifact_name, advisory_id, uid, create_time, update_time, first_seen_time
FROM advisories
WHERE deleted_time IS NULL;

-- One row per artifact: how many advisories are open and withdrawn, the
-- open advisory ids, and the newest update.
CREATE VIEW advisories_by_artifact AS
SELECT artifact_name,
       SUM(deleted_time IS NULL) AS open_advisories,
       SUM(deleted_time IS NOT NULL) AS withdrawn_advisories,
       group_concat(CASE WHEN deleted_time IS NULL THEN advisory_id END, ' ') AS open_advisory_ids,
       MAX(update_time) AS last_update_time
FROM advisories
GROUP BY artifact_name;
