package store

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"slices"
	"time"
)

// Advisory is a vulnerability advisory as the mirror keeps it: the
// advisories row, its aliases, severities and lifecycle. Its events are
// scoped by ArtifactName.
type Advisory struct {
	UID          string    `json:"uid"`
	AdvisoryID   string    `json:"advisoryId"`
	ArtifactName string    `json:"artifactName"`
	CreateTime   time.Time `json:"createTime,omitzero"`
	UpdateTime   time.Time `json:"updateTime,omitzero"`
	// DeleteTime is set on an advisory the platform withdrew; the mirror
	// keeps it as a tombstone withdrawn at that time.
	DeleteTime           time.Time          `json:"deleteTime,omitzero"`
	Author               string             `json:"author,omitempty"`
	ArtifactType         string             `json:"artifactType,omitempty"`
	ArtifactArchitecture string             `json:"artifactArchitecture,omitempty"`
	ComponentName        string             `json:"componentName,omitempty"`
	ComponentLocation    string             `json:"componentLocation,omitempty"`
	ComponentType        string             `json:"componentType,omitempty"`
	LegacyAdvisoryID     string             `json:"legacyAdvisoryId,omitempty"`
	Aliases              []string           `json:"aliases,omitempty"` // CVE and GHSA ids
	Severities           []AdvisorySeverity `json:"severities,omitempty"`
	// Events is the lifecycle, oldest first. It is always in an event's
	// data, [] when empty: a follower tells by it that the leader kept
	// lifecycles (a leader before schema version 7 did not).
	Events []AdvisoryEvent `json:"events"`
	// Raw is the advisory as the platform sent it, stored in
	// advisories.raw; never part of an event. Nil leaves what the mirror
	// has.
	Raw json.RawMessage `json:"-"`
}

// AdvisorySeverity is one scored severity of an advisory, as sent.
type AdvisorySeverity struct {
	Type  string `json:"type"`  // TYPE_CVSS_V2, TYPE_CVSS_V3, TYPE_CVSS_V4
	Score string `json:"score"` // a CVSS vector, or a number
}

// AdvisoryEvent is one step of an advisory's lifecycle.
type AdvisoryEvent struct {
	UID string `json:"uid"`
	// Type is the kind of step (StepDetected, StepFixed, ...; for a kind
	// syncd does not know yet, the platform's name for it in snake_case).
	Type        string    `json:"type"`
	CreateTime  time.Time `json:"createTime,omitzero"`
	Author      string    `json:"author,omitempty"`
	Reviewer    string    `json:"reviewer,omitempty"`
	ReviewState string    `json:"reviewState,omitempty"`
	Issue       string    `json:"issue,omitempty"`
	Note        string    `json:"note,omitempty"`
	// FixedVersion is a fixed step's first fixed version.
	FixedVersion string `json:"fixedVersion,omitempty"`
	// PatchedVersions are a patched step's versions.
	PatchedVersions []string `json:"patchedVersions,omitempty"`
	// FalsePositiveType is a false positive's type (TYPE_...).
	FalsePositiveType string `json:"falsePositiveType,omitempty"`
	// DetectionType is how a detection was made (scanv1, nvdapi, manual).
	DetectionType string `json:"detectionType,omitempty"`
	// Findings is the scanner's findings as the platform sent them (base64).
	Findings string `json:"findings,omitempty"`
	// Details is the step's own object as the platform sent it, with the
	// fields above and those syncd has no field for (a scan's match).
	Details json.RawMessage `json:"details,omitempty"`
}

// The kinds of lifecycle step, AdvisoryEvent.Type; each new step of a
// standing advisory is an event of type "advisory.<kind>".
const (
	StepDetected           = "detected"
	StepTruePositive       = "true_positive"
	StepFalsePositive      = "false_positive"
	StepPendingUpstreamFix = "pending_upstream_fix"
	StepFixNotPlanned      = "fix_not_planned"
	StepAnalysisNotPlanned = "analysis_not_planned"
	StepPatched            = "patched"
	StepFixed              = "fixed"
)

// StepEventType is the event type of a lifecycle step of the given kind.
func StepEventType(kind string) string { return "advisory." + kind }

// forEvent is a as an event carries it: events always present.
func (a Advisory) forEvent() Advisory {
	if a.Events == nil {
		a.Events = []AdvisoryEvent{}
	}
	return a
}

// advisorySummary is an advisory without its lifecycle, as a step's event
// carries it.
type advisorySummary struct {
	Advisory
	Events []AdvisoryEvent `json:"events,omitempty"` // shadows Advisory.Events, and is left empty
}

// stepData is the data of a lifecycle step's event: the advisory (for its
// artifact, component and aliases) and the step.
type stepData struct {
	Advisory advisorySummary `json:"advisory"`
	Event    AdvisoryEvent   `json:"event"`
}

type storedAdvisory struct {
	Advisory
	raw       string // advisories.raw, "" for none
	deleted   bool
	deletions int
	// complete is false for a row from before schema version 7, which
	// lacks all but the first few fields.
	complete bool
}

// advisoryColumns is how many values one advisories row takes.
const advisoryColumns = 16

// ApplyAdvisories upserts one page of advisories, their aliases, severities
// and lifecycles, and records events, all in one transaction:
// advisory.created (also for an advisory that comes back after it was
// withdrawn), advisory.updated (a change to any of its fields or lists),
// advisory.withdrawn, and one "advisory.<kind>" per step of a lifecycle
// the mirror had not seen (advisory.fixed, ...), in the lifecycle's order,
// after the created or updated event and before the withdrawn one.
//
// An advisory with a DeleteTime is withdrawn: it is kept as a tombstone
// (deleted_time is its DeleteTime), with an event if it stood (none for one
// first seen withdrawn); without a DeleteTime again, it is revived. Steps
// are news only past the baseline and for an advisory that stands or stood
// until now. A row from before schema version 7 is rewritten whatever its
// update time, and what only the new fields show is taken as the starting
// point, not as news. A change of raw JSON alone rewrites the row without
// an event. Raw, when set, must be the JSON the advisory was decoded from:
// an advisory whose raw JSON is what the mirror holds is not compared any
// further, which spares an idle listing reading every lifecycle. It
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
		old, err := loadAdvisoryRows(ctx, tx, `uid IN (%s)`, uids)
		if err != nil {
			return 0, err
		}
		// An advisory whose raw JSON is what the row holds is what the row
		// holds: only the others' lists are read, to be compared. On an
		// idle listing that is none of them.
		raws := make([]any, len(advs))
		var differ []string
		for i, a := range advs {
			if raws[i], err = rawJSON(a.Raw); err != nil {
				return 0, fmt.Errorf("advisory %s: %w", a.UID, err)
			}
			if o, seen := old[a.UID]; seen && !unchanged(o, a, raws[i]) {
				differ = append(differ, a.UID)
			}
		}
		if err := loadAdvisoryDetails(ctx, tx, old, differ); err != nil {
			return 0, fmt.Errorf("read stored advisories: %w", err)
		}
		now := s.now()
		var cs []change
		var written []Advisory
		args := make([]any, 0, advisoryColumns*len(advs))
		for i, a := range advs {
			raw := raws[i]
			o, seen := old[a.UID]
			if seen && unchanged(o, a, raw) {
				continue
			}
			withdrawn := !a.DeleteTime.IsZero()
			legacy := seen && !o.complete
			var steps []change
			if !baseline && !legacy && (!withdrawn || seen && !o.deleted) {
				steps = newSteps(o.Advisory, a, now)
			}
			switch {
			case withdrawn && seen && !o.deleted:
				cs = append(cs, steps...)
				if s.announce(baseline) {
					cs = append(
						cs,
						change{typ: AdvisoryWithdrawn, scope: o.ArtifactName, subject: a.UID, disc: deletedDisc(o.deletions + 1),
							time: a.DeleteTime, before: o.Advisory.forEvent()},
					)
				}
			case withdrawn:
				// First seen withdrawn, or a tombstone already: a record, not news.
				if seen && !legacy && sameAdvisory(o.Advisory, a) && !rawChanged(o.raw, raw) {
					continue
				}
			case !seen || o.deleted:
				if s.announce(baseline) {
					cs = append(cs, change{typ: AdvisoryCreated, scope: a.ArtifactName, subject: a.UID,
						disc: createdDisc(
							a.CreateTime,
							a.UpdateTime,
							o.deletions,
						), time: eventTime(a.CreateTime, now), after: a.forEvent()})
				}
				cs = append(cs, steps...)
			case legacy && !sameScalars(o.Advisory, a), !legacy && !sameAdvisory(o.Advisory, a):
				disc, err := updatedDisc(a.UpdateTime, o.Advisory.forEvent(), a.forEvent())
				if err != nil {
					return 0, err
				}
				cs = append(cs, change{typ: AdvisoryUpdated, scope: a.ArtifactName, subject: a.UID, disc: disc,
					time: eventTime(a.UpdateTime, now), before: o.Advisory.forEvent(), after: a.forEvent()})
				cs = append(cs, steps...)
			case legacy, rawChanged(o.raw, raw):
			default:
				continue
			}
			args = append(args, advisoryRow(a, raw, FormatTime(now), true)...)
			written = append(written, a)
		}
		if _, err := s.insertRows(ctx, tx, bulkAdvisories, args); err != nil {
			return 0, fmt.Errorf("upsert advisories: %w", err)
		}
		if err := s.writeAdvisoryDetails(ctx, tx, written, false); err != nil {
			return 0, err
		}
		return s.appendEvents(ctx, tx, cs)
	})
	if err != nil {
		return 0, fmt.Errorf("apply %d advisories: %w", len(advs), err)
	}
	return n, nil
}

// stepKey identifies the i-th step of a lifecycle: its uid, or its
// position when the platform gave none.
func stepKey(e AdvisoryEvent, i int) string {
	if e.UID != "" {
		return e.UID
	}
	return fmt.Sprintf("#%d", i)
}

// newSteps returns the events of the steps of a that o's lifecycle lacks,
// in a's order. An id names the step, so the same step seen twice is one
// event.
func newSteps(o, a Advisory, now time.Time) []change {
	known := make(map[string]bool, len(o.Events))
	for i, e := range o.Events {
		known[stepKey(e, i)] = true
	}
	var cs []change
	for i, e := range a.Events {
		key := stepKey(e, i)
		if known[key] {
			continue
		}
		cs = append(cs, change{typ: StepEventType(e.Type), scope: a.ArtifactName, subject: a.UID, disc: "step/" + key,
			time: eventTime(e.CreateTime, now), data: stepData{Advisory: advisorySummary{Advisory: a}, Event: e}})
	}
	return cs
}

// advisoryRow is the values of a's row for bulkAdvisories; complete says
// whether a holds the whole advisory.
func advisoryRow(a Advisory, raw any, now string, complete bool) []any {
	var legacyID any
	if a.LegacyAdvisoryID != "" {
		legacyID = a.LegacyAdvisoryID
	}
	return []any{
		a.UID,
		a.AdvisoryID,
		a.ArtifactName,
		nullTime(a.CreateTime),
		nullTime(a.UpdateTime),
		now,
		raw,
		nullTime(a.DeleteTime),
		a.Author,
		a.ArtifactType,
		a.ArtifactArchitecture,
		a.ComponentName,
		a.ComponentLocation,
		a.ComponentType,
		legacyID,
		complete,
	}
}

// sameScalars compares the fields every schema version kept; a
// tombstone's DeleteTime is its deleted_time.
func sameScalars(a, b Advisory) bool {
	return a.AdvisoryID == b.AdvisoryID && a.ArtifactName == b.ArtifactName &&
		sameTime(a.CreateTime, b.CreateTime) && sameTime(a.UpdateTime, b.UpdateTime) && sameTime(a.DeleteTime, b.DeleteTime)
}

// unchanged reports whether a, whose raw JSON is raw (from rawJSON), is
// what the complete row o holds: the same raw JSON and scalars (a
// tombstone's DeleteTime is its deleted_time, which a 404 may have set).
func unchanged(o storedAdvisory, a Advisory, raw any) bool {
	r, ok := raw.(string)
	return ok && o.complete && r == o.raw && sameScalars(o.Advisory, a)
}

// sameAdvisory compares everything the mirror keeps of two states, as it
// keeps it: times to the millisecond, JSON compacted, no list as an empty
// one.
func sameAdvisory(a, b Advisory) bool {
	if !sameScalars(a, b) ||
		a.Author != b.Author ||
		a.ArtifactType != b.ArtifactType ||
		a.ArtifactArchitecture != b.ArtifactArchitecture ||
		a.ComponentName != b.ComponentName ||
		a.ComponentLocation != b.ComponentLocation ||
		a.ComponentType != b.ComponentType ||
		a.LegacyAdvisoryID != b.LegacyAdvisoryID ||
		!slices.Equal(a.Aliases, b.Aliases) ||
		!slices.Equal(a.Severities, b.Severities) {
		return false
	}
	return slices.EqualFunc(a.Events, b.Events, func(x, y AdvisoryEvent) bool {
		return x.UID == y.UID && x.Type == y.Type && sameTime(x.CreateTime, y.CreateTime) && x.Author == y.Author &&
			x.Reviewer == y.Reviewer && x.ReviewState == y.ReviewState && x.Issue == y.Issue && x.Note == y.Note &&
			x.FixedVersion == y.FixedVersion && slices.Equal(x.PatchedVersions, y.PatchedVersions) &&
			x.FalsePositiveType == y.FalsePositiveType && x.DetectionType == y.DetectionType && x.Findings == y.Findings &&
			(bytes.Equal(x.Details, y.Details) || bytes.Equal(compactJSON(x.Details), compactJSON(y.Details)))
	})
}

// compactJSON compacts b, or returns nil for none or for JSON that does
// not parse (the platform's decoder accepted it, so it never is).
func compactJSON(b json.RawMessage) json.RawMessage {
	if len(b) == 0 {
		return nil
	}
	var out bytes.Buffer
	if json.Compact(&out, b) != nil {
		return nil
	}
	return out.Bytes()
}

// writeAdvisoryDetails replaces the aliases, severities and lifecycles of
// advs. With keepLater, lifecycle steps after the last of an advisory's
// stay: a follower applying a withdrawal whose state predates steps it was
// told of already.
func (s *Store) writeAdvisoryDetails(ctx context.Context, tx *sql.Tx, advs []Advisory, keepLater bool) error {
	if len(advs) == 0 {
		return nil
	}
	uids := make([]string, len(advs))
	for i, a := range advs {
		uids[i] = a.UID
	}
	for _, table := range []string{"advisory_aliases", "advisory_severities", "advisory_events"} {
		if table == "advisory_events" && keepLater {
			continue
		}
		if err := s.execByUIDs(ctx, tx, `DELETE FROM `+table+` WHERE advisory_uid IN (%s)`, nil, uids); err != nil {
			return fmt.Errorf("replace %s: %w", table, err)
		}
	}
	var aliases, sevs, evs []any
	for _, a := range advs {
		if keepLater {
			if _, err := tx.ExecContext(
				ctx,
				`DELETE FROM advisory_events WHERE advisory_uid = ? AND seq < ?`,
				a.UID,
				len(a.Events),
			); err != nil {
				return fmt.Errorf("replace advisory_events: %w", err)
			}
		}
		for i, al := range a.Aliases {
			aliases = append(aliases, a.UID, i, al)
		}
		for i, sv := range a.Severities {
			var base, rate any
			if b, ok := baseScore(sv.Type, sv.Score); ok {
				base, rate = b, rating(sv.Type, b)
			}
			sevs = append(sevs, a.UID, i, sv.Type, sv.Score, base, rate)
		}
		for i, e := range a.Events {
			evs = append(evs, eventRow(a.UID, i, e)...)
		}
	}
	for _, w := range []struct {
		b    bulk
		args []any
	}{{bulkAdvisoryAliases, aliases}, {bulkAdvisorySeverities, sevs}, {bulkAdvisoryEvents, evs}} {
		if _, err := s.insertRows(ctx, tx, w.b, w.args); err != nil {
			return fmt.Errorf("write advisory details: %w", err)
		}
	}
	return nil
}

// advisoryEventColumns is how many values one advisory_events row takes.
const advisoryEventColumns = 16

// eventRow is the values of the i-th step of advisory uid for
// bulkAdvisoryEvents.
func eventRow(uid string, i int, e AdvisoryEvent) []any {
	str := func(s string) any {
		if s == "" {
			return nil
		}
		return s
	}
	var patched, details any
	if len(e.PatchedVersions) > 0 {
		patched = jsonList(e.PatchedVersions)
	}
	if d := compactJSON(e.Details); d != nil {
		details = string(d)
	}
	return []any{uid, i, e.UID, e.Type, nullTime(e.CreateTime), e.Author, e.Reviewer, e.ReviewState, str(e.Issue), e.Note,
		str(e.FixedVersion), patched, str(e.FalsePositiveType), str(e.DetectionType), str(e.Findings), details}
}

// loadAdvisories reads the advisories matching where ("%s" stands for the
// list of uids), withdrawn ones included, with their deleted_time as
// DeleteTime, their aliases, severities and lifecycles.
func loadAdvisories(ctx context.Context, tx *sql.Tx, where string, uids []string) (map[string]storedAdvisory, error) {
	old, err := loadAdvisoryRows(ctx, tx, where, uids)
	if err != nil {
		return nil, err
	}
	if err := loadAdvisoryDetails(ctx, tx, old, sortedKeys(old)); err != nil {
		return nil, fmt.Errorf("read stored advisories: %w", err)
	}
	return old, nil
}

// loadAdvisoryRows is loadAdvisories without the lists.
func loadAdvisoryRows(ctx context.Context, tx *sql.Tx, where string, uids []string) (map[string]storedAdvisory, error) {
	old := make(map[string]storedAdvisory, len(uids))
	err := queryByUIDs(
		ctx,
		tx,
		`SELECT uid, advisory_id, artifact_name, COALESCE(create_time,''), COALESCE(update_time,''),
		COALESCE(deleted_time,''), deletions, COALESCE(raw,''), author, artifact_type, artifact_architecture, component_name,
		component_location, component_type, COALESCE(legacy_advisory_id,''), complete FROM advisories WHERE `+where,
		uids,
		func(rows *sql.Rows) error {
			var a storedAdvisory
			var ct, ut, dt string
			if err := rows.Scan(
				&a.UID,
				&a.AdvisoryID,
				&a.ArtifactName,
				&ct,
				&ut,
				&dt,
				&a.deletions,
				&a.raw,
				&a.Author,
				&a.ArtifactType,
				&a.ArtifactArchitecture,
				&a.ComponentName,
				&a.ComponentLocation,
				&a.ComponentType,
				&a.LegacyAdvisoryID,
				&a.complete,
			); err != nil {
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
		},
	)
	if err != nil {
		return nil, fmt.Errorf("read stored advisories: %w", err)
	}
	return old, nil
}

// loadAdvisoryDetails reads the aliases, severities and lifecycles of the
// advisories uids of advs.
func loadAdvisoryDetails(ctx context.Context, tx *sql.Tx, advs map[string]storedAdvisory, uids []string) error {
	if len(uids) == 0 {
		return nil
	}
	add := func(uid string, f func(a *storedAdvisory)) {
		a := advs[uid]
		f(&a)
		advs[uid] = a
	}
	err := queryByUIDs(
		ctx,
		tx,
		`SELECT advisory_uid, alias FROM advisory_aliases WHERE advisory_uid IN (%s) ORDER BY advisory_uid, seq`,
		uids,
		func(rows *sql.Rows) error {
			var uid, alias string
			if err := rows.Scan(&uid, &alias); err != nil {
				return err
			}
			add(uid, func(a *storedAdvisory) { a.Aliases = append(a.Aliases, alias) })
			return nil
		},
	)
	if err != nil {
		return fmt.Errorf("aliases: %w", err)
	}
	err = queryByUIDs(
		ctx,
		tx,
		`SELECT advisory_uid, type, score FROM advisory_severities WHERE advisory_uid IN (%s) ORDER BY advisory_uid, seq`,
		uids,
		func(rows *sql.Rows) error {
			var uid string
			var sv AdvisorySeverity
			if err := rows.Scan(&uid, &sv.Type, &sv.Score); err != nil {
				return err
			}
			add(uid, func(a *storedAdvisory) { a.Severities = append(a.Severities, sv) })
			return nil
		},
	)
	if err != nil {
		return fmt.Errorf("severities: %w", err)
	}
	err = queryByUIDs(
		ctx,
		tx,
		`SELECT advisory_uid, uid, type, COALESCE(create_time,''), author, reviewer, review_state, COALESCE(issue,''),
		note, COALESCE(fixed_version,''), COALESCE(patched_versions,'[]'), COALESCE(false_positive_type,''),
			COALESCE(detection_type,''),
		COALESCE(findings,''), COALESCE(details,'') FROM advisory_events WHERE advisory_uid IN (%s) ORDER BY advisory_uid,
			seq`,
		uids,
		func(rows *sql.Rows) error {
			var uid, ct, patched, details string
			var e AdvisoryEvent
			if err := rows.Scan(
				&uid,
				&e.UID,
				&e.Type,
				&ct,
				&e.Author,
				&e.Reviewer,
				&e.ReviewState,
				&e.Issue,
				&e.Note,
				&e.FixedVersion,
				&patched,
				&e.FalsePositiveType,
				&e.DetectionType,
				&e.Findings,
				&details,
			); err != nil {
				return err
			}
			var err error
			if e.CreateTime, err = ParseTime(ct); err != nil {
				return err
			}
			if e.PatchedVersions, err = parseList(patched); err != nil {
				return err
			}
			if details != "" {
				e.Details = json.RawMessage(details)
			}
			add(uid, func(a *storedAdvisory) { a.Events = append(a.Events, e) })
			return nil
		},
	)
	if err != nil {
		return fmt.Errorf("lifecycles: %w", err)
	}
	return nil
}

// Advisories returns every advisory the mirror holds, withdrawn ones
// included (DeleteTime is their deleted_time), with their aliases,
// severities and lifecycles, sorted by uid. It reads one snapshot on the
// reader pool.
func (s *Store) Advisories(ctx context.Context) ([]Advisory, error) {
	tx, err := s.r.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, fmt.Errorf("read advisories: %w", err)
	}
	defer tx.Rollback()
	var uids []string
	err = queryRows(ctx, tx, `SELECT uid FROM advisories ORDER BY uid`, nil, func(rows *sql.Rows) error {
		var u string
		if err := rows.Scan(&u); err != nil {
			return err
		}
		uids = append(uids, u)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("read advisories: %w", err)
	}
	stored, err := loadAdvisories(ctx, tx, `uid IN (%s)`, uids)
	if err != nil {
		return nil, err
	}
	out := make([]Advisory, len(uids))
	for i, u := range uids {
		out[i] = stored[u].Advisory
	}
	return out, nil
}
