package main

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"text/tabwriter"

	"github.com/syncd-dev/syncd/internal/store"
)

// statusCommand is "syncd status": what the mirror holds and how fresh it is.
type statusCommand struct {
	m     *Main
	flags commonFlags
	json  bool
}

func (c *statusCommand) ParseFlags(args []string) error {
	fs := flag.NewFlagSet("syncd status", flag.ContinueOnError)
	fs.SetOutput(c.m.Stderr)
	c.flags.register(fs)
	fs.BoolVar(&c.json, "json", false, "print JSON instead of a table")
	fs.Usage = func() {
		fmt.Fprint(fs.Output(), `Usage: syncd status [--config FILE] [--json]

Reads the mirror directly (whether or not the daemon runs) and shows rows per
table, the latest crawl and its outcome, and events waiting for JetStream.

Examples:
  syncd status
  syncd status --json | jq .unpublished_events

Flags:
`)
		fs.PrintDefaults()
	}
	return fs.Parse(args)
}

type statusReport struct {
	Mirror        string           `json:"mirror"`
	SchemaVersion int              `json:"schema_version"`
	Tables        map[string]int64 `json:"tables"`
	Jobs          []runStatus      `json:"jobs"`
	Subscriptions []subStatus      `json:"subscriptions"`
	// Failures are the repos and tags whose reads failed and are retried
	// with backoff; the rest of each crawl went on without them.
	Failures          []store.Failure `json:"failures"`
	UnpublishedEvents int             `json:"unpublished_events"`
	OldestUnpublished string          `json:"oldest_unpublished,omitempty"`
	// Cluster mode and followers: leader, standby or follower; the lease
	// holder; how many stream messages the follower had pending.
	Role        string `json:"role,omitempty"`
	LeaseHolder string `json:"lease_holder,omitempty"`
	FollowLag   string `json:"follow_lag,omitempty"`
}

type subStatus struct {
	UID     string `json:"uid"`
	Group   string `json:"group"`
	Sink    string `json:"sink"`
	Synced  string `json:"synced"`
	Deleted string `json:"deleted,omitempty"`
}

type runStatus struct {
	Job      string `json:"job"`
	Started  string `json:"started"`
	Finished string `json:"finished,omitempty"`
	Outcome  string `json:"outcome"`
	Requests int64  `json:"requests"`
	Changes  int64  `json:"changes"`
	Error    string `json:"error,omitempty"`
}

func (c *statusCommand) Run(ctx context.Context) error {
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	if _, err := os.Stat(cfg.Store.Path); err != nil {
		return fmt.Errorf("no mirror at %s (set [store] path, or run syncd first): %w", cfg.Store.Path, err)
	}
	st, err := store.Open(ctx, cfg.Store.Path, store.Options{Readers: 1})
	if err != nil {
		return err
	}
	defer st.Close()
	rep := statusReport{Mirror: cfg.Store.Path, Tables: map[string]int64{}}
	if rep.SchemaVersion, err = st.SchemaVersion(ctx); err != nil {
		return err
	}
	db := st.Reader()
	for _, t := range []string{"repos", "tags", "tag_history", "advisories", "subscriptions", "events", "crawl_runs"} {
		var n int64
		if err := db.QueryRowContext(ctx, `SELECT COUNT(*) FROM `+t).Scan(&n); err != nil {
			return fmt.Errorf("count %s: %w", t, err)
		}
		rep.Tables[t] = n
	}
	// The latest run of each job.
	rows, err := db.QueryContext(ctx, `SELECT job, started_time, finished_time, outcome, requests, changes, error FROM crawl_runs
		WHERE id IN (SELECT MAX(id) FROM crawl_runs GROUP BY job) ORDER BY job`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var r runStatus
		var fin, msg sql.NullString
		if err := rows.Scan(&r.Job, &r.Started, &fin, &r.Outcome, &r.Requests, &r.Changes, &msg); err != nil {
			rows.Close()
			return err
		}
		r.Finished, r.Error = fin.String, msg.String
		rep.Jobs = append(rep.Jobs, r)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	rows, err = db.QueryContext(ctx, `SELECT uid, group_uid, sink, synced_time, COALESCE(deleted_time, '') FROM subscriptions ORDER BY uid`)
	if err != nil {
		return err
	}
	for rows.Next() {
		var sub subStatus
		if err := rows.Scan(&sub.UID, &sub.Group, &sub.Sink, &sub.Synced, &sub.Deleted); err != nil {
			rows.Close()
			return err
		}
		rep.Subscriptions = append(rep.Subscriptions, sub)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	if rep.Failures, err = st.Failures(ctx); err != nil {
		return err
	}
	n, oldest, err := st.UnpublishedCount(ctx)
	if err != nil {
		return err
	}
	rep.UnpublishedEvents, rep.OldestUnpublished = n, store.FormatTime(oldest)
	for key, v := range map[string]*string{"role": &rep.Role, "lease_holder": &rep.LeaseHolder, "follow_lag": &rep.FollowLag} {
		if *v, err = st.Meta(ctx, key); err != nil {
			return err
		}
	}
	if c.json {
		enc := json.NewEncoder(c.m.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	w := tabwriter.NewWriter(c.m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "mirror\t%s (schema v%d)\n", rep.Mirror, rep.SchemaVersion)
	if rep.Role != "" {
		fmt.Fprintf(w, "role\t%s (lease holder: %s)\n", rep.Role, cmp.Or(rep.LeaseHolder, "none"))
	}
	if rep.FollowLag != "" {
		fmt.Fprintf(w, "follower lag\t%s messages\n", rep.FollowLag)
	}
	for _, t := range []string{"repos", "tags", "tag_history", "advisories", "subscriptions", "events", "crawl_runs"} {
		fmt.Fprintf(w, "%s\t%d\n", t, rep.Tables[t])
	}
	if len(rep.Jobs) == 0 {
		fmt.Fprintf(w, "last runs\tnone yet\n")
	}
	for _, r := range rep.Jobs {
		fmt.Fprintf(w, "last %s\t%s, %s, %d requests, %d changes\n", r.Job, r.Started, r.Outcome, r.Requests, r.Changes)
		if r.Error != "" {
			fmt.Fprintf(w, "  error\t%s\n", r.Error)
		}
	}
	for _, f := range rep.Failures {
		what := f.Path
		if f.Kind == "tag" {
			what += ":" + f.Tag
		}
		fmt.Fprintf(w, "failing %s\t%s: %s (%d attempts since %s, next %s)\n", f.Kind, what, f.Error, f.Attempts,
			store.FormatTime(f.FirstFailed), store.FormatTime(f.NextAttempt))
	}
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
	fmt.Fprintf(w, "unpublished events\t%d", rep.UnpublishedEvents)
	if rep.OldestUnpublished != "" {
		fmt.Fprintf(w, " (oldest recorded %s)", rep.OldestUnpublished)
	}
	fmt.Fprintln(w)
	return w.Flush()
}
