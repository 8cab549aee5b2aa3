package main

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

const e2eToken = "e2e-secret-token-4f1c"

// startSim serves a small simulated organization on a loopback port.
func startSim(t *testing.T, seed int64, sc platformsim.Scale) (*platformsim.Sim, string) {
	t.Helper()
	return testutil.Sim(t, platformsim.Options{Seed: seed, Tokens: []string{e2eToken}}, sc)
}

type cloudEvent struct {
	SpecVersion string `json:"specversion"`
	ID          string `json:"id"`
	Type        string `json:"type"`
	Source      string `json:"source"`
	Subject     string `json:"subject"`
	Time        string `json:"time"`
	Data        struct {
		Before struct{ Digest string } `json:"before"`
		After  struct {
			Digest, Name, Repo string
		} `json:"after"`
	} `json:"data"`
	natsSubject, msgID, contentType string
}

// TestRun_EndToEnd runs the daemon against the simulator and a real NATS
// server: after the silent baseline crawl, two moves of one tag upstream
// reach a JetStream consumer as two ordered tag.moved CloudEvents with
// before and after digests, and the mirror holds the new history.
func TestRun_EndToEnd(t *testing.T) {
	sim, simURL := startSim(t, 7, platformsim.Scale{Repos: 3, TagsPerRepo: 3, HistoryPerTag: 5, Advisories: 2})
	ns := testutil.NATS(t)
	dbPath := filepath.Join(t.TempDir(), "data", "syncd.db")
	cfg := e2eConfig(t, simURL, ns.URL(), dbPath, "@every 1s")
	ctx := context.Background()
	d := startDaemon(t, cfg)
	stderr := d.stderr
	waitBaseline(t, dbPath)
	db := openReader(t, dbPath)
	var tags int
	if err := db.QueryRow(`SELECT count(*) FROM tags`).Scan(&tags); err != nil || tags != 9 {
		t.Fatalf("tags in mirror = %d (%v), want 9", tags, err)
	}

	js := testutil.JetStream(t, ns.URL())
	cons, err := js.OrderedConsumer(ctx, "SYNCD", jetstream.OrderedConsumerConfig{FilterSubjects: []string{"syncd.>"}})
	if err != nil {
		t.Fatal(err)
	}

	truth := sim.Truth()
	tag := truth.Tags[0]
	var repoName string
	for _, r := range truth.Repos {
		if r.UID == tag.RepoUID {
			repoName = r.Name
		}
	}
	d1, d2 := "sha256:"+strings.Repeat("1", 64), "sha256:"+strings.Repeat("2", 64)
	sim.Advance(time.Second)
	if err := sim.MoveTag(tag.UID, d1); err != nil {
		t.Fatal(err)
	}
	sim.Advance(time.Second)
	if err := sim.MoveTag(tag.UID, d2); err != nil {
		t.Fatal(err)
	}

	var moved []cloudEvent
	deadline := time.Now().Add(30 * time.Second)
	for len(moved) < 2 && time.Now().Before(deadline) {
		batch, err := cons.Fetch(10, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			t.Fatal(err)
		}
		for m := range batch.Messages() {
			var ev cloudEvent
			if err := json.Unmarshal(m.Data(), &ev); err != nil {
				t.Fatalf("message on %s is not JSON: %v", m.Subject(), err)
			}
			ev.natsSubject, ev.msgID, ev.contentType = m.Subject(), m.Headers().
				Get("Nats-Msg-Id"),
				m.Headers().
					Get("Content-Type")
			if ev.Type == "dev.syncd.tag.moved" && ev.Subject == tag.UID {
				moved = append(moved, ev)
			}
		}
	}
	if len(moved) != 2 {
		t.Fatalf("got %d tag.moved events for %s, want 2; log:\n%s", len(moved), tag.UID, stderr.String())
	}
	for i, want := range []struct{ before, after string }{{tag.Digest, d1}, {d1, d2}} {
		ev := moved[i]
		if ev.Data.Before.Digest != want.before || ev.Data.After.Digest != want.after {
			t.Errorf(
				"move %d: before=%s after=%s, want %s -> %s",
				i,
				ev.Data.Before.Digest,
				ev.Data.After.Digest,
				want.before,
				want.after,
			)
		}
		if ev.SpecVersion != "1.0" || ev.ID == "" || ev.ID != ev.msgID {
			t.Errorf(
				"move %d: specversion=%q id=%q Nats-Msg-Id=%q; want 1.0 and id == Nats-Msg-Id",
				i,
				ev.SpecVersion,
				ev.ID,
				ev.msgID,
			)
		}
		if ev.contentType != "application/cloudevents+json" {
			t.Errorf("move %d: Content-Type=%q", i, ev.contentType)
		}
		if want := "syncd.tag.moved." + repoName; ev.natsSubject != want {
			t.Errorf("move %d: NATS subject=%q, want %q", i, ev.natsSubject, want)
		}
		if ev.Data.After.Repo != repoName || ev.Data.After.Name != tag.Name {
			t.Errorf("move %d: after names %s:%s, want %s:%s", i, ev.Data.After.Repo, ev.Data.After.Name, repoName, tag.Name)
		}
	}

	// The mirror holds the moves: the tag's digest and its whole history.
	var digest string
	var history int
	testutil.WaitFor(t, 10*time.Second, "the mirror to show the new digest", func() bool {
		db.QueryRow(`SELECT digest FROM tags WHERE uid = ?`, tag.UID).Scan(&digest)
		return digest == d2
	})
	if err := db.QueryRow(`SELECT count(*) FROM tag_history WHERE tag_uid = ?`, tag.UID).Scan(&history); err != nil {
		t.Fatal(err)
	}
	if got, want := history, len(truth.History[tag.UID])+2; got != want {
		t.Errorf("history rows=%d, want %d", got, want)
	}
	var unpublished int
	testutil.WaitFor(t, 10*time.Second, "the outbox to drain", func() bool {
		db.QueryRow(`SELECT count(*) FROM events WHERE published_time IS NULL`).Scan(&unpublished)
		return unpublished == 0
	})

	d.stop(t)
	// One log line per published event (at debug outside the demo).
	if n := strings.Count(stderr.String(), `"msg":"published event"`); n < 2 {
		t.Errorf("%d 'published event' log lines, want one per event (at least the 2 moves)", n)
	}
	if strings.Contains(stderr.String(), e2eToken) {
		t.Fatal("the platform token appears in the log")
	}
}

// TestRun_PushReachesNATS: syncd registers its subscription, and a tag
// moved upstream reaches a JetStream consumer through the push alone: the
// crawl schedule is hourly, and no crawl runs in between.
func TestRun_PushReachesNATS(t *testing.T) { pushScenario(t, "@every 1h", false, false) }

// TestRun_DroppedPushCaughtByCrawl: when the platform never delivers the
// push, the next scheduled crawl publishes the move.
func TestRun_DroppedPushCaughtByCrawl(t *testing.T) { pushScenario(t, "@every 2s", true, false) }

// TestRun_StrictPushOfNestedDateTag pushes a move of a date-stamped tag in
// a repo below subgroups, from the simulator in its strict mode (the push
// names the repo by its registry path), to syncd holding a static platform
// token and a registry token: it reaches NATS through the push alone.
func TestRun_StrictPushOfNestedDateTag(t *testing.T) { pushScenario(t, "@every 1h", false, true) }

func pushScenario(t *testing.T, schedule string, dropPushes, strict bool) {
	const registryToken = "e2e-registry-token-77aa"
	sc := platformsim.Scale{Repos: 3, TagsPerRepo: 3, HistoryPerTag: 4}
	if strict {
		sc.DateTags, sc.NestedRepos = 1, 2
	}
	sim, simURL := testutil.Sim(
		t,
		platformsim.Options{
			Seed:           21,
			Tokens:         []string{e2eToken},
			AllowHTTPSinks: true,
			Strict:         strict,
			RegistryTokens: []string{registryToken},
		},
		sc,
	)
	ns := testutil.NATS(t)
	dbPath := filepath.Join(t.TempDir(), "syncd.db")
	evLn := testutil.Listen(t)
	addr := evLn.Addr().String()
	cfg := testConfig{simURL: simURL, natsURL: ns.URL(), dbPath: dbPath,
		crawl: fmt.Sprintf(
			"schedule = %q\nsweep_schedule = \"\"\nadvisories_schedule = \"\"\nsubscriptions_schedule = \"@every 1h\"\njitter = \"0s\"",
			schedule,
		),
		events:      fmt.Sprintf("listen = %q\nsink_url = \"http://%s/events\"\nissuer = %q", addr, addr, simURL),
		credentials: fmt.Sprintf("token = %q\nregistry_token = %q", e2eToken, registryToken),
	}.write(t)
	ctx := context.Background()
	d := startDaemon(t, cfg, evLn)
	stderr := d.stderr
	// Once the first sync's histories are read: the backfill beside the
	// schedule would read a pending tag's move itself.
	waitBaseline(
		t,
		dbPath,
		`SELECT count(*) FROM subscriptions WHERE deleted_time IS NULL`,
		`SELECT COUNT(*) = 0 FROM backfill`,
	)
	db := openReader(t, dbPath)
	var runsBefore int
	// Crawls of the schedule: a backfill pass is recorded as a run too.
	before := `SELECT count(*) FROM crawl_runs WHERE job != 'backfill'`
	if dropPushes {
		// A crawl already under way may be the one that catches the move.
		before += ` AND finished_time IS NOT NULL`
	}
	db.QueryRow(before).Scan(&runsBefore)

	js := testutil.JetStream(t, ns.URL())
	cons, err := js.OrderedConsumer(
		ctx,
		"SYNCD",
		jetstream.OrderedConsumerConfig{
			FilterSubjects: []string{"syncd.tag.moved.>"},
			DeliverPolicy:  jetstream.DeliverNewPolicy,
		},
	)
	if err != nil {
		t.Fatal(err)
	}
	if dropPushes {
		sim.SetDeliveryFaults(platformsim.DeliveryFaults{DropRate: 1})
	}
	truth := sim.Truth()
	tag := truth.Tags[4]
	if strict {
		for _, tg := range truth.Tags {
			if p, _ := sim.RegistryPath(tg.RepoUID); strings.Contains(p, "/") && tg.Family == platformsim.FamilyDates {
				tag = tg
			}
		}
		if tag.Family != platformsim.FamilyDates {
			t.Fatal("no date-stamped tag in a nested repo")
		}
	}
	digest := "sha256:" + strings.Repeat("7", 64)
	sim.Advance(time.Second)
	pushed := time.Now()
	if err := sim.MoveTag(tag.UID, digest); err != nil {
		t.Fatal(err)
	}
	msg, err := cons.Next(jetstream.FetchMaxWait(10 * time.Second))
	if err != nil {
		t.Fatalf("no tag.moved event arrived: %v; log:\n%s", err, stderr.String())
	}
	latency := time.Since(pushed)
	var ev cloudEvent
	if err := json.Unmarshal(msg.Data(), &ev); err != nil {
		t.Fatal(err)
	}
	if ev.Subject != tag.UID || ev.Data.After.Digest != digest || ev.Data.Before.Digest != tag.Digest {
		t.Fatalf(
			"event subject=%s %s -> %s, want %s %s -> %s",
			ev.Subject,
			ev.Data.Before.Digest,
			ev.Data.After.Digest,
			tag.UID,
			tag.Digest,
			digest,
		)
	}
	var runsAfter int
	db.QueryRow(`SELECT count(*) FROM crawl_runs WHERE job != 'backfill'`).Scan(&runsAfter)
	if dropPushes {
		if runsAfter == runsBefore {
			t.Fatal("the move arrived with pushes dropped and no crawl run")
		}
	} else {
		if runsAfter != runsBefore {
			t.Fatalf("a crawl ran (%d -> %d runs): the event did not come through the push alone", runsBefore, runsAfter)
		}
		t.Logf("push to JetStream: %s", latency)
		if latency > 2*time.Second {
			t.Errorf("push reached NATS after %s, want within 2s", latency)
		}
	}
	d.stop(t)
}
