package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Advisory is a vulnerability advisory as the mirror keeps it. Its events
// are scoped by ArtifactName.
type Advisory struct {
	UID          string    `json:"uid"`
	AdvisoryID   string    `json:"advisoryId"`
	ArtifactName string    `json:"artifactName"`
	CreateTime   time.Time `json:"createTime,omitzero"`
	UpdateTime   time.Time `json:"updateTime,omitzero"`
}

type storedAdvisory struct {
	Advisory
	deleted   bool
	deletions int
}

// advisoryColumns is how many values one advisories row takes.
const advisoryColumns = 6

// ApplyAdvisories upserts one page of advisories and records
// advisory.created (also for an advisory that comes back after it was
// withdrawn) and advisory.updated events, all in one transaction. It returns
// how many events it recorded.
func (s *Store) ApplyAdvisories(ctx context.Context, advs []Advisory) (int, error) {
	advs = lastByUID(advs, func(a Advisory) string { return a.UID })
	n, err := s.commit(ctx, func(tx *sql.Tx) (int, error) {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil {
			return 0, err
		}
		uids := make([]string, len(advs))
		for i, a := range advs {
			uids[i] = a.UID
		}
		old, err := loadAdvisories(ctx, tx, `uid IN (%s)`, uids)
		if err != nil {
			return 0, err
		}
		now := FormatTime(s.now())
		var cs []change
		args := make([]any, 0, advisoryColumns*len(advs))
		for _, a := range advs {
			o, seen := old[a.UID]
			switch {
			case !seen || o.deleted:
				if s.announce(baseline) {
					cs = append(cs, change{typ: AdvisoryCreated, scope: a.ArtifactName, subject: a.UID,
						disc: createdDisc(a.CreateTime, a.UpdateTime, o.deletions), time: eventTime(a.CreateTime, s.now()), after: a})
				}
			case !sameAdvisory(o.Advisory, a):
				disc, err := updatedDisc(a.UpdateTime, o.Advisory, a)
				if err != nil {
					return 0, err
				}
				cs = append(cs, change{typ: AdvisoryUpdated, scope: a.ArtifactName, subject: a.UID, disc: disc,
					time: eventTime(a.UpdateTime, s.now()), before: o.Advisory, after: a})
			default:
				continue
			}
			args = append(args, a.UID, a.AdvisoryID, a.ArtifactName, nullTime(a.CreateTime), nullTime(a.UpdateTime), now)
		}
		if _, err := s.insertRows(ctx, tx, bulkAdvisories, args); err != nil {
			return 0, fmt.Errorf("upsert advisories: %w", err)
		}
		return s.appendEvents(ctx, tx, cs)
	})
	if err != nil {
		return 0, fmt.Errorf("apply %d advisories: %w", len(advs), err)
	}
	return n, nil
}

func sameAdvisory(a, b Advisory) bool {
	return a.AdvisoryID == b.AdvisoryID && a.ArtifactName == b.ArtifactName &&
		sameTime(a.CreateTime, b.CreateTime) && sameTime(a.UpdateTime, b.UpdateTime)
}

// loadAdvisories reads the advisories matching where ("%s" stands for the
// list of uids), withdrawn ones included.
func loadAdvisories(ctx context.Context, tx *sql.Tx, where string, uids []string) (map[string]storedAdvisory, error) {
	old := make(map[string]storedAdvisory, len(uids))
	err := queryByUIDs(ctx, tx, `SELECT uid, advisory_id, artifact_name, COALESCE(create_time,''), COALESCE(update_time,''),
		deleted_time IS NOT NULL, deletions FROM advisories WHERE `+where, uids,
		func(rows *sql.Rows) error {
			var a storedAdvisory
			var ct, ut string
			if err := rows.Scan(&a.UID, &a.AdvisoryID, &a.ArtifactName, &ct, &ut, &a.deleted, &a.deletions); err != nil {
				return err
			}
			var err error
			if a.CreateTime, err = ParseTime(ct); err != nil {
				return err
			}
			if a.UpdateTime, err = ParseTime(ut); err != nil {
				return err
			}
			old[a.UID] = a
			return nil
		})
	if err != nil {
		return nil, fmt.Errorf("read stored advisories: %w", err)
	}
	return old, nil
}
