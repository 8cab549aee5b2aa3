package admin

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"

	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/store"
)

// StatusReport is what the mirror says about a syncd, as "syncd status"
// shows it: a table, or this JSON.
type StatusReport struct {
	Mirror        string               `json:"mirror"`
	SchemaVersion int                  `json:"schema_version"`
	Tables        map[string]int64     `json:"tables"`
	Jobs          []RunStatus          `json:"jobs"`
	Subscriptions []SubscriptionStatus `json:"subscriptions"`
	// Failures are the repos and tags whose reads failed and are retried
	// with backoff; the rest of each crawl went on without them.
	Failures          []store.Failure `json:"failures"`
	UnpublishedEvents int             `json:"unpublished_events"`
	OldestUnpublished string          `json:"oldest_unpublished,omitempty"`
	// Progress is the running crawl's, when one runs.
	Progress *crawler.Progress `json:"progress,omitempty"`
	// Phases says which readiness phases are ready: current (the first
	// complete listing ended) and history (every tag's history read).
	Phases map[string]bool `json:"phases"`
	// Backfill is what is left of the backfill of the tags' histories.
	Backfill *BackfillStatus `json:"backfill,omitempty"`
	// Cluster mode and followers: leader, standby or follower; the lease
	// holder; how many stream messages the follower had pending.
	Role        string `json:"role,omitempty"`
	LeaseHolder string `json:"lease_holder,omitempty"`
	FollowLag   string `json:"follow_lag,omitempty"`
	// Checkpoint is the last leader's checkpoint compared (followers and
	// standbys).
	Checkpoint *CheckpointStatus `json:"checkpoint,omitempty"`
	// Snapshot is the snapshot the mirror was restored from, if it was.
	Snapshot *SnapshotStatus `json:"snapshot,omitempty"`
}

// SnapshotStatus is the snapshot a mirror was restored from, in a
// StatusReport: the stream sequence it covers; for a mirror made from its
// file, whether the file's check is still due (since when), and the
// damage the check found.
type SnapshotStatus struct {
	StreamSeq string `json:"stream_seq"`
	CheckDue  string `json:"check_due_since,omitempty"`
	Damage    string `json:"damage,omitempty"`
}

// SubscriptionStatus is an event subscription in a StatusReport.
type SubscriptionStatus struct {
	UID     string `json:"uid"`
	Group   string `json:"group"`
	Sink    string `json:"sink"`
	Synced  string `json:"synced"`
	Deleted string `json:"deleted,omitempty"`
}

// RunStatus is a job's latest run in a StatusReport.
type RunStatus struct {
	Job      string `json:"job"`
	Started  string `json:"started"`
	Finished string `json:"finished,omitempty"`
	Outcome  string `json:"outcome"`
	Requests int64  `json:"requests"`
	Changes  int64  `json:"changes"`
	Error    string `json:"error,omitempty"`
}

// NewStatusReport is the report of the mirror at path, whose status is s.
func NewStatusReport(mirror string, s store.Status) StatusReport {
	rep := StatusReport{Mirror: mirror, SchemaVersion: s.SchemaVersion, Tables: s.Tables, Failures: s.Failures,
		UnpublishedEvents: s.Unpublished, OldestUnpublished: store.FormatTime(s.OldestUnpublished),
		Role: s.Role, LeaseHolder: s.LeaseHolder, FollowLag: s.FollowLag}
	if s.CheckpointSeq != "" {
		rep.Checkpoint = &CheckpointStatus{StreamSeq: s.CheckpointSeq, Result: s.CheckpointResult, Time: s.CheckpointTime}
	}
	if s.SnapshotSeq != "" {
		rep.Snapshot = &SnapshotStatus{StreamSeq: s.SnapshotSeq, CheckDue: s.AdoptedCheckDue, Damage: s.AdoptedDamage}
	}
	rep.Phases = map[string]bool{PhaseCurrent: s.Current, PhaseHistory: s.Current && s.BackfillRemaining == 0}
	if s.BackfillRemaining > 0 {
		rep.Backfill = &BackfillStatus{RemainingTags: s.BackfillRemaining}
	}
	if s.Progress != "" {
		var p crawler.Progress
		if json.Unmarshal([]byte(s.Progress), &p) == nil {
			rep.Progress = &p
		}
	}
	for _, r := range s.Runs {
		rep.Jobs = append(
			rep.Jobs,
			RunStatus{Job: r.Job, Started: store.FormatTime(r.Started), Finished: store.FormatTime(r.Finished),
				Outcome: r.Outcome, Requests: r.Requests, Changes: int64(r.Changes), Error: r.Error},
		)
	}
	for _, sub := range s.Subscriptions {
		rep.Subscriptions = append(rep.Subscriptions, SubscriptionStatus{UID: sub.UID, Group: sub.GroupUID, Sink: sub.Sink,
			Synced: store.FormatTime(sub.Synced), Deleted: store.FormatTime(sub.Deleted)})
	}
	return rep
}

// WriteTable writes the report as a table.
func (rep StatusReport) WriteTable(out io.Writer) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "mirror\t%s (schema v%d)\n", rep.Mirror, rep.SchemaVersion)
	if rep.Role != "" {
		fmt.Fprintf(w, "role\t%s (lease holder: %s)\n", rep.Role, cmp.Or(rep.LeaseHolder, "none"))
	}
	if c := rep.Checkpoint; c != nil {
		fmt.Fprintf(w, "checkpoint\tstream sequence %s (%s): %s\n", c.StreamSeq, c.Time, c.Result)
	}
	if rep.FollowLag != "" {
		fmt.Fprintf(w, "follower lag\t%s messages\n", rep.FollowLag)
	}
	if sn := rep.Snapshot; sn != nil {
		if sn.StreamSeq == "0" {
			// store.SetStreamIncarnation: the stream was created again.
			fmt.Fprint(w, "restored from\ta snapshot of the stream before it was created again (or lost its tail)")
		} else {
			fmt.Fprintf(w, "restored from\tthe snapshot of stream sequence %s", sn.StreamSeq)
		}
		switch {
		case sn.Damage != "":
			fmt.Fprintf(w, "; its file is DAMAGED (%s): stop syncd, remove the mirror, start it again", sn.Damage)
		case sn.CheckDue != "":
			fmt.Fprintf(w, "; its file's check is still to run (made %s)", sn.CheckDue)
		}
		fmt.Fprintln(w)
	}
	for _, t := range store.StatusTables {
		fmt.Fprintf(w, "%s\t%d\n", t, rep.Tables[t])
	}
	rep.writePhases(w)
	if len(rep.Jobs) == 0 {
		fmt.Fprintf(w, "last runs\tnone yet\n")
	}
	rep.writeProgress(w)
	for _, r := range rep.Jobs {
		fmt.Fprintf(w, "last %s\t%s, %s, %d requests, %d changes\n", r.Job, r.Started, r.Outcome, r.Requests, r.Changes)
		if r.Error != "" {
			fmt.Fprintf(w, "  error\t%s\n", r.Error)
		}
	}
	for _, f := range rep.Failures {
		what := f.Path
		if f.Kind == store.FailureTag {
			what += ":" + f.Tag
		}
		fmt.Fprintf(w, "failing %s\t%s: %s (%d attempts since %s, next %s)\n", f.Kind, what, f.Error, f.Attempts,
			store.FormatTime(f.FirstFailed), store.FormatTime(f.NextAttempt))
	}
	rep.writeSubscriptions(w)
	fmt.Fprintf(w, "unpublished events\t%d", rep.UnpublishedEvents)
	if rep.OldestUnpublished != "" {
		fmt.Fprintf(w, " (oldest recorded %s)", rep.OldestUnpublished)
	}
	fmt.Fprintln(w)
	return w.Flush()
}

func (rep StatusReport) writeProgress(w io.Writer) {
	p := rep.Progress
	if p == nil {
		return
	}
	fmt.Fprintf(
		w,
		"crawl running\tsince %s: %d of %d tags listed, %d of %d history reads, %.1f requests/s, ETA %s\n",
		store.FormatTime(
			p.Started,
		),
		p.TagsListed,
		p.TagsTotal,
		p.HistoryRead,
		p.HistoryQueued,
		p.RequestsPerSecond,
		cmp.Or(p.ETA, "unknown yet"),
	)
	if p.Retrying != "" {
		fmt.Fprintf(w, "  retrying\t%s\n", p.Retrying)
	}
	if p.HeldByRateLimit {
		fmt.Fprintf(w, "  held\tby [crawl] requests_per_second = %g\n", p.RateLimit)
	}
}

func (rep StatusReport) writeSubscriptions(w io.Writer) {
	if len(rep.Subscriptions) == 0 {
		fmt.Fprintf(w, "subscription\tnone (crawl only, or not registered yet)\n")
	}
	for _, sub := range rep.Subscriptions {
		state := "active, checked " + sub.Synced
		if sub.Deleted != "" {
			state = "removed " + sub.Deleted
		}
		fmt.Fprintf(w, "subscription\t%s -> %s (%s)\n", sub.UID, sub.Sink, state)
	}
}

// BackfillStatus is what is left of the backfill in a StatusReport.
type BackfillStatus struct {
	RemainingTags int64 `json:"remaining_tags"`
	// ETA is the time the reads left take at the request rate limit; ""
	// without a limit.
	ETA string `json:"eta,omitempty"`
}

// EstimateBackfill fills in the backfill's time left at rate requests a
// second ([crawl] requests_per_second; 0: unlimited, no estimate).
func (rep *StatusReport) EstimateBackfill(rate float64) {
	if b := rep.Backfill; b != nil {
		if eta := crawler.BackfillETA(b.RemainingTags, rate); eta > 0 {
			b.ETA = eta.String()
		}
	}
}

func (rep StatusReport) writePhases(w io.Writer) {
	state := func(ready bool) string {
		if ready {
			return "ready"
		}
		return "pending"
	}
	fmt.Fprintf(w, "phases	current %s, history %s\n", state(rep.Phases[PhaseCurrent]), state(rep.Phases[PhaseHistory]))
	if b := rep.Backfill; b != nil {
		fmt.Fprintf(
			w,
			"backfill	%d tags' histories left, ETA %s\n",
			b.RemainingTags,
			cmp.Or(b.ETA, "unknown (no rate limit)"),
		)
	}
}

// CheckpointStatus is the last leader's checkpoint a replica compared its
// mirror with.
type CheckpointStatus struct {
	StreamSeq string `json:"stream_seq"`
	Result    string `json:"result"`
	Time      string `json:"time"`
}
