package main

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/store"
)

// queryCommand is "syncd query": a client of the query service that every
// replica runs on NATS, printing its answer for a person or as JSON.
type queryCommand struct {
	m       *Main
	flags   commonFlags
	json    bool
	timeout time.Duration
	minSeq  uint64
	at, ago string
	from    string
	to      string
	limit   int
	cursor  string
	// advisories
	artifact, alias, component string
	withdrawn                  bool

	endpoint string
	args     []string
}

func (c *queryCommand) ParseFlags(args []string) error {
	fs := c.m.flagSet("query", usage("query"), &c.flags)
	fs.BoolVar(&c.json, "json", false, "print the service's JSON answer")
	fs.DurationVar(&c.timeout, "timeout", 10*time.Second, "how long to wait for an answer")
	fs.Uint64Var(
		&c.minSeq,
		"min-seq",
		0,
		"answer only from a mirror that has applied this stream `sequence` (a replica waits up to [query] max_wait for it)",
	)
	fs.StringVar(&c.at, "at", "", "tag.at: the `instant` (RFC 3339, or a date); default now")
	fs.StringVar(&c.ago, "ago", "", "tag.at: the instant as a `duration` before now (72h)")
	fs.StringVar(&c.from, "from", "", "tag.history: records from this `instant` on")
	fs.StringVar(&c.to, "to", "", "tag.history: records before this `instant`")
	fs.IntVar(
		&c.limit,
		"limit",
		0,
		"how many records, tags, intervals or advisories at most (default 100, capped by [query] max_limit)",
	)
	fs.StringVar(&c.cursor, "cursor", "", "tag.history, repo.tags: the next page, as the previous answer's next_cursor")
	fs.StringVar(&c.artifact, "artifact", "", "advisories: of this artifact")
	fs.StringVar(&c.alias, "alias", "", "advisories: covering this CVE or GHSA id")
	fs.StringVar(&c.component, "component", "", "advisories: of this component")
	fs.BoolVar(&c.withdrawn, "withdrawn", false, "advisories: include withdrawn ones")
	// Flags may come after the endpoint and its arguments.
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		pos, args = append(pos, fs.Arg(0)), fs.Args()[1:]
	}
	if len(pos) == 0 {
		fs.Usage()
		return errors.New("name an endpoint: " + strings.Join(query.Endpoints, ", "))
	}
	c.endpoint, c.args = pos[0], pos[1:]
	return nil
}

// request is the request the command line asks for.
func (c *queryCommand) request() (any, error) {
	want := map[string]int{
		query.TagAt:       1,
		query.TagHistory:  1,
		query.DigestWhere: 1,
		query.RepoTags:    1,
		query.Advisories:  0,
		query.PositionEP:  0,
	}
	n, ok := want[c.endpoint]
	if !ok {
		return nil, fmt.Errorf("unknown endpoint %q: want one of %s", c.endpoint, strings.Join(query.Endpoints, ", "))
	}
	if len(c.args) != n {
		return nil, fmt.Errorf(
			"%s takes %d argument(s), got %d: %q (see syncd query --help)",
			c.endpoint,
			n,
			len(c.args),
			c.args,
		)
	}
	repoTag := func() (string, string, error) {
		repo, tag, ok := strings.Cut(c.args[0], ":")
		if !ok || repo == "" || tag == "" {
			return "", "", fmt.Errorf(
				"%s: want REPO:TAG (nginx:1.27, charts/cert-manager:latest), got %q",
				c.endpoint,
				c.args[0],
			)
		}
		return repo, tag, nil
	}
	switch c.endpoint {
	case query.TagAt:
		repo, tag, err := repoTag()
		return query.TagAtRequest{Repo: repo, Tag: tag, Time: c.at, Ago: c.ago, MinSeq: c.minSeq}, err
	case query.TagHistory:
		repo, tag, err := repoTag()
		return query.TagHistoryRequest{
			Repo:   repo,
			Tag:    tag,
			From:   c.from,
			To:     c.to,
			Limit:  c.limit,
			Cursor: c.cursor,
			MinSeq: c.minSeq,
		}, err
	case query.DigestWhere:
		return query.DigestWhereRequest{Digest: c.args[0], Limit: c.limit, MinSeq: c.minSeq}, nil
	case query.RepoTags:
		return query.RepoTagsRequest{Repo: c.args[0], Limit: c.limit, Cursor: c.cursor, MinSeq: c.minSeq}, nil
	case query.Advisories:
		return query.AdvisoriesRequest{Artifact: c.artifact, Alias: c.alias, Component: c.component, Withdrawn: c.withdrawn,
			Limit: c.limit, MinSeq: c.minSeq}, nil
	}
	return query.PositionRequest{MinSeq: c.minSeq}, nil
}

func (c *queryCommand) Run(ctx context.Context) error {
	req, err := c.request()
	if err != nil {
		return daemon.ConfigError{Err: err}
	}
	cfg, err := c.m.loadConfig(c.flags)
	if err != nil {
		return err
	}
	if !cfg.Query.Enabled {
		return daemon.ConfigError{
			Err: &config.Error{Key: "query.enabled", Msg: "false: the replicas of this configuration answer no queries"},
		}
	}
	nc, err := c.dial(ctx, cfg)
	if err != nil {
		return err
	}
	defer nc.Close()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	var raw json.RawMessage
	if err := (&query.Client{NC: nc.NC, Prefix: cfg.Query.Prefix}).Do(ctx, c.endpoint, req, &raw); err != nil {
		return err
	}
	if c.json {
		var out bytes.Buffer
		if err := json.Indent(&out, raw, "", "  "); err != nil {
			return err
		}
		out.WriteByte('\n')
		_, err := c.m.Stdout.Write(out.Bytes())
		return err
	}
	return printAnswer(c.m.Stdout, c.endpoint, raw)
}

// dial connects to the NATS server of the configuration: [nats] url, or
// without one the embedded server's listen address (the demo's,
// 127.0.0.1:4222, by default).
func (c *queryCommand) dial(ctx context.Context, cfg config.Config) (*publish.Conn, error) {
	pcfg := daemon.NATSConfig(cfg, slog.New(slog.DiscardHandler))
	if pcfg.URL == "" {
		pcfg.URL = "nats://" + cmp.Or(cfg.NATS.Listen, config.DemoNATSListen)
	}
	pcfg.FailFast = true
	return publish.Dial(ctx, pcfg)
}

// printAnswer writes an endpoint's answer for a person.
func printAnswer(w io.Writer, endpoint string, raw json.RawMessage) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	var seq uint64
	var next string
	switch endpoint {
	case query.TagAt:
		var a query.TagAtReply
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		seq = a.StreamSeq
		name := a.Repo + ":" + a.Tag
		switch {
		case a.Deleted && a.Since != nil:
			fmt.Fprintf(tw, "%s at %s: deleted (since %s)\n", name, stamp(&a.Time), stamp(a.Since))
		case a.Deleted:
			fmt.Fprintf(tw, "%s at %s: did not exist yet (created %s)\n", name, stamp(&a.Time), stamp(a.Until))
		default:
			fmt.Fprintf(
				tw,
				"%s at %s: %s\n  since %s, until %s\n",
				name,
				stamp(&a.Time),
				a.Digest,
				orUnknown(a.Since),
				orNow(a.Until),
			)
		}
	case query.TagHistory:
		var a query.TagHistoryReply
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		seq, next = a.StreamSeq, a.NextCursor
		fmt.Fprintf(tw, "SEQ\tTIME\tDIGEST\n")
		for _, r := range a.Records {
			fmt.Fprintf(tw, "%d\t%s\t%s\n", r.Seq, stamp(&r.Time), r.Digest)
		}
	case query.DigestWhere:
		var a query.DigestWhereReply
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		seq = a.StreamSeq
		fmt.Fprintf(tw, "%s\nTAG\tFROM\tUNTIL\n", a.Digest)
		for _, iv := range a.Intervals {
			fmt.Fprintf(tw, "%s:%s\t%s\t%s\n", iv.Repo, iv.Tag, orUnknown(iv.From), orNow(iv.Until))
		}
		if a.Truncated {
			fmt.Fprintln(tw, "… more: raise --limit")
		}
	case query.RepoTags:
		var a query.RepoTagsReply
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		seq, next = a.StreamSeq, a.NextCursor
		fmt.Fprintf(tw, "TAG\tDIGEST\tDEPRECATED\tUPDATED\n")
		for _, t := range a.Tags {
			fmt.Fprintf(tw, "%s\t%s\t%v\t%s\n", t.Tag, t.Digest, t.Deprecated, orUnknown(t.UpdateTime))
		}
	case query.Advisories:
		var a query.AdvisoriesReply
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		seq = a.StreamSeq
		fmt.Fprintf(tw, "ADVISORY\tARTIFACT\tCOMPONENT\tSTATE\tFIXED\tALIASES\n")
		for _, x := range a.Advisories {
			state := cmp.Or(x.State, "-")
			if x.Withdrawn != nil {
				state += " (withdrawn)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", x.AdvisoryID, x.Artifact, cmp.Or(x.Component, "-"), state,
				cmp.Or(x.FixedVersion, "-"), strings.Join(x.Aliases, " "))
		}
		if a.Truncated {
			fmt.Fprintln(tw, "… more: raise --limit")
		}
	case query.PositionEP:
		var a query.PositionReply
		if err := json.Unmarshal(raw, &a); err != nil {
			return err
		}
		fmt.Fprintf(tw, "role\t%s\nstream sequence\t%d\nlag\t%d\nready\t%v\n", a.Role, a.StreamSeq, a.Lag, a.Ready)
		return tw.Flush()
	}
	if next != "" {
		fmt.Fprintf(tw, "… more: --cursor %s\n", next)
	}
	fmt.Fprintf(tw, "(read at stream sequence %d)\n", seq)
	return tw.Flush()
}

// stamp is t as the mirror writes times: UTC, to the millisecond.
func stamp(t *time.Time) string { return store.FormatTime(*t) }

func orNow(t *time.Time) string {
	if t == nil {
		return "now"
	}
	return stamp(t)
}

func orUnknown(t *time.Time) string {
	if t == nil {
		return "-"
	}
	return stamp(t)
}
