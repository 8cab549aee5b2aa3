package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// strictWorld is a world whose simulator behaves as the vendor's real
// service does: audiences enforced, tokens by exchange only, the three
// hidden tag families, repos below subgroups, protojson on the wire.
func strictWorld(t *testing.T, natsURL string, opts platformsim.Options, sc platformsim.Scale) *world {
	t.Helper()
	opts.Strict = true
	opts.Tokens = []string{e2eToken} // the test's own admin calls only
	w := &world{t: t, natsURL: natsURL, dbPath: filepath.Join(t.TempDir(), "syncd.db")}
	w.sim, w.simURL = testutil.Sim(t, opts, sc)
	w.takeBaseline()
	return w
}

// createIdentity creates an identity at the root group through the API, as
// "syncd identity create" would, whose claim match is the simulator's
// built-in external issuer and subject.
func createIdentity(t *testing.T, simURL, issuer, subject string) string {
	t.Helper()
	body, _ := json.Marshal(
		map[string]any{"name": "syncd", "claimMatch": map[string]string{"issuer": issuer, "subject": subject}},
	)
	req, _ := http.NewRequest(http.MethodPost, simURL+"/iam/v2/identities/org1", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+e2eToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var id struct{ UID string }
	if err := json.NewDecoder(resp.Body).Decode(&id); err != nil || resp.StatusCode != http.StatusOK || id.UID == "" {
		t.Fatalf("create identity: status %d, uid %q, err %v", resp.StatusCode, id.UID, err)
	}
	return id.UID
}

// TestRun_StrictPlatform runs syncd against the simulator in its strict
// mode, assuming an identity by token exchange whose tokens expire during
// the run (and whose external token is rotated), with repos one and two
// levels below the root group and every tag family: the mirror equals the
// ground truth row for row, and every move, in nested repos and in
// date-stamped tags among them, reaches NATS once, in order.
func TestRun_StrictPlatform(t *testing.T) {
	t.Parallel() // it mostly waits: see "Parallel tests" in harness_test.go
	ns := testutil.NATS(t)
	w := strictWorld(
		t,
		ns.URL(),
		platformsim.Options{Seed: 17, ExchangeTokenTTL: 3 * time.Second},
		platformsim.Scale{
			Repos:         6,
			TagsPerRepo:   2,
			HistoryPerTag: 3,
			Advisories:    6,
			DateTags:      1,
			EpochTags:     1,
			ReferrerTags:  1,
			NestedRepos:   4,
		},
	)
	const subject = "system:serviceaccount:syncd:syncd"
	identity := createIdentity(t, w.simURL, w.sim.ExternalIssuer(), subject)
	rotate := func() string {
		tok, err := w.sim.ExternalToken(subject, "", 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		return tok
	}
	tokenFile := writeFile(t, "external-token", rotate())
	cfg := testConfig{
		simURL:      w.simURL,
		natsURL:     ns.URL(),
		dbPath:      w.dbPath,
		credentials: fmt.Sprintf("identity = %q\nidentity_token_file = %q\nsts_url = %q", identity, tokenFile, w.simURL),
		crawl:       "schedule = \"@every 1s\"\nsweep_schedule = \"@every 3s\"\nadvisories_schedule = \"@every 2s\"\njitter = \"0s\"\nrequests_per_second = 0.0\ntag_families = [\"dates\", \"epochs\", \"referrers\"]",
	}.write(
		t,
	)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := startDaemon(t, cfg)
	rcv := consume(ctx, t, ns.URL())
	// The first sync with its histories, read with the first tokens.
	waitBaseline(t, w.dbPath, `SELECT COUNT(*) = 0 FROM backfill`)

	truth := w.sim.Truth()
	nested, dated := map[string]bool{}, ""
	for _, r := range truth.Repos {
		if strings.Count(r.Path, "/") == 2 {
			nested[r.UID] = true // two levels below the root: <group>/<group>/<repo>
		}
	}
	if len(nested) == 0 {
		t.Fatalf("no repo two levels below the root in %+v", truth.Repos)
	}
	var moved []string
	for _, tg := range truth.Tags {
		switch {
		case nested[tg.RepoUID] && len(moved) < 2:
			moved = append(moved, tg.UID)
		case tg.Family == platformsim.FamilyDates && dated == "":
			dated = tg.UID
			moved = append(moved, tg.UID)
		}
	}
	if dated == "" {
		t.Fatal("no date-stamped tag in the truth")
	}
	for i, uid := range moved {
		if err := w.sim.MoveTag(uid, fmt.Sprintf("sha256:%064x", 0xabc0+i)); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := w.sim.Apply(
		platformsim.Mutation{Kind: platformsim.AdvisoryWithdrawn, UID: truth.Advisories[0].UID},
	); err != nil {
		t.Fatal(err)
	}
	// Every token syncd holds expires upstream (and the external token with
	// them): syncd must exchange a rotated external token and go on.
	w.sim.Advance(2 * time.Hour)
	if err := os.WriteFile(tokenFile, []byte(rotate()), 0o600); err != nil {
		t.Fatal(err)
	}
	for i, uid := range moved {
		if err := w.sim.MoveTag(uid, fmt.Sprintf("sha256:%064x", 0xdef0+i)); err != nil {
			t.Fatal(err)
		}
	}

	db := openReader(t, w.dbPath)
	var mdiff, ediff string
	testutil.WaitFor(t, 60*time.Second, "the mirror and the events to match the truth", func() bool {
		truth := w.sim.Truth()
		mdiff, ediff = mirrorDiff(db, truth), w.movesDiff(rcv, truth)
		return mdiff == "" && ediff == ""
	})
	d.stop(t)

	rcv.mu.Lock()
	defer rcv.mu.Unlock()
	for _, uid := range moved {
		if n := len(rcv.moves[uid]); n != 2 {
			t.Errorf("tag %s: %d tag.moved events, want 2", uid, n)
		}
	}
	for _, r := range truth.Repos {
		if !nested[r.UID] {
			continue
		}
		for _, uid := range moved {
			if strings.HasPrefix(uid, r.UID+"/") {
				if want := "syncd.tag.moved." + r.Path; rcv.subjects[uid] != want {
					t.Errorf("moves of %s published on %q, want %q", uid, rcv.subjects[uid], want)
				}
			}
		}
	}
	var withdrawn, raws int
	db.QueryRow(`SELECT count(*) FROM advisories WHERE uid = ? AND deleted_time IS NOT NULL`, truth.Advisories[0].UID).
		Scan(&withdrawn)
	if withdrawn != 1 {
		t.Errorf("the advisory with deleteTime is not withdrawn in the mirror")
	}
	// What syncd does not model yet is kept: the gateway's unknown fields
	// are in the raw JSON.
	db.QueryRow(`SELECT count(*) FROM repos WHERE json_extract(raw, '$.` + platformsim.FutureField + `') IS NOT NULL`).
		Scan(&raws)
	if raws == 0 {
		t.Errorf("no repo's raw JSON holds the unknown field %s", platformsim.FutureField)
	}
	if st := w.sim.Stats(); st.Exchanges < 4 {
		t.Errorf("%d token exchanges, want at least 4 (two audiences, exchanged again after expiry)", st.Exchanges)
	}
	if log := d.stderr.String(); strings.Contains(log, e2eToken) || strings.Contains(log, "eyJ") {
		t.Errorf("a token reached the log")
	}
}

// TestRun_FailingReposShown breaks one repo's history (404) and another's
// (403): the daemon finishes the crawl and its baseline, publishes every
// other event, and shows the failing tags in /metrics and "syncd status";
// once they answer, the next run recovers them.
func TestRun_FailingReposShown(t *testing.T) {
	sim, simURL := startSim(t, 41, platformsim.Scale{Repos: 4, TagsPerRepo: 2, HistoryPerTag: 3, Advisories: 2})
	truth := sim.Truth()
	gone, denied := truth.Repos[0], truth.Repos[1]
	sim.AddFaults(
		platformsim.Fault{Name: "broken", Image: "acme/" + gone.Path, Status: http.StatusNotFound},
		platformsim.Fault{Name: "broken", Image: "acme/" + denied.Path, Status: http.StatusForbidden},
	)
	ns := testutil.NATS(t)
	dbPath := filepath.Join(t.TempDir(), "syncd.db")
	adminLn := testutil.Listen(t)
	adminAddr := adminLn.Addr().String()
	cfg := testConfig{simURL: simURL, natsURL: ns.URL(), dbPath: dbPath, adminListen: adminAddr, initialEvents: "snapshot",
		crawl: "schedule = \"@every 1h\"\njitter = \"0s\"\nrequests_per_second = 0.0"}.write(t)
	d := startDaemon(t, cfg, adminLn)
	waitBaseline(t, dbPath)
	var body string
	testutil.WaitFor(t, 20*time.Second, "every event published and the failures shown", func() bool {
		_, body = httpGet(t, "http://"+adminAddr+"/metrics")
		created, _ := metricValue(body, `syncd_events_published_total{type="tag.created"}`)
		failing, _ := metricValue(body, `syncd_crawl_failures{kind="tag"}`)
		_, ran := metricValue(body, `syncd_crawl_runs_total{crawl_job="backfill",outcome="partial"}`)
		return created == float64(len(truth.Tags)) && failing == 4 && ran
	})
	// The histories are read in the backfill beside the crawl: its pass is
	// the partial run.
	if v, _ := metricValue(body, `syncd_crawl_runs_total{crawl_job="backfill",outcome="partial"}`); v != 1 {
		t.Errorf("partial backfill runs = %v, want 1", v)
	}
	if v, ok := metricValue(body, `syncd_crawl_failures{kind="repo"}`); !ok || v != 0 {
		t.Errorf("repo failures = %v (found %v), want 0: the repos' listings worked", v, ok)
	}
	d.stop(t)

	code, out, stderr := runMain(context.Background(), "status", "--config", cfg)
	if code != exitOK {
		t.Fatalf("status exited %d: %s", code, stderr)
	}
	for _, want := range []string{"failing tag", gone.Path + ":", denied.Path + ":", "404", "403", "partial"} {
		if !strings.Contains(out, want) {
			t.Errorf("status does not say %q:\n%s", want, out)
		}
	}

	sim.RemoveFaults("broken")
	if code, _, stderr := runMain(context.Background(), "sync", "--once", "--config", cfg); code != exitOK {
		t.Fatalf("sync --once exited %d: %s", code, stderr)
	}
	_, out, _ = runMain(context.Background(), "status", "--json", "--config", cfg)
	var rep struct {
		Failures []json.RawMessage `json:"failures"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil || len(rep.Failures) != 0 {
		t.Errorf("after recovery status --json has %d failures (err %v):\n%s", len(rep.Failures), err, out)
	}
	if diff := mirrorDiff(openReader(t, dbPath), sim.Truth()); diff != "" {
		t.Errorf("the mirror differs from the truth after recovery:\n%s", diff)
	}
}
