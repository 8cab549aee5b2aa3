package publish_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// kvTestConfig names the buckets of a test.
func kvTestConfig() publish.KVConfig {
	return publish.KVConfig{Tags: "test_tags", Repos: "test_repos", Advisories: "test_advisories", History: 5}
}

// mustOpenKV opens the buckets on js for st.
func mustOpenKV(tb testing.TB, js jetstream.JetStream, st publish.KVSource) *publish.KV {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	k, err := publish.OpenKV(ctx, js, kvTestConfig(), st)
	if err != nil {
		tb.Fatalf("open KV: %v", err)
	}
	return k
}

// bucketContents returns every live key of kv with its value.
func bucketContents(tb testing.TB, kv jetstream.KeyValue) map[string][]byte {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		tb.Fatalf("watch %s: %v", kv.Bucket(), err)
	}
	defer w.Stop()
	out := map[string][]byte{}
	for e := range w.Updates() {
		if e == nil {
			return out
		}
		out[e.Key()] = e.Value()
	}
	tb.Fatalf("watch %s ended early", kv.Bucket())
	return nil
}

// tagValues decodes the tags bucket.
func tagValues(tb testing.TB, kv jetstream.KeyValue) map[string]publish.TagValue {
	tb.Helper()
	out := map[string]publish.TagValue{}
	for k, v := range bucketContents(tb, kv) {
		var tv publish.TagValue
		if err := json.Unmarshal(v, &tv); err != nil {
			tb.Fatalf("tag %s: %v", k, err)
		}
		out[k] = tv
	}
	return out
}

func TestKVKey_Escaping(t *testing.T) {
	valid := regexp.MustCompile(`^[-/_=a-zA-Z0-9]+$`) // a key's characters, less the token separator
	for _, s := range []string{
		"nginx",
		"charts/cert-manager",
		"1.27",
		"",
		"=",
		"a=b",
		"x y",
		"ünï",
		"latest-dev",
		"=2E",
		"a.b.c",
		"*",
		">",
	} {
		tok := publish.EscapeKeyToken(s)
		if !valid.MatchString(tok) {
			t.Errorf("EscapeKeyToken(%q)=%q, not one token of a KV key", s, tok)
		}
		back, err := publish.UnescapeKeyToken(tok)
		if err != nil || back != s {
			t.Errorf("UnescapeKeyToken(%q)=%q, %v; want %q", tok, back, err, s)
		}
	}
	if got, want := publish.TagKey("charts/cert-manager", "1.27"), "charts/cert-manager.1=2E27"; got != want {
		t.Errorf("TagKey=%q, want %q", got, want)
	}
	repo, tag, err := publish.SplitTagKey(publish.TagKey("a.b", "v1.0"))
	if err != nil || repo != "a.b" || tag != "v1.0" {
		t.Errorf("SplitTagKey=(%q, %q, %v), want (a.b, v1.0)", repo, tag, err)
	}
	for _, bad := range []string{"=4", "=ZZ"} {
		if _, err := publish.UnescapeKeyToken(bad); err == nil {
			t.Errorf("UnescapeKeyToken(%q): no error", bad)
		}
	}
}

// TestKV_WatchSeesChangesInOrder: a tag's move, deprecation and deletion
// reach a watcher of its repo's keys as two puts and a delete, in order.
func TestKV_WatchSeesChangesInOrder(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	c := mustConnect(t, srv.config(nil))
	st := mustOpenStore(t)
	k := mustOpenKV(t, c.JS, st)
	p := newProducer(t, st)
	p.addRepos(ctx, "app", 2, 2)
	startRelay(t, publish.NewRelay(c.JS, st, srv.config(nil), publish.WithKV(k)))
	tags := k.Bucket("tag")
	testutil.WaitFor(
		t,
		10*time.Second,
		"the created tags in the bucket",
		func() bool { return len(bucketContents(t, tags)) == 4 },
	)

	wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	w, err := tags.Watch(wctx, publish.EscapeKeyToken("app-0")+".*", jetstream.UpdatesOnly())
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()

	repo, tag := p.repos[0], p.tags[p.repos[0].UID][0]
	p.move(ctx, tag.UID, 1)
	dep := tag
	dep.Digest, dep.Deprecated, dep.UpdateTime = digest(1), true, baseTime.Add(time.Hour)
	if _, _, err := st.ApplyTags(ctx, repo, []store.Tag{dep}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.MarkTagsDeleted(ctx, []string{tag.UID}); err != nil {
		t.Fatal(err)
	}

	type seen struct {
		op         jetstream.KeyValueOp
		digest     string
		deprecated bool
	}
	want := []seen{
		{jetstream.KeyValuePut, digest(1), false},
		{jetstream.KeyValuePut, digest(1), true},
		{jetstream.KeyValueDelete, "", false},
	}
	var got []seen
	for len(got) < len(want) {
		select {
		case e := <-w.Updates():
			if e == nil {
				continue
			}
			if e.Key() != "app-0.v0" {
				t.Errorf("watch of app-0.* saw key %s, which did not change", e.Key())
				continue
			}
			s := seen{op: e.Operation()}
			if e.Operation() == jetstream.KeyValuePut {
				var v publish.TagValue
				if err := json.Unmarshal(e.Value(), &v); err != nil {
					t.Fatal(err)
				}
				s.digest, s.deprecated = v.Digest, v.Deprecated
				if v.EventID == "" || v.Repo != "app-0" || v.Tag != "v0" {
					t.Errorf("value %s: want the event id, repo app-0 and tag v0", e.Value())
				}
			}
			got = append(got, s)
		case <-wctx.Done():
			t.Fatalf("watch saw %v before the deadline, want %v", got, want)
		}
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("update %d = %+v, want %+v", i, got[i], want[i])
		}
	}
}

// TestKV_ReconcileWithMirror: what the baseline found without events gets
// into the buckets when it ends, with advisories' states, and a key of a
// resource that is not live is deleted.
func TestKV_ReconcileWithMirror(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	c := mustConnect(t, srv.config(nil))
	st, err := store.Open(ctx, filepath.Join(t.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k := mustOpenKV(t, c.JS, st)
	if _, err := k.Bucket("tag").Put(ctx, "gone.v1", []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, st)
	p.addRepos(ctx, "base", 2, 3) // in the baseline: no events
	adv := store.Advisory{
		UID:          "adv-1",
		AdvisoryID:   "CGA-aaaa-bbbb-cccc",
		ArtifactName: "base-0",
		Aliases:      []string{"CVE-2026-1"},
		CreateTime:   baseTime,
		UpdateTime:   baseTime,
		Events: []store.AdvisoryEvent{
			{UID: "e1", Type: store.StepDetected, CreateTime: baseTime},
			{UID: "e2", Type: store.StepFixed, CreateTime: baseTime.Add(time.Hour), FixedVersion: "1.2.3"},
			{UID: "e3", Type: "false_positive", CreateTime: baseTime.Add(2 * time.Hour), ReviewState: "REVIEW_STATE_PENDING"},
		},
	}
	if _, err := st.ApplyAdvisories(ctx, []store.Advisory{adv}); err != nil {
		t.Fatal(err)
	}
	r := publish.NewRelay(c.JS, st, srv.config(nil), publish.WithKV(k))
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if n := len(bucketContents(t, k.Bucket("tag"))); n != 1 {
		t.Errorf("during the baseline the tags bucket holds %d keys, want the stale one untouched until it ends", n)
	}
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	if err := r.Flush(ctx); err != nil {
		t.Fatal(err)
	}
	got := tagValues(t, k.Bucket("tag"))
	if len(got) != 6 {
		t.Errorf("tags bucket holds %d keys, want the 6 live tags: %v", len(got), got)
	}
	if _, ok := got["gone.v1"]; ok {
		t.Error("the key of a tag the mirror does not have is still in the bucket")
	}
	if v := got["base-1.v2"]; v.Digest != digest(0) || v.UID != "base-uid-1-tag-2" {
		t.Errorf("base-1.v2 = %+v, want digest %s", v, digest(0))
	}
	if n := len(bucketContents(t, k.Bucket("repo"))); n != 2 {
		t.Errorf("repos bucket holds %d keys, want 2", n)
	}
	var av publish.AdvisoryValue
	if err := json.Unmarshal(bucketContents(t, k.Bucket("advisory"))["CGA-aaaa-bbbb-cccc"], &av); err != nil {
		t.Fatal(err)
	}
	if av.State != store.StepFixed || av.FixedVersion != "1.2.3" || strings.Join(av.Aliases, ",") != "CVE-2026-1" {
		t.Errorf("advisory = %+v, want state fixed (the pending false positive does not count), 1.2.3, CVE-2026-1", av)
	}
}

var errCrash = errors.New("crash point: killed between marking and the KV write")

// TestKV_RepairAfterCrash: a relay that dies after its events were
// published and marked, before their state reached the buckets (an
// in-process crash point standing for a SIGKILL there), leaves the buckets
// behind; the relay of the next start repairs them, event ids included.
func TestKV_RepairAfterCrash(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	c := mustConnect(t, srv.config(nil))
	path := filepath.Join(t.TempDir(), "syncd.db")
	st, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := st.EndBaseline(ctx); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, st)
	p.addRepos(ctx, "app", 1, 2)
	k := mustOpenKV(t, c.JS, st)
	if err := publish.NewRelay(c.JS, st, srv.config(nil), publish.WithKV(k)).Flush(ctx); err != nil {
		t.Fatal(err)
	}

	p.move(ctx, p.tags["app-uid-0"][0].UID, 2)
	if _, err := st.MarkTagsDeleted(ctx, []string{p.tags["app-uid-0"][1].UID}); err != nil {
		t.Fatal(err)
	}
	crashed := 0
	publish.SetBeforeKVApply(k, func([]store.Event) error { crashed++; return errCrash })
	if err := publish.NewRelay(c.JS, st, srv.config(nil), publish.WithKV(k)).Flush(ctx); !errors.Is(err, errCrash) {
		t.Fatalf("flush = %v, want the crash", err)
	}
	if n, _, _ := st.UnpublishedCount(ctx); crashed == 0 || n != 0 {
		t.Fatalf("crash point reached %d times, %d events unpublished; want the events published and the crash", crashed, n)
	}
	before := tagValues(t, k.Bucket("tag"))
	if before["app-0.v0"].Digest != digest(0) || len(before) != 2 {
		t.Fatalf("the crash let the state through: %v", before)
	}
	st.Close()

	st2, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer st2.Close()
	k2 := mustOpenKV(t, c.JS, st2)
	if err := publish.NewRelay(c.JS, st2, srv.config(nil), publish.WithKV(k2)).Flush(ctx); err != nil {
		t.Fatal(err)
	}
	after := tagValues(t, k2.Bucket("tag"))
	v, ok := after["app-0.v0"]
	if !ok || v.Digest != digest(2) || len(after) != 1 {
		t.Fatalf("after the restart the bucket holds %v, want app-0.v0 at %s alone", after, digest(2))
	}
	ids, err := st2.LatestEventIDs(ctx, []string{v.UID})
	if err != nil {
		t.Fatal(err)
	}
	if v.EventID == "" || v.EventID != ids[v.UID] {
		t.Errorf("repaired value's event id = %q, want the last move's %q", v.EventID, ids[v.UID])
	}
}

// TestKV_FullQueueReconciles: when the writer's queue is full and does
// not empty in time (here at once: no wait, the writer held at its first
// write until the drop), the writes are dropped, and the relay reconciles
// the buckets before it is done: Flush returns with every state in them,
// though the writer wrote only the first itself.
func TestKV_FullQueueReconciles(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	c := mustConnect(t, srv.config(nil))
	st := mustOpenStore(t)
	cfg := kvTestConfig()
	cfg.Queue = 1 // every marking holds more: all but the first event are dropped
	k, err := publish.OpenKV(ctx, c.JS, cfg, st)
	if err != nil {
		t.Fatal(err)
	}
	publish.SetKVQueueWait(k, 0)
	applied := 0
	var hookErr error // set on the writer's goroutine, read after Flush
	publish.SetBeforeKVApply(k, func(evs []store.Event) error {
		// Poll on the writer's goroutine, which must not call t.Fatal.
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for deadline := time.Now().Add(10 * time.Second); !publish.KVDirty(k); <-tick.C {
			if time.Now().After(deadline) {
				hookErr = errors.New("a full queue's writes were not dropped within 10s")
				return hookErr
			}
		}
		applied += len(evs)
		return nil
	})
	p := newProducer(t, st)
	p.addRepos(ctx, "app", 2, 3)
	if err := publish.NewRelay(c.JS, st, srv.config(nil), publish.WithKV(k)).Flush(ctx); err != nil {
		t.Fatal(err)
	}
	if hookErr != nil {
		t.Fatal(hookErr)
	}
	if applied > 1 {
		t.Errorf("the writer wrote %d events' states; want all but the first dropped", applied)
	}
	if n, _, _ := st.UnpublishedCount(ctx); n != 0 {
		t.Errorf("%d events unpublished after Flush", n)
	}
	tags := tagValues(t, k.Bucket("tag"))
	for _, r := range p.repos {
		for _, tag := range p.tags[r.UID] {
			if v, ok := tags[publish.TagKey(r.Name, tag.Name)]; !ok || v.Digest != tag.Digest || v.EventID == "" {
				t.Errorf(
					"%s:%s in the bucket = %+v (present %v), want digest %s and its event's id",
					r.Name,
					tag.Name,
					v,
					ok,
					tag.Digest,
				)
			}
		}
	}
	if len(tags) != 6 || len(bucketContents(t, k.Bucket("repo"))) != 2 {
		t.Errorf("buckets hold %d tags and %d repos, want 6 and 2", len(tags), len(bucketContents(t, k.Bucket("repo"))))
	}
}

// TestKV_AStalledWatchDoesNotHoldThePublishes: the reconciliation at a
// relay's start reads the buckets through a watch, which nats.go makes
// and fills with no deadline of its own. With the buckets' connection in
// a black hole (a stream without quorum answers nothing either), the
// watch is given up after watchStall and the pass publishes its events
// all the same; the buckets stay due a reconciliation, which the next
// pass after the heal does. Without the bound, the first pass waited on
// the watch for good and published nothing (TestCluster_ThreeNodes: a new
// leader whose relay never published).
func TestKV_AStalledWatchDoesNotHoldThePublishes(t *testing.T) {
	ctx := context.Background()
	srv, c, proxy, st, k, p := kvThroughProxy(t)
	p.addRepos(ctx, "base", 2, 3)

	publish.SetWatchStall(t, 300*time.Millisecond)
	proxy.BlackHole()
	r := publish.NewRelay(c.JS, st, srv.config(nil), publish.WithKV(k))
	done := make(chan error, 1)
	go func() {
		fctx, cancel := context.WithTimeout(ctx, time.Minute)
		defer cancel()
		done <- r.Flush(fctx)
	}()
	select {
	case err := <-done:
		if err == nil || !strings.Contains(err.Error(), "stalled") || !errors.Is(err, publish.ErrKV) {
			t.Errorf("Flush with the buckets unreachable: %v, want the stalled watch named, as ErrKV", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the relay's pass still waits on the watch of an unreachable bucket after 20 s")
	}
	if err := unpublished(t, st)(); err != nil {
		t.Errorf("with the buckets unreachable: %v", err)
	}
	if want := len(storedEvents(t, st)); want < 8 {
		t.Errorf("the mirror holds %d events, want at least the 2 repos' and 6 tags'", want)
	} else if got := consumeAll(t, c.JS, want); len(got) != want {
		t.Errorf("the stream holds %d events, want the mirror's %d", len(got), want)
	}
	if !publish.KVDirty(k) {
		t.Error("the buckets are not due a reconciliation after a watch that stalled")
	}

	proxy.Heal()
	testutil.Eventually(t, 30*time.Second, func() error {
		if _, err := k.Reconcile(ctx); err != nil {
			return err
		}
		if n := len(tagValues(t, k.Bucket("tag"))); n != 6 {
			return fmt.Errorf("the tags bucket holds %d keys after the heal, want 6", n)
		}
		return nil
	})
}

// TestKV_AnUnreachableBucketDoesNotHoldLaterPublishes: once a
// reconciliation of the buckets failed, the relay's next passes publish
// without trying again until its retry is due, instead of each waiting on
// the watch of buckets that do not answer (10 s by default) before it
// publishes. Readiness names the buckets' failure meanwhile.
func TestKV_AnUnreachableBucketDoesNotHoldLaterPublishes(t *testing.T) {
	ctx := context.Background()
	srv, c, proxy, st, k, p := kvThroughProxy(t)
	p.addRepos(ctx, "first", 1, 2)

	publish.SetWatchStall(t, 300*time.Millisecond)
	publish.SetKVRetry(t, time.Hour, time.Hour)
	proxy.BlackHole()
	var logs logBuffer
	cfg := srv.config(nil)
	cfg.Logger = logs.logger()
	r := publish.NewRelay(c.JS, st, cfg, publish.WithKV(k))
	startRelay(t, r)
	testutil.Eventually(t, 20*time.Second, unpublished(t, st))
	testutil.Eventually(t, 20*time.Second, func() error {
		if err := r.Err(); err == nil || !strings.Contains(err.Error(), "stalled") {
			return fmt.Errorf("relay's Err %v, want the buckets' stalled watch named", err)
		}
		return nil
	})

	// From here an attempt to reconcile could wait an hour on the watch:
	// the relay must not make one before its retry is due.
	publish.SetWatchStall(t, time.Hour)
	p.addRepos(ctx, "second", 1, 2)
	testutil.Eventually(t, 20*time.Second, unpublished(t, st))
	if want := len(storedEvents(t, st)); want < 6 {
		t.Errorf("the mirror holds %d events, want at least the 2 repos' and 4 tags'", want)
	} else if got := consumeAll(t, c.JS, want); len(got) != want {
		t.Errorf("the stream holds %d events, want the mirror's %d", len(got), want)
	}
	if !publish.KVDirty(k) {
		t.Error("the buckets are not due a reconciliation")
	}
	if err := r.Err(); err == nil || !strings.Contains(err.Error(), "stalled") {
		t.Errorf("relay's Err after a pass that did not try again: %v, want the stalled watch still named", err)
	}
	if n := strings.Count(logs.String(), "KV buckets could not be reconciled"); n != 1 {
		t.Errorf("%d failed reconciliations logged, want 1 (the retry is an hour away):\n%s", n, logs.String())
	}
}

// TestKV_RelayRetriesAFailedReconciliation: after the buckets come back,
// the relay reconciles them on its own, with no new event to publish.
func TestKV_RelayRetriesAFailedReconciliation(t *testing.T) {
	ctx := context.Background()
	srv, c, proxy, st, k, p := kvThroughProxy(t)
	p.addRepos(ctx, "base", 2, 3)

	publish.SetWatchStall(t, 300*time.Millisecond)
	publish.SetKVRetry(t, 100*time.Millisecond, 200*time.Millisecond)
	proxy.BlackHole()
	r := publish.NewRelay(c.JS, st, srv.config(nil), publish.WithKV(k))
	startRelay(t, r)
	testutil.Eventually(t, 20*time.Second, unpublished(t, st))
	testutil.Eventually(t, 20*time.Second, func() error {
		if r.Err() == nil {
			return errors.New("the relay reports no failure of the unreachable buckets")
		}
		return nil
	})
	proxy.Heal()
	tags, err := c.JS.KeyValue(ctx, kvTestConfig().Tags) // not through the proxy
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 30*time.Second, func() error {
		if n := len(tagValues(t, tags)); n != 6 {
			return fmt.Errorf("the tags bucket holds %d keys after the heal, want 6", n)
		}
		if err := r.Err(); err != nil {
			return fmt.Errorf("relay's Err after the heal: %w", err)
		}
		return nil
	})
}

// endedWatch is a bucket whose watch delivers entries and then closes,
// as nats.go's does when its context ends or its connection closes.
type endedWatch struct {
	jetstream.KeyValue
	entries []jetstream.KeyValueEntry
}

func (e endedWatch) WatchAll(context.Context, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	ch := make(chan jetstream.KeyValueEntry, len(e.entries))
	for _, x := range e.entries {
		ch <- x
	}
	close(ch)
	return closedWatcher(ch), nil
}

type closedWatcher <-chan jetstream.KeyValueEntry

func (w closedWatcher) Updates() <-chan jetstream.KeyValueEntry { return w }
func (w closedWatcher) Stop() error                             { return nil }

// TestBucketValues_AWatchThatEndsIsNotTheBucket: a watch whose updates
// close before the marker of its last initial value read part of the
// bucket; passing that off as all of it would have a reconciliation skip
// the deletes of the keys it did not see.
func TestBucketValues_AWatchThatEndsIsNotTheBucket(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	c := mustConnect(t, srv.config(nil))
	kv, err := c.JS.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "ended"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.PutString(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}
	a, err := kv.Get(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	got, err := publish.BucketValues(ctx, endedWatch{kv, []jetstream.KeyValueEntry{a}})
	if err == nil || !strings.Contains(err.Error(), "ended") {
		t.Errorf("values of a watch that ended after one: %v, %v; want an error naming the watch's end", got, err)
	}
	if got, err := publish.BucketValues(ctx, kv); err != nil || string(got["a"]) != "1" || len(got) != 1 {
		t.Errorf("values of the bucket: %v, %v; want a=1", got, err)
	}
}

// kvThroughProxy is a server and a connection to it, and buckets of an
// empty mirror written through a connection of their own that goes
// through a fault proxy.
func kvThroughProxy(
	t *testing.T,
) (testServer, *publish.Conn, *testutil.FaultProxy, *store.Store, *publish.KV, *producer) {
	srv := startServer(t, nil)
	c := mustConnect(t, srv.config(nil))
	proxy := testutil.NewFaultProxy(t, strings.TrimPrefix(srv.URL(), "nats://"))
	kc := mustConnect(t, configFor("nats://"+proxy.Addr(), nil))
	st := mustOpenStore(t)
	k := mustOpenKV(t, kc.JS, st)
	return srv, c, proxy, st, k, newProducer(t, st)
}

// epochOnceFailing is a mirror whose KVEpoch fails once, when armed, and
// counts its calls: one a relay pass.
type epochOnceFailing struct {
	publish.KVSource
	armed atomic.Bool
	calls atomic.Int64
}

func (e *epochOnceFailing) KVEpoch(ctx context.Context) (string, error) {
	e.calls.Add(1)
	if e.armed.CompareAndSwap(true, false) {
		return "", errors.New("the mirror could not be read")
	}
	return e.KVSource.KVEpoch(ctx)
}

// TestKV_AFailureThatClearsLeavesTheRelayIdle: a failure that leaves
// nothing to reconcile (the mirror's epoch not read once; the buckets were
// up to date) is cleared at the retry; the relay does not go on waking
// for a retry it has no reason to make (a pass after another, for good).
func TestKV_AFailureThatClearsLeavesTheRelayIdle(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	c := mustConnect(t, srv.config(nil))
	st := mustOpenStore(t)
	src := &epochOnceFailing{KVSource: st}
	k, err := publish.OpenKV(ctx, c.JS, kvTestConfig(), src)
	if err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, st)
	p.addRepos(ctx, "base", 1, 2)
	if _, err := k.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}

	publish.SetKVRetry(t, 50*time.Millisecond, 50*time.Millisecond)
	r := publish.NewRelay(c.JS, st, srv.config(nil), publish.WithKV(k))
	src.armed.Store(true)
	startRelay(t, r)
	testutil.Eventually(t, 20*time.Second, unpublished(t, st))
	// The failure, then the retry that clears it.
	testutil.Eventually(t, 20*time.Second, func() error {
		if src.armed.Load() || src.calls.Load() < 2 || r.Err() != nil {
			return fmt.Errorf("epoch read %d times, relay's Err %v", src.calls.Load(), r.Err())
		}
		return nil
	})
	before := src.calls.Load()
	time.Sleep(500 * time.Millisecond) // what an idle relay does meanwhile: nothing
	if n := src.calls.Load() - before; n > 2 {
		t.Errorf("the relay passed %d times in 500 ms with nothing to publish or reconcile", n)
	}
}
