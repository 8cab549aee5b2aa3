package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// withQuery appends a [query] section to the config file at path.
func withQuery(t *testing.T, path, section string) {
	t.Helper()
	f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := fmt.Fprintf(f, "\n[query]\n%s\n", section); err != nil {
		t.Fatal(err)
	}
}

// ask sends req to endpoint of c within 10s.
func ask(c *query.Client, endpoint string, req, out any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return c.Do(ctx, endpoint, req, out)
}

// TestQuery_LeaderStandbyFollower drives every endpoint through NATS on a
// leader, a standby and a follower (processes, in cluster mode), each with
// a prefix of its own so that the test can address it: their answers agree
// with the simulator and with each other, each replica's position is the
// stream's, min_seq waits for a change to be applied, and refusals carry
// their codes.
func TestQuery_LeaderStandbyFollower(t *testing.T) {
	t.Parallel() // it mostly waits: see "Parallel tests" in harness_test.go
	ns := testutil.NATS(t)
	sim, simURL := testutil.Sim(t, platformsim.Options{Seed: 61, Tokens: []string{"tok-a", "tok-b"}},
		platformsim.Scale{Repos: 3, TagsPerRepo: 3, HistoryPerTag: 4, Advisories: 6, NestedRepos: 1, PublicImages: -1})
	dir := t.TempDir()
	a := &node{name: "a", token: "tok-a", dbPath: filepath.Join(dir, "a.db")}
	b := &node{name: "b", token: "tok-b", dbPath: filepath.Join(dir, "b.db")}
	f := &node{name: "f", token: "none", dbPath: filepath.Join(dir, "f.db")}
	for _, n := range []*node{a, b, f} {
		n.cfg = clusterNodeConfig(t, simURL, ns.URL(), n)
		withQuery(t, n.cfg, fmt.Sprintf("prefix = \"q-%s\"\nmax_wait = \"2s\"", n.name))
	}
	a.start(t, "run")
	testutil.WaitFor(t, 30*time.Second, "a to lead and finish its baseline", func() bool {
		return metaOf(a.dbPath, "role") == "leader" && metaOf(a.dbPath, "baseline_time") != ""
	})
	b.start(t, "run")
	f.start(t, "follow")
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js := testutil.JetStream(t, ns.URL())
	clients := map[string]*query.Client{}
	roles := map[string]string{"a": "leader", "b": "standby", "f": "follower"}
	for _, n := range []*node{a, b, f} {
		clients[n.name] = &query.Client{NC: nc, Prefix: "q-" + n.name}
	}
	lastSeq := func() uint64 {
		s, err := js.Stream(context.Background(), "SYNCD")
		if err != nil {
			t.Fatal(err)
		}
		info, err := s.Info(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		return info.State.LastSeq
	}
	// Every replica answers, in its role, at the stream's last sequence,
	// once it has applied the stream.
	converged := func() {
		t.Helper()
		testutil.Eventually(t, 30*time.Second, func() error {
			last := lastSeq()
			for name, c := range clients {
				var pos query.PositionReply
				if err := ask(c, query.PositionEP, nil, &pos); err != nil {
					return fmt.Errorf("%s: %w", name, err)
				}
				if pos.Role != roles[name] || !pos.Ready || pos.StreamSeq != last {
					return fmt.Errorf(
						"%s: position %+v, want %s, ready, at the stream's last sequence %d",
						name,
						pos,
						roles[name],
						last,
					)
				}
			}
			return nil
		})
	}
	converged()
	waitSameState(t, 20*time.Second, b.dbPath, a.dbPath)
	waitSameState(t, 20*time.Second, f.dbPath, a.dbPath)

	truth := sim.Truth()
	for name, c := range clients {
		for _, tt := range testutil.TagsWithHistory(truth) {
			// tag.at now, repo.tags and digest.where: the current state.
			var now query.TagAtReply
			if err := ask(c, query.TagAt, query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name}, &now); err != nil {
				t.Fatalf("%s: tag.at %s:%s: %v", name, tt.Path, tt.Tag.Name, err)
			}
			if now.Digest != tt.Tag.Digest || now.Until != nil {
				t.Errorf("%s: tag.at %s:%s now = %+v, want %s", name, tt.Path, tt.Tag.Name, now, tt.Tag.Digest)
			}
			var where query.DigestWhereReply
			if err := ask(c, query.DigestWhere, query.DigestWhereRequest{Digest: tt.Tag.Digest}, &where); err != nil {
				t.Fatalf("%s: digest.where %s: %v", name, tt.Tag.Digest, err)
			}
			if !slices.ContainsFunc(where.Intervals, func(iv query.Interval) bool {
				return iv.Repo == tt.Path && iv.Tag == tt.Tag.Name && iv.Until == nil
			}) {
				t.Errorf(
					"%s: digest.where %s = %+v, want %s:%s until now among them",
					name,
					tt.Tag.Digest,
					where.Intervals,
					tt.Path,
					tt.Tag.Name,
				)
			}
			// tag.history: the leader's is the simulator's; the others
			// hold the same records at the same positions.
			var hist query.TagHistoryReply
			if err := ask(c, query.TagHistory, query.TagHistoryRequest{Repo: tt.Path, Tag: tt.Tag.Name}, &hist); err != nil {
				t.Fatalf("%s: tag.history %s:%s: %v", name, tt.Path, tt.Tag.Name, err)
			}
			if name == "a" && len(hist.Records) != len(tt.History) {
				t.Errorf("leader: %s:%s has %d records, want %d", tt.Path, tt.Tag.Name, len(hist.Records), len(tt.History))
			}
			for _, rec := range hist.Records {
				if rec.Seq >= int64(len(tt.History)) || rec.Digest != tt.History[rec.Seq].Digest {
					t.Errorf("%s: %s:%s record %+v is not the simulator's", name, tt.Path, tt.Tag.Name, rec)
				}
			}
		}
		for _, r := range truth.Repos {
			var tags query.RepoTagsReply
			if err := ask(c, query.RepoTags, query.RepoTagsRequest{Repo: r.Path}, &tags); err != nil {
				t.Fatalf("%s: repo.tags %s: %v", name, r.Path, err)
			}
			var want, got []string
			for _, tg := range truth.Tags {
				if tg.RepoUID == r.UID {
					want = append(want, tg.Name+"="+tg.Digest)
				}
			}
			for _, tg := range tags.Tags {
				got = append(got, tg.Tag+"="+tg.Digest)
			}
			sort.Strings(want)
			sort.Strings(got)
			if !slices.Equal(got, want) {
				t.Errorf("%s: repo.tags %s = %v, want %v", name, r.Path, got, want)
			}
		}
		adv := truth.Advisories[0]
		var advs query.AdvisoriesReply
		if err := ask(
			c,
			query.Advisories,
			query.AdvisoriesRequest{Artifact: adv.ArtifactName, Withdrawn: true},
			&advs,
		); err != nil {
			t.Fatalf("%s: advisories: %v", name, err)
		}
		if !slices.ContainsFunc(advs.Advisories, func(x query.Advisory) bool { return x.AdvisoryID == adv.AdvisoryID }) {
			t.Errorf("%s: advisories of %s = %+v, want %s among them", name, adv.ArtifactName, advs.Advisories, adv.AdvisoryID)
		}
		// Refusals, with their codes.
		var qe *query.Error
		if err := ask(c, query.RepoTags, query.RepoTagsRequest{Repo: "no-such-repo"}, nil); !errors.As(err, &qe) ||
			qe.Code != query.CodeNotFound {
			t.Errorf("%s: unknown repo: %v, want 404", name, err)
		}
		if err := ask(c, query.TagAt, map[string]any{"repo": 1}, nil); !errors.As(err, &qe) ||
			qe.Code != query.CodeBadRequest {
			t.Errorf("%s: malformed: %v, want 400", name, err)
		}
		if err := ask(c, query.PositionEP, query.PositionRequest{MinSeq: lastSeq() + 1000}, nil); !errors.As(err, &qe) ||
			qe.Code != query.CodeUnavailable || qe.Reason != query.ReasonBehind {
			t.Errorf("%s: min_seq beyond the stream: %v, want 503 behind", name, err)
		}
	}

	// Read your writes: a tag moves; once its event is on the stream, each
	// replica asked with min_seq at it answers with the new digest.
	tt := testutil.TagsWithHistory(truth)[0]
	moved := "sha256:" + fmt.Sprintf("%064x", 0xfeed)
	if err := sim.MoveTag(tt.Tag.UID, moved); err != nil {
		t.Fatal(err)
	}
	var seq uint64
	testutil.WaitFor(t, 30*time.Second, "the move on the stream", func() bool {
		m, err := js.Stream(context.Background(), "SYNCD")
		if err != nil {
			return false
		}
		msg, err := m.GetLastMsgForSubject(context.Background(), "syncd.tag.moved.>")
		if err != nil || !strings.Contains(string(msg.Data), moved) {
			return false
		}
		seq = msg.Sequence
		return true
	})
	for name, c := range clients {
		var now query.TagAtReply
		if err := ask(c, query.TagAt, query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name, MinSeq: seq}, &now); err != nil {
			t.Fatalf("%s: tag.at with min_seq %d: %v", name, seq, err)
		}
		if now.StreamSeq < seq || now.Digest != moved {
			t.Errorf("%s: tag.at with min_seq %d = %+v, want %s at %d or later", name, seq, now, moved, seq)
		}
	}
	for _, n := range []*node{a, b, f} {
		n.cmd.Process.Signal(syscall.SIGTERM)
		if err := n.cmd.Wait(); err != nil {
			t.Errorf("%s after SIGTERM: %v; log tail:\n%s", n.name, err, tail(n.out.String(), 20))
		}
	}
}

// TestQuery_Command runs "syncd query" against a single-mode "syncd run":
// each endpoint's human output and --json, the cursor of a page, and the
// exit status of a refusal and of a bad command line.
func TestQuery_Command(t *testing.T) {
	t.Parallel() // it mostly waits: see "Parallel tests" in harness_test.go
	sim, simURL := startSim(
		t,
		11,
		platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 5, Advisories: 4, PublicImages: -1},
	)
	ns := testutil.NATS(t)
	dbPath := filepath.Join(t.TempDir(), "syncd.db")
	cfg := e2eConfig(t, simURL, ns.URL(), dbPath, "@every 1h")
	startDaemon(t, cfg)
	// The histories are read behind the baseline (the backfill); the
	// queries below ask for them.
	waitBaseline(t, dbPath, `SELECT COUNT(*) = 0 FROM backfill`)
	truth := sim.Truth()
	tt := testutil.TagsWithHistory(truth)[0]
	h := tt.History
	name := tt.Path + ":" + tt.Tag.Name
	run := func(args ...string) (int, string, string) {
		t.Helper()
		return runMain(context.Background(), append([]string{"query", "--config", cfg}, args...)...)
	}
	// The service listens once the daemon has started it.
	testutil.WaitFor(t, 20*time.Second, "the query service", func() bool {
		code, _, _ := run("position")
		return code == exitOK
	})
	code, out, stderr := run("position")
	if code != exitOK || !strings.Contains(out, "role") || !strings.Contains(out, "leader") ||
		!strings.Contains(out, "ready            true") {
		t.Errorf("position: exit %d, out %q, stderr %q", code, out, stderr)
	}

	mid := h[2].UpdateTime.UTC().Truncate(time.Millisecond)
	code, out, stderr = run("tag.at", name, "--at", mid.Format(time.RFC3339Nano))
	if code != exitOK || !strings.Contains(out, h[2].Digest) || !strings.Contains(out, "since "+store.FormatTime(mid)) ||
		!strings.Contains(out, "read at stream sequence") {
		t.Errorf("tag.at: exit %d, out %q, stderr %q; want %s since %s", code, out, stderr, h[2].Digest, mid)
	}
	// Flags after the arguments, and JSON.
	code, out, _ = run("tag.history", name, "--limit", "2", "--json")
	var page query.TagHistoryReply
	if err := json.Unmarshal([]byte(out), &page); code != exitOK || err != nil || len(page.Records) != 2 ||
		page.NextCursor == "" {
		t.Fatalf("tag.history --json: exit %d, %v, %q", code, err, out)
	}
	code, out, _ = run("tag.history", name, "--cursor", page.NextCursor)
	if code != exitOK || !strings.Contains(out, h[2].Digest) || strings.Contains(out, h[0].Digest+"\n") {
		t.Errorf("tag.history from the cursor: exit %d, out %q", code, out)
	}
	code, out, _ = run("digest.where", tt.Tag.Digest[:len("sha256:")+16])
	if code != exitOK || !strings.Contains(out, name) || !strings.Contains(out, "now") {
		t.Errorf("digest.where by prefix: exit %d, out %q", code, out)
	}
	code, out, _ = run("repo.tags", tt.Path)
	if code != exitOK || !strings.Contains(out, tt.Tag.Name) || !strings.Contains(out, tt.Tag.Digest) {
		t.Errorf("repo.tags: exit %d, out %q", code, out)
	}
	adv := truth.Advisories[0]
	code, out, _ = run("advisories", "--artifact", adv.ArtifactName, "--withdrawn")
	if code != exitOK || !strings.Contains(out, adv.AdvisoryID) {
		t.Errorf("advisories: exit %d, out %q", code, out)
	}
	// Refused: exit 1 with the code; a bad command line: exit 2.
	if code, _, stderr := run("tag.at", "no-such-repo:latest"); code != exitFailure || !strings.Contains(stderr, "404") {
		t.Errorf("unknown repo: exit %d, stderr %q; want 1 and 404", code, stderr)
	}
	for _, args := range [][]string{{"tag.when", "x"}, {"tag.at", "nginx"}, {"repo.tags"}, {}} {
		if code, _, stderr := run(args...); code != exitUsage {
			t.Errorf("syncd query %q: exit %d, stderr %q; want 2", args, code, stderr)
		}
	}
}

// TestQuery_StreamCapturingTheQueries: a stream whose subjects overlap the
// query prefix would store every query; syncd refuses to start (exit 2),
// naming the key to change.
func TestQuery_StreamCapturingTheQueries(t *testing.T) {
	ns := testutil.NATS(t)
	js := testutil.JetStream(t, ns.URL())
	if _, err := js.CreateStream(
		context.Background(),
		jetstream.StreamConfig{Name: "SYNCD", Subjects: []string{"syncd.>", "syncd-query.*.at"}},
	); err != nil {
		t.Fatal(err)
	}
	cfg := writeFile(t, "follow.toml", fmt.Sprintf("[nats]\nurl = %q\n\n[store]\npath = %q\n\n[admin]\nlisten = \"\"\n",
		ns.URL(), filepath.Join(t.TempDir(), "follower.db")))
	stderr := &syncBuffer{}
	code := NewMain(&syncBuffer{}, stderr, nil).Run(context.Background(), []string{"follow", "--config", cfg})
	if log := stderr.String(); code != exitUsage || !strings.Contains(log, "query.prefix") ||
		!strings.Contains(log, "syncd-query.*.at") {
		t.Errorf(
			"syncd follow exited %d; want 2 and an error naming query.prefix and the stream's subject; log:\n%s",
			code,
			log,
		)
	}
}
