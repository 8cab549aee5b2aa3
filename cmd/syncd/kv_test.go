package main

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestSyncOnce_KVBucketsMatchTruth: after "syncd sync --once", the KV
// buckets hold every live tag, repo and advisory of the simulator's truth
// with its value, and nothing else; and again after the platform changed
// (moves, deprecations, deletions) and a second sync.
func TestSyncOnce_KVBucketsMatchTruth(t *testing.T) {
	sim, simURL := startSim(t, 23, platformsim.Scale{Repos: 5, TagsPerRepo: 4, HistoryPerTag: 5, Advisories: 6})
	ns := testutil.NATS(t)
	cfg := e2eConfig(t, simURL, ns.URL(), t.TempDir()+"/syncd.db", "@hourly")
	js := testutil.JetStream(t, ns.URL())

	for round := range 2 {
		if round > 0 {
			sim.Step(40)
		}
		if code, _, stderr := runMain(context.Background(), "sync", "--once", "--config", cfg); code != exitOK {
			t.Fatalf("round %d: sync --once exited %d: %s", round, code, stderr)
		}
		checkBucketsMatchTruth(t, js, sim.Truth())
	}
}

func checkBucketsMatchTruth(t *testing.T, js jetstream.JetStream, truth platformsim.Truth) {
	t.Helper()
	paths := map[string]string{}
	wantRepos := map[string]string{}
	for _, r := range truth.Repos {
		paths[r.UID] = r.Path
		wantRepos[publish.RepoKey(r.Path)] = r.UID
	}
	gotRepos := kvBucket(t, js, "syncd_repos")
	for key, uid := range wantRepos {
		var v publish.RepoValue
		if err := json.Unmarshal(gotRepos[key], &v); err != nil || v.UID != uid {
			t.Errorf("repo %s: value %s (%v), want uid %s", key, gotRepos[key], err, uid)
		}
	}
	if len(gotRepos) != len(wantRepos) {
		t.Errorf("repos bucket holds %d keys, want the %d live repos", len(gotRepos), len(wantRepos))
	}

	gotTags := kvBucket(t, js, "syncd_tags")
	for _, tg := range truth.Tags {
		key := publish.TagKey(paths[tg.RepoUID], tg.Name)
		var v publish.TagValue
		if err := json.Unmarshal(gotTags[key], &v); err != nil {
			t.Errorf("tag %s: value %q: %v", key, gotTags[key], err)
			continue
		}
		if v.UID != tg.UID || v.Digest != tg.Digest || v.Deprecated != tg.Deprecated {
			t.Errorf("tag %s = %+v, want uid %s digest %s deprecated %v", key, v, tg.UID, tg.Digest, tg.Deprecated)
		}
	}
	if len(gotTags) != len(truth.Tags) {
		t.Errorf("tags bucket holds %d keys, want the %d live tags", len(gotTags), len(truth.Tags))
	}

	gotAdvs := kvBucket(t, js, "syncd_advisories")
	live := 0
	for _, a := range truth.Advisories {
		if a.DeleteTime != nil {
			continue
		}
		live++
		var v publish.AdvisoryValue
		if err := json.Unmarshal(gotAdvs[publish.AdvisoryKey(a.AdvisoryID)], &v); err != nil {
			t.Errorf("advisory %s: %v", a.AdvisoryID, err)
			continue
		}
		if v.UID != a.UID || v.ArtifactName != a.ArtifactName || !slices.Equal(v.Aliases, a.Aliases) ||
			(len(a.Events) > 0 && v.State == "") {
			t.Errorf(
				"advisory %s = %+v, want uid %s, artifact %s, aliases %v and a state",
				a.AdvisoryID,
				v,
				a.UID,
				a.ArtifactName,
				a.Aliases,
			)
		}
	}
	if len(gotAdvs) != live {
		t.Errorf("advisories bucket holds %d keys, want the %d live advisories", len(gotAdvs), live)
	}
}

// kvBucket reads every live key of a bucket with its value.
func kvBucket(t *testing.T, js jetstream.JetStream, bucket string) map[string][]byte {
	t.Helper()
	ctx := context.Background()
	kv, err := js.KeyValue(ctx, bucket)
	if err != nil {
		t.Fatalf("bucket %s: %v", bucket, err)
	}
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	out := map[string][]byte{}
	for e := range w.Updates() {
		if e == nil {
			break
		}
		out[e.Key()] = e.Value()
	}
	return out
}

// TestSyncOnce_KVBucketsBehindAreReported: a "syncd sync --once" whose
// events all reach the stream but whose KV writes JetStream refuses (a
// tags bucket, made by the operator, that takes no value as large as a
// tag's) exits 1 saying so, with the refusal; what it could not write is
// the next start's to reconcile, and the events stay published.
func TestSyncOnce_KVBucketsBehindAreReported(t *testing.T) {
	_, simURL := startSim(t, 29, platformsim.Scale{Repos: 3, TagsPerRepo: 3, HistoryPerTag: 2, Advisories: 2})
	ns := testutil.NATS(t)
	js := testutil.JetStream(t, ns.URL())
	ctx := context.Background()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "SYNCD", Subjects: []string{"syncd.>"}}); err != nil {
		t.Fatal(err)
	}
	for _, b := range []jetstream.KeyValueConfig{
		{Bucket: "syncd_tags", MaxValueSize: 16},
		{Bucket: "syncd_repos"},
		{Bucket: "syncd_advisories"},
	} {
		if _, err := js.CreateKeyValue(ctx, b); err != nil {
			t.Fatal(err)
		}
	}
	cfg := testConfig{simURL: simURL, natsURL: ns.URL(), dbPath: t.TempDir() + "/syncd.db",
		crawl: "schedule = \"@hourly\"\njitter = \"0s\"\nrequests_per_second = 0.0", initialEvents: "snapshot",
		nats: "manage_stream = false"}.write(t)
	code, _, stderr := runMain(ctx, "sync", "--once", "--config", cfg)
	if code != exitFailure {
		t.Fatalf("sync --once exited %d, want %d; stderr:\n%s", code, exitFailure, stderr)
	}
	for _, want := range []string{"every event is published, but the KV buckets are behind", "syncd_tags"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("stderr does not say %q:\n%s", want, stderr)
		}
	}
	s, err := js.Stream(ctx, "SYNCD")
	if err != nil {
		t.Fatal(err)
	}
	if n := s.CachedInfo().State.Msgs; n == 0 {
		t.Error("the stream holds no event")
	}
}
