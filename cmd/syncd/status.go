package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
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
	Mirror            string           `json:"mirror"`
	SchemaVersion     int              `json:"schema_version"`
	Tables            map[string]int64 `json:"tables"`
	LastRun           *runStatus       `json:"last_run,omitempty"`
	UnpublishedEvents int              `json:"unpublished_events"`
	OldestUnpublished string           `json:"oldest_unpublished,omitempty"`
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
	var r runStatus
	var fin, msg sql.NullString
	err = db.QueryRowContext(ctx, `SELECT job, started_time, finished_time, outcome, requests, changes, error FROM crawl_runs ORDER BY id DESC LIMIT 1`).
		Scan(&r.Job, &r.Started, &fin, &r.Outcome, &r.Requests, &r.Changes, &msg)
	if err == nil {
		r.Finished, r.Error = fin.String, msg.String
		rep.LastRun = &r
	} else if !errors.Is(err, sql.ErrNoRows) {
		return err
	}
	n, oldest, err := st.UnpublishedCount(ctx)
	if err != nil {
		return err
	}
	rep.UnpublishedEvents, rep.OldestUnpublished = n, store.FormatTime(oldest)
	if c.json {
		enc := json.NewEncoder(c.m.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	w := tabwriter.NewWriter(c.m.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintf(w, "mirror\t%s (schema v%d)\n", rep.Mirror, rep.SchemaVersion)
	for _, t := range []string{"repos", "tags", "tag_history", "advisories", "subscriptions", "events", "crawl_runs"} {
		fmt.Fprintf(w, "%s\t%d\n", t, rep.Tables[t])
	}
	if rep.LastRun != nil {
		fmt.Fprintf(w, "last crawl\t%s, %s, %d requests, %d changes\n", rep.LastRun.Started, rep.LastRun.Outcome, rep.LastRun.Requests, rep.LastRun.Changes)
		if rep.LastRun.Error != "" {
			fmt.Fprintf(w, "last error\t%s\n", rep.LastRun.Error)
		}
	} else {
		fmt.Fprintf(w, "last crawl\tnever\n")
	}
	fmt.Fprintf(w, "unpublished events\t%d", rep.UnpublishedEvents)
	if rep.OldestUnpublished != "" {
		fmt.Fprintf(w, " (oldest recorded %s)", rep.OldestUnpublished)
	}
	fmt.Fprintln(w)
	return w.Flush()
}
