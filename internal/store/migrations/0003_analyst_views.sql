-- Schema version 3: views for the questions analysts ask beyond version 1's
-- current_tags, tag_moves and deprecated_tags.

-- Repos by how often their tags moved (a history record after a tag's
-- first), with the newest move.
CREATE VIEW repo_moves AS
SELECT r.name AS repo, r.uid AS repo_uid, COUNT(*) AS moves,
       COUNT(DISTINCT h.tag_uid) AS tags_moved, MAX(h.update_time) AS last_moved_time
FROM tag_history h JOIN tags t ON t.uid = h.tag_uid JOIN repos r ON r.uid = t.repo_uid
WHERE h.seq > 0
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
