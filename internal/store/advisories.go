package store

import (
	"context"
	"database/sql"
	"encoding/json"
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
	// DeleteTime is set on an advisory the platform withdrew; the mirror
	// keeps it as a tombstone withdrawn at that time.
	DeleteTime time.Time `json:"deleteTime,omitzero"`
	// Raw is the advisory as the platform sent it, stored in
	// advisories.raw; never part of an event. Nil leaves what the mirror
	// has.
	Raw json.RawMessage `json:"-"`
}

type storedAdvisory struct {
	Advisory
	raw       string // advisories.raw, "" for none
	deleted   bool
	deletions int
}

// advisoryColumns is how many values one advisories row takes.
const advisoryColumns = 8

// ApplyAdvisories upserts one page of advisories and records
// advisory.created (also for an advisory that comes back after it was
// withdrawn), advisory.updated and advisory.withdrawn events, all in one
// transaction. An advisory with a DeleteTime is withdrawn: it is kept as a
// tombstone (deleted_time is its DeleteTime), with an event if it stood
// (none for one first seen withdrawn); without a DeleteTime again, it is
// revived. A change of raw JSON alone rewrites the row without an event. It
// returns how many events it recorded.
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
			raw, err := rawJSON(a.Raw)
			if err != nil {
				return 0, fmt.Errorf("advisory %s: %w", a.UID, err)
			}
			o, seen := old[a.UID]
			withdrawn := !a.DeleteTime.IsZero()
			switch {
			case withdrawn && seen && !o.deleted:
				if s.announce(baseline) {
					cs = append(cs, change{typ: AdvisoryWithdrawn, scope: o.ArtifactName, subject: a.UID, disc: deletedDisc(o.deletions + 1),
						time: a.DeleteTime, before: o.Advisory})
				}
			case withdrawn:
				// First seen withdrawn, or a tombstone already: a record, not news.
				if seen && sameAdvisory(o.Advisory, a) && !rawChanged(o.raw, raw) {
					continue
				}
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
			case rawChanged(o.raw, raw):
			default:
				continue
			}
			args = append(args, advisoryRow(a, raw, now)...)
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

// advisoryRow is the values of a's row for bulkAdvisories.
func advisoryRow(a Advisory, raw any, now string) []any {
	return []any{a.UID, a.AdvisoryID, a.ArtifactName, nullTime(a.CreateTime), nullTime(a.UpdateTime), now, raw, nullTime(a.DeleteTime)}
}

// sameAdvisory compares what the mirror keeps of two states; a tombstone's
// DeleteTime is its deleted_time.
func sameAdvisory(a, b Advisory) bool {
	return a.AdvisoryID == b.AdvisoryID && a.ArtifactName == b.ArtifactName &&
		sameTime(a.CreateTime, b.CreateTime) && sameTime(a.UpdateTime, b.UpdateTime) && sameTime(a.DeleteTime, b.DeleteTime)
}

// loadAdvisories reads the advisories matching where ("%s" stands for the
// list of uids), withdrawn ones included, with their deleted_time as
// DeleteTime.
func loadAdvisories(ctx context.Context, tx *sql.Tx, where string, uids []string) (map[string]storedAdvisory, error) {
	old := make(map[string]storedAdvisory, len(uids))
	err := queryByUIDs(ctx, tx, `SELECT uid, advisory_id, artifact_name, COALESCE(create_time,''), COALESCE(update_time,''),
		COALESCE(deleted_time,''), deletions, COALESCE(raw,'') FROM advisories WHERE `+where, uids,
		func(rows *sql.Rows) error {
			var a storedAdvisory
			var ct, ut, dt string
			if err := rows.Scan(&a.UID, &a.AdvisoryID, &a.ArtifactName, &ct, &ut, &dt, &a.deletions, &a.raw); err != nil {
				return err
			}
			a.deleted = dt != ""
			var err error
			if a.CreateTime, err = ParseTime(ct); err != nil {
				return err
			}
			if a.UpdateTime, err = ParseTime(ut); err != nil {
				return err
			}
			if a.DeleteTime, err = ParseTime(dt); err != nil {
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
