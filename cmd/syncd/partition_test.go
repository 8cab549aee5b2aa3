package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// This file runs the network faults of docs/cluster.md ("Partitions and a
// slow network"): two "syncd run" replicas and a follower as processes
// against a three-node JetStream cluster whose routes, and each replica's
// connections to each node, go through fault proxies
// (testutil.FaultProxy), while the simulator changes data. Each test ends
// with the same oracle (finish).

// partitionWorld is the cluster, the replicas a and b, the follower f, and
// what watches the stream and the KV buckets from outside the faults.
type partitionWorld struct {
	t     *testing.T
	start time.Time
	cl    *testutil.NATSCluster
	urls  string // the nodes' own client URLs, for the test's clients
	w     *world
	a, b  *node
	f     *node
	// proxies is, by replica name, its fault proxy to each NATS node.
	proxies map[string][]*testutil.FaultProxy
	js      jetstream.JetStream
	ctx     context.Context
	rcv     *received
	kv      *kvRecorder
	ch      *changer
	// noOrderedView, when set, says why finish does not compare what an
	// ordered consumer read during the faults.
	noOrderedView string
}

// startPartitionWorld starts the cluster, a as the leader after its
// baseline, b as its standby (both with lease TTL ttl, and what each of
// opts sets), the follower, the watchers, and the changes.
func startPartitionWorld(t *testing.T, seed int64, ttl time.Duration, opts ...func(*node)) *partitionWorld {
	t.Helper()
	if os.Getenv(clusterTestEnv) == "" {
		t.Skip("make cluster-test runs it (" + clusterTestEnv + "=1)")
	}
	pw := &partitionWorld{t: t, start: time.Now(), proxies: map[string][]*testutil.FaultProxy{}}
	pw.cl = testutil.ProxiedNATSClusterOf(t, 3)
	pw.urls = pw.cl.URLs()
	pw.a, pw.b = &node{name: "a", token: "tok-a-6e1f"}, &node{name: "b", token: "tok-b-2c9a"}
	sim, simURL := testutil.Sim(t, platformsim.Options{Seed: seed, Tokens: []string{pw.a.token, pw.b.token}},
		platformsim.Scale{Repos: 3, TagsPerRepo: 3, HistoryPerTag: 4, Advisories: 4, PublicImages: -1})
	dir := t.TempDir()
	for _, n := range []*node{pw.a, pw.b} {
		var urls []string
		for _, s := range pw.cl.Nodes {
			p := testutil.NewFaultProxy(t, strings.TrimPrefix(s.URL(), "nats://"))
			pw.proxies[n.name] = append(pw.proxies[n.name], p)
			urls = append(urls, "nats://"+p.Addr())
		}
		n.dbPath, n.replicas, n.admin, n.snapshotEvery, n.ttl = filepath.Join(dir, n.name+".db"), 3, freePort(t), "2s", ttl
		for _, o := range opts {
			o(n)
		}
		n.cfg = clusterNodeConfig(t, simURL, strings.Join(urls, ","), n)
	}
	pw.f = &node{name: "f", token: "no-platform-access", dbPath: filepath.Join(dir, "f.db"), replicas: 3}
	pw.f.cfg = clusterNodeConfig(t, simURL, pw.urls, pw.f)
	pw.w = &world{t: t, sim: sim, simURL: simURL, natsURL: pw.urls}
	pw.w.takeBaseline()
	pw.js = testutil.JetStream(t, pw.urls, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	pw.ctx = ctx
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range []*node{pw.a, pw.b, pw.f} {
				if n.out != nil {
					t.Logf("%s log tail:\n%s", n.name, logTail(n.out.String(), 40))
					t.Logf("%s role and KV lines:\n%s", n.name, roleLines(n.out.String()))
					keepLog(t, n)
				}
			}
		}
	})

	pw.a.start(t, "run")
	testutil.WaitFor(t, 60*time.Second, "a to lead and finish its baseline", func() bool {
		return metaOf(pw.a.dbPath, "role") == "leader" && metaOf(pw.a.dbPath, "baseline_time") != ""
	})
	pw.b.start(t, "run")
	pw.f.start(t, "follow")
	testutil.WaitFor(t, 30*time.Second, "b to stand by", func() bool {
		return metaOf(pw.b.dbPath, "role") == "standby" && metaOf(pw.b.dbPath, "lease_holder") == "a"
	})
	if err := pw.cl.RoutesProxied(); err != nil {
		t.Fatal(err)
	}
	pw.rcv = consume(ctx, t, pw.urls)
	pw.kv = recordKV(ctx, t, pw.js)
	pw.ch = startChanger(sim)
	time.Sleep(2 * time.Second) // data changes while a leads
	return pw
}

// replicaFaults applies a fault to every connection of a replica to NATS.
func (pw *partitionWorld) replicaFaults(n *node, fault func(*testutil.FaultProxy)) {
	for _, p := range pw.proxies[n.name] {
		fault(p)
	}
}

// roleLines are the lines of a replica's log about its role, catching up
// and the KV buckets: what a failed oracle is read against.
func roleLines(log string) string {
	var out []string
	for _, line := range strings.Split(log, "\n") {
		for _, k := range []string{
			"cluster role",
			"catching up",
			`"leading"`,
			"stopped leading",
			"readying",
			"KV",
			"lease",
			"completing",
		} {
			if strings.Contains(line, k) {
				out = append(out, line)
				break
			}
		}
	}
	return strings.Join(out, "\n")
}

// connectedTo names the NATS nodes a replica has connections to.
func (pw *partitionWorld) connectedTo(n *node) string {
	var names []string
	for i, p := range pw.proxies[n.name] {
		if p.Conns() > 0 {
			names = append(names, pw.cl.Nodes[i].Name())
		}
	}
	return strings.Join(names, "+")
}

// finish stops the changes and checks the oracle with leader as the
// leader and standby as the other replica: the leader's mirror equals the
// truth and its outbox is empty; the stream, read message by message,
// holds every move of every tag once, in order, and every event of the
// leader's mirror exactly once and nothing else; an ordered consumer that
// read it during the faults saw the same moves; no KV key went back to an older state; the standby's resources and
// the follower's whole mirror equal the leader's, and both match the same
// checkpoint. It returns the figures for the log.
func (pw *partitionWorld) finish(leader, standby *node) string {
	t := pw.t
	t.Helper()
	changes := pw.ch.halt()
	truth := pw.w.sim.Truth()
	db := openReader(t, leader.dbPath)
	testutil.Eventually(t, 60*time.Second, func() error {
		if diff := mirrorDiff(db, truth); diff != "" {
			return fmt.Errorf("the leader's mirror differs from the truth:\n%s", diff)
		}
		var unpublished int
		db.QueryRow(`SELECT count(*) FROM events WHERE published_time IS NULL`).Scan(&unpublished)
		if unpublished > 0 {
			return fmt.Errorf("%d events unpublished", unpublished)
		}
		return nil
	})

	// The stream itself, read message by message (not through a
	// consumer), holds every move of every tag once and in order, and
	// exactly the events of the leader's mirror. A crawl may still record
	// a change the mirror-to-truth check did not look at (an advisory's
	// field) and the relay publish it while the two are read, so they are
	// read again, the mirror first, until they agree or the deadline
	// passes: a lost event stays missing.
	var (
		onStream         *received
		expected         map[string]bool
		missing, extra   []string
		total, delivered int
	)
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		expected = eventIDs(t, leader.dbPath)
		var err error
		onStream, err = streamReceived(pw.ctx, t, pw.js)
		if err != nil {
			// The cluster answered that JetStream is not available (a
			// stream leader elected after the heal): read again, as when
			// the two disagree.
			if time.Now().After(deadline) {
				t.Fatal(err)
			}
			t.Logf("reading the stream: %v; reading it again", err)
			continue
		}
		total, delivered = onStream.counts()
		missing, extra = missing[:0], extra[:0]
		for id := range expected {
			if onStream.ids[id] == 0 {
				missing = append(missing, id)
			}
		}
		for id := range onStream.ids {
			if !expected[id] {
				extra = append(extra, id)
			}
		}
		if len(missing)+len(extra) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if diff := pw.w.movesDiff(onStream, truth); diff != "" {
		t.Errorf("the stream's tag moves differ from the truth's:\n%s", diff)
	}
	for _, id := range missing {
		t.Logf("missing from the stream: %s", id)
	}
	for _, id := range extra {
		t.Logf("on the stream, not in the leader's mirror: %s", id)
	}
	if len(missing) > 0 || len(extra) > 0 || total != delivered {
		t.Errorf("events: %d in the leader's mirror, %d distinct on the stream (%d messages): %d missing, %d extra",
			len(expected), delivered, total, len(missing), len(extra))
		// Whether the stream lost a message it stored (a sequence deleted
		// from its middle) or never stored one.
		if s, err := pw.js.Stream(pw.ctx, "SYNCD"); err == nil {
			if info, err := s.Info(pw.ctx, jetstream.WithDeletedDetails(true)); err == nil {
				t.Logf("the stream: seqs %d to %d, %d messages, deleted from its middle: %v",
					info.State.FirstSeq, info.State.LastSeq, info.State.Msgs, info.State.Deleted)
				for seq := max(info.State.FirstSeq, info.State.LastSeq-12); seq <= info.State.LastSeq; seq++ {
					if m, err := s.GetMsg(pw.ctx, seq); err == nil {
						t.Logf("  seq %d: %s %s", seq, m.Subject, m.Header.Get(jetstream.MsgIDHeader))
					}
				}
			}
		}
	}
	// A consumer's view: an ordered consumer that read the stream from the
	// start while the faults happened.
	consumerView := "the same"
	var diff string
	deadline := time.Now().Add(30 * time.Second)
	for ; pw.noOrderedView == "" && time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if diff = pw.w.movesDiff(pw.rcv, truth); diff == "" {
			break
		}
	}
	if pw.noOrderedView != "" {
		consumerView = "not compared: " + pw.noOrderedView
	}
	if diff != "" {
		consumerView = "different"
		t.Errorf(
			"an ordered consumer that read the stream during the faults saw other moves than the stream holds:\n%s",
			diff,
		)
	}

	var kvErr error
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		if kvErr = pw.kv.tagsDiff(truth); kvErr == nil {
			break
		}
	}
	if kvErr != nil {
		// The watcher or the bucket: read the bucket itself.
		tags := kvBucket(t, pw.js, "syncd_tags")
		t.Errorf("%v; the bucket itself holds %d tags, %s", kvErr, len(tags), bucketTagsDiff(tags, truth))
	}
	seen, regressions, olderTimeOnly, details := pw.kv.result()
	if regressions > 0 {
		t.Errorf("%d KV values went back to an older state of their resource:\n%s", regressions, strings.Join(details, "\n"))
	}

	waitSameState(t, 30*time.Second, standby.dbPath, leader.dbPath)
	waitSameMirror(t, 30*time.Second, pw.f.dbPath, leader.dbPath)
	// A change makes a checkpoint after the replicas' last own publications.
	moveATag(t, pw.w.sim)
	var cpSeq string
	testutil.WaitFor(t, 30*time.Second, "the standby and the follower to match the same checkpoint", func() bool {
		cpSeq = metaOf(standby.dbPath, "checkpoint_seq")
		return cpSeq != "" && cpSeq == metaOf(pw.f.dbPath, "checkpoint_seq") &&
			metaOf(standby.dbPath, "checkpoint_result") == "match" && metaOf(pw.f.dbPath, "checkpoint_result") == "match"
	})
	fenced := fmt.Sprintf("a %s, b %s", fencedWritesText(pw.a.admin), fencedWritesText(pw.b.admin))
	for _, n := range []*node{pw.a, pw.b, pw.f} {
		n.cmd.Process.Signal(syscall.SIGTERM)
		if err := n.cmd.Wait(); err != nil {
			t.Errorf("%s after SIGTERM: %v; log tail:\n%s", n.name, err, tail(n.out.String(), 20))
		}
	}
	return fmt.Sprintf(
		"%d changes; events expected %d = delivered %d (%d messages, %d duplicates; an ordered consumer's moves: %s); KV values seen %d, regressions %d (and %d with an older updateTime but the newest state); writes fenced: %s; mirror diffs 0 (leader vs truth, %s vs leader, follower vs leader; checkpoint match at stream seq %s); whole test %s",
		changes,
		len(expected),
		delivered,
		total,
		total-delivered,
		consumerView,
		seen,
		regressions,
		olderTimeOnly,
		fenced,
		standby.name,
		cpSeq,
		time.Since(pw.start).Round(time.Second),
	)
}

// fencedWritesText is a replica's syncd_fenced_writes_total from /metrics
// (summed over its labels), or "n/a" while syncd has no such metric.
func fencedWritesText(admin string) string {
	n := fencedWrites(admin)
	if n < 0 {
		return "n/a"
	}
	return strconv.Itoa(n)
}

// streamReceived reads the SYNCD stream message by message, as received
// would have it: deliveries per event id, and each tag's moves in stream
// order (the first copy of each event).
// A read the cluster answers with JetStream unavailable (503, as while a
// stream elects its leader) is returned as an error: the caller reads
// again.
func streamReceived(ctx context.Context, t *testing.T, js jetstream.JetStream) (*received, error) {
	t.Helper()
	rcv := &received{
		ids:      map[string]int{},
		moves:    map[string][]string{},
		subjects: map[string]string{},
		byType:   map[string]int{},
	}
	s, err := js.Stream(ctx, "SYNCD")
	if unavailable(err) {
		return nil, err
	} else if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if unavailable(err) {
		return nil, err
	} else if err != nil {
		t.Fatal(err)
	}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if unavailable(err) {
			return nil, fmt.Errorf("stream message %d: %w", seq, err)
		} else if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		var ev cloudEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		if publish.Reserved("syncd", m.Subject) {
			continue // checkpoints, term markers, snapshot records: no events
		}
		rcv.total++
		rcv.ids[ev.ID]++
		if rcv.ids[ev.ID] == 1 {
			rcv.byType[ev.Type]++
			if ev.Type == "dev.syncd.tag.moved" {
				rcv.moves[ev.Subject] = append(rcv.moves[ev.Subject], ev.Data.After.Digest)
				rcv.subjects[ev.Subject] = m.Subject
			}
		}
	}
	return rcv, nil
}

// unavailable reports whether err is JetStream's answer that it cannot
// serve the request now (503: "JetStream system temporarily unavailable",
// a stream without a leader).
func unavailable(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.Code == 503
}

// kvRecorder watches the state buckets from outside the faults, as a
// consumer running "kv watch" would, and counts every value that is older
// than one the same key already had: a regression.
type kvRecorder struct {
	mu sync.Mutex
	// newest is the latest updateTime each bucket/key carried so far.
	newest      map[string]time.Time
	newestValue map[string][]byte // the value that carried it
	last        map[string][]byte // by tags key: the latest value
	seen        int
	regressions int
	// olderTimeOnly counts tag values with an older updateTime and the
	// newest state (sameTagState).
	olderTimeOnly int
	details       []string
}

// kvBuckets are the state buckets' default names.
var kvBuckets = []string{"syncd_tags", "syncd_repos", "syncd_advisories"}

// recordKV watches every state bucket until ctx is done.
func recordKV(ctx context.Context, t *testing.T, js jetstream.JetStream) *kvRecorder {
	t.Helper()
	r := &kvRecorder{newest: map[string]time.Time{}, newestValue: map[string][]byte{}, last: map[string][]byte{}}
	for _, bucket := range kvBuckets {
		// The bucket, and a watch of it: creating the watch's consumer of
		// the R3 bucket is a JetStream API request, which the servers,
		// electing the groups of what the replicas create meanwhile on two
		// loaded cores, once left unanswered past its 5 s (the test then
		// failed at its start, before any fault).
		var w jetstream.KeyWatcher
		testutil.Eventually(t, 30*time.Second, func() error {
			kv, err := js.KeyValue(ctx, bucket)
			if err == nil {
				w, err = kv.WatchAll(ctx)
			}
			if err != nil {
				return fmt.Errorf("watch %s: %w", bucket, err)
			}
			return nil
		})
		go func() {
			for e := range w.Updates() {
				if e != nil {
					r.record(bucket, e)
				}
			}
		}()
	}
	return r
}

// record compares a value with the newest its key had. Every state value
// (TagValue, RepoValue, AdvisoryValue) carries its resource's upstream
// updateTime, which a tag's move, deprecation or an advisory's change
// advances; a value that goes back in it is an older state.
func (r *kvRecorder) record(bucket string, e jetstream.KeyValueEntry) {
	if publish.IsTermKey(e.Key()) {
		return // a lease term's marker
	}
	if e.Operation() != jetstream.KeyValuePut {
		// The changes of these tests delete nothing upstream: a delete
		// takes a live resource back to before it existed.
		r.mu.Lock()
		defer r.mu.Unlock()
		r.seen++
		r.regressions++
		r.details = append(r.details, fmt.Sprintf("%s/%s rev %d at %s: %s of a resource that is live upstream",
			bucket, e.Key(), e.Revision(), e.Created().UTC().Format(time.RFC3339Nano), e.Operation()))
		return
	}
	var v struct {
		UpdateTime time.Time `json:"updateTime"`
	}
	err := json.Unmarshal(e.Value(), &v)
	key := bucket + "/" + e.Key()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.seen++
	if bucket == "syncd_tags" {
		r.last[e.Key()] = e.Value()
	}
	switch {
	case err != nil:
		r.regressions++
		r.details = append(r.details, fmt.Sprintf("%s rev %d: not a state value: %v", key, e.Revision(), err))
	case v.UpdateTime.Before(r.newest[key]) && sameTagState(bucket, e.Value(), r.newestValue[key]):
		// A tag's value from a listing carries the listing's update time,
		// a move's the history record's: a listing read before a move and
		// applied after it carries an older time with the state the move
		// set (the mirror's digest). Not an older state; counted apart.
		r.olderTimeOnly++
		r.newestValue[key] = e.Value()
	case v.UpdateTime.Before(r.newest[key]):
		r.regressions++
		r.details = append(r.details, fmt.Sprintf(
			"%s rev %d at %s: updateTime %s after %s: %s (the newest before: %s)",
			key,
			e.Revision(),
			e.Created().UTC().Format(time.RFC3339Nano),
			v.UpdateTime,
			r.newest[key],
			e.Value(),
			r.newestValue[key],
		))
	default:
		r.newest[key], r.newestValue[key] = v.UpdateTime, e.Value()
	}
}

func (r *kvRecorder) result() (seen, regressions, olderTimeOnly int, details []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.seen, r.regressions, r.olderTimeOnly, append([]string(nil), r.details...)
}

// sameTagState reports whether a tags bucket value holds the same digest
// as the newest before it, deprecated if that one was (the tests'
// changes never undo a deprecation).
func sameTagState(bucket string, value, newest []byte) bool {
	if bucket != "syncd_tags" {
		return false
	}
	var v, n publish.TagValue
	if json.Unmarshal(value, &v) != nil || json.Unmarshal(newest, &n) != nil {
		return false
	}
	return v.Digest == n.Digest && (v.Deprecated || !n.Deprecated)
}

// tagsDiff is nil once the latest value the watcher saw of every live tag
// is the truth's digest and deprecation.
func (r *kvRecorder) tagsDiff(truth platformsim.Truth) error {
	paths := map[string]string{}
	for _, rp := range truth.Repos {
		paths[rp.UID] = rp.Path
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, tg := range truth.Tags {
		key := publish.TagKey(paths[tg.RepoUID], tg.Name)
		var v publish.TagValue
		if err := json.Unmarshal(r.last[key], &v); err != nil || v.Digest != tg.Digest || v.Deprecated != tg.Deprecated {
			return fmt.Errorf(
				"KV watcher: tag %s is %s, want digest %s deprecated %v",
				key,
				r.last[key],
				tg.Digest,
				tg.Deprecated,
			)
		}
	}
	return nil
}

// bucketTagsDiff says whether the tags bucket holds every live tag's
// digest and deprecation.
func bucketTagsDiff(tags map[string][]byte, truth platformsim.Truth) string {
	paths := map[string]string{}
	for _, rp := range truth.Repos {
		paths[rp.UID] = rp.Path
	}
	var diffs []string
	for _, tg := range truth.Tags {
		key := publish.TagKey(paths[tg.RepoUID], tg.Name)
		var v publish.TagValue
		if err := json.Unmarshal(tags[key], &v); err != nil || v.Digest != tg.Digest || v.Deprecated != tg.Deprecated {
			diffs = append(diffs, fmt.Sprintf("%s is %s", key, tags[key]))
		}
	}
	if len(diffs) == 0 {
		return "all as the truth has them (the watcher fell behind)"
	}
	return "differing from the truth: " + strings.Join(diffs, "; ")
}

// TestCluster_LeaderBlackHoled black-holes every connection of syncd's
// leader to NATS (bytes dropped both ways, nothing closed) for three lease
// TTLs while data changes, then heals. The leader must stand down by its
// own clock, the standby take over, and the old leader stand by under it
// once healed; then the oracle (finish).
func TestCluster_LeaderBlackHoled(t *testing.T) {
	pw := startPartitionWorld(t, 79, clusterTTL)
	a, b := pw.a, pw.b
	pw.replicaFaults(a, (*testutil.FaultProxy).BlackHole)
	holed := time.Now()
	var stoodDown, takeover time.Duration
	testutil.WaitFor(t, 4*clusterTTL, "a to stand down and b to take over", func() bool {
		if stoodDown == 0 && metaOf(a.dbPath, "role") != "leader" {
			stoodDown = time.Since(holed)
		}
		if takeover == 0 && metaOf(b.dbPath, "role") == "leader" {
			takeover = time.Since(holed)
		}
		return stoodDown > 0 && takeover > 0
	})
	if takeover < stoodDown {
		t.Errorf("b took over %s after the black hole, before a stood down (%s): two leaders", takeover, stoodDown)
	}
	time.Sleep(3*clusterTTL - time.Since(holed))
	pw.replicaFaults(a, (*testutil.FaultProxy).Heal)
	healed := time.Now()
	testutil.WaitFor(t, 30*time.Second, "a to stand by under b once healed", func() bool {
		return metaOf(a.dbPath, "role") == "standby" && metaOf(a.dbPath, "lease_holder") == "b" && readyz(a.admin) == ""
	})
	rejoined := time.Since(healed)
	time.Sleep(2 * time.Second) // data changes while b leads
	figures := pw.finish(b, a)
	t.Logf(
		"leader black-holed figures: a black-holed from NATS for %s (lease TTL %s): a stood down after %s, b took over after %s; healed, a stood by under b after %s; %s",
		3*clusterTTL,
		clusterTTL,
		stoodDown.Round(time.Millisecond),
		takeover.Round(time.Millisecond),
		rejoined.Round(time.Millisecond),
		figures,
	)
}

// TestCluster_LeaderPaused freezes syncd's leader (SIGSTOP) for three
// lease TTLs while data changes, on the three-node cluster whose stream
// and buckets have three replicas (fenced by lanes): the standby takes
// over, and the woken leader, which still believes it leads until its
// clock or the fence tells it otherwise, must land nothing; it stands by
// under the new leader; then the oracle (finish), whose KV watcher fails
// on any value that goes back to an older state.
func TestCluster_LeaderPaused(t *testing.T) {
	pw := startPartitionWorld(t, 97, clusterTTL)
	a, b := pw.a, pw.b
	// Frozen while it has events to publish (the changer keeps changing
	// the data), so that it has writes to send when it wakes: the writes
	// the fence must refuse.
	pending := untilUnpublished(t, a.dbPath, 10*time.Second)
	if err := a.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	frozen := time.Now()
	testutil.WaitFor(t, 4*clusterTTL, "b to take over from the frozen a", func() bool {
		return metaOf(b.dbPath, "role") == "leader"
	})
	takeover := time.Since(frozen)
	time.Sleep(3*clusterTTL - time.Since(frozen))
	if err := a.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	woken := time.Now()
	testutil.WaitFor(t, 30*time.Second, "a to stand by under b once woken", func() bool {
		return metaOf(a.dbPath, "role") == "standby" && metaOf(a.dbPath, "lease_holder") == "b" && readyz(a.admin) == ""
	})
	rejoined := time.Since(woken)
	time.Sleep(2 * time.Second) // data changes while b leads
	figures := pw.finish(b, a)
	t.Logf(
		"leader paused figures: a frozen for %s (lease TTL %s) with events to publish: %v; b took over after %s; woken, a stood by under b after %s; %s",
		3*clusterTTL,
		clusterTTL,
		pending,
		takeover.Round(time.Millisecond),
		rejoined.Round(time.Millisecond),
		figures,
	)
}

// untilUnpublished polls the mirror at path until it holds an event not
// yet published, at most within; it reports whether it saw one.
func untilUnpublished(t *testing.T, path string, within time.Duration) bool {
	t.Helper()
	db := openReader(t, path)
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		var n int
		if db.QueryRow(`SELECT count(*) FROM events WHERE published_time IS NULL`).Scan(&n) == nil && n > 0 {
			return true
		}
	}
	return false
}

// TestCluster_StreamLeaderNodePartitioned black-holes every route of the
// NATS node that leads the SYNCD stream (a minority partition of one
// node, its clients still connected to it) while data changes, until the
// other two elected a stream leader and syncd published there again (or
// 15 s passed: a syncd replica connected to the isolated node can do
// nothing until the heal, and both may be), then heals; then the oracle.
func TestCluster_StreamLeaderNodePartitioned(t *testing.T) {
	pw := startPartitionWorld(t, 83, clusterTTL)
	isolated := streamLeader(pw.js)
	if isolated == "" {
		t.Fatal("the stream has no leader")
	}
	var majority *testutil.NATSServer
	for _, s := range pw.cl.Nodes {
		if s.Name() != isolated {
			majority = s
		}
	}
	mjs := testutil.JetStream(t, majority.URL(), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))
	lastSeq := func() uint64 {
		ctx, cancel := context.WithTimeout(pw.ctx, time.Second)
		defer cancel()
		s, err := mjs.Stream(ctx, "SYNCD")
		if err != nil {
			return 0
		}
		return s.CachedInfo().State.LastSeq
	}
	before := lastSeq()
	pw.cl.Isolate(isolated)
	cut := time.Now()
	var elected, published time.Duration
	var newLeader string
	testutil.WaitFor(t, 30*time.Second, "the majority to elect a stream leader", func() bool {
		newLeader = streamLeader(mjs)
		return newLeader != "" && newLeader != isolated
	})
	elected = time.Since(cut)
	for time.Since(cut) < 15*time.Second && published == 0 {
		if lastSeq() > before {
			published = time.Since(cut)
		}
		time.Sleep(100 * time.Millisecond)
	}
	roles := fmt.Sprintf(
		"a %s via %s (readyz %q), b %s via %s (readyz %q)",
		metaOf(
			pw.a.dbPath,
			"role",
		),
		pw.connectedTo(pw.a),
		readyz(pw.a.admin),
		metaOf(pw.b.dbPath, "role"),
		pw.connectedTo(pw.b),
		readyz(pw.b.admin),
	)
	time.Sleep(max(0, 3*clusterTTL-time.Since(cut)))
	pw.cl.HealRoutes()
	partitioned := time.Since(cut)
	healed := time.Now()
	var leader, standby *node
	testutil.WaitFor(t, 60*time.Second, "the routes back and a ready leader with a ready standby", func() bool {
		if pw.cl.RoutesProxied() != nil {
			return false
		}
		for _, pair := range [][2]*node{{pw.a, pw.b}, {pw.b, pw.a}} {
			if metaOf(pair[0].dbPath, "role") == "leader" && readyz(pair[0].admin) == "" &&
				metaOf(pair[1].dbPath, "role") == "standby" && readyz(pair[1].admin) == "" {
				leader, standby = pair[0], pair[1]
				return true
			}
		}
		return false
	})
	recovered := time.Since(healed)
	time.Sleep(2 * time.Second) // data changes after the heal
	figures := pw.finish(leader, standby)
	publishedDuring := "none during the partition"
	if published > 0 {
		publishedDuring = "after " + published.Round(time.Millisecond).String()
	}
	t.Logf(
		"stream leader partitioned figures: %s (stream leader) isolated from the other two for %s: %s elected stream leader after %s; first new message on the majority %s; roles at the end of the partition: %s; healed: %s leads, both ready after %s; %s",
		isolated,
		partitioned.Round(time.Millisecond),
		newLeader,
		elected.Round(time.Millisecond),
		publishedDuring,
		roles,
		leader.name,
		recovered.Round(time.Millisecond),
		figures,
	)
}

// TestCluster_SlowNetworkNoTakeover adds 200 ms each way to every
// connection of both replicas to NATS, so that every round trip (a lease
// renewal, a publish's acknowledgement, a fetch) takes 400 ms longer, for
// 20 s while data changes (the issue asks for a minute; 20 s is six
// renewals, within make cluster-test's budget). The replicas run with the
// default lease TTL, 10 s: a renewal must answer within TTL/3, 3.3 s. (With
// the other tests' 2 s TTL, 667 ms, 100 ms each way already cost the
// leader its lease on the loaded test machine: docs/cluster.md.) No
// takeover may happen: a keeps the lease and b stands by throughout; each
// /readyz that is not ready says why. Then the latency is removed, and
// the oracle.
func TestCluster_SlowNetworkNoTakeover(t *testing.T) {
	const slow, window, ttl = 200 * time.Millisecond, 20 * time.Second, 10 * time.Second
	pw := startPartitionWorld(t, 89, ttl)
	a, b := pw.a, pw.b
	for _, n := range []*node{a, b} {
		pw.replicaFaults(n, func(p *testutil.FaultProxy) { p.Latency(slow) })
	}
	began := time.Now()
	notReady := map[string]int{}
	reasons := map[string]string{}
	polls := 0
	for time.Since(began) < window {
		if ra, rb := metaOf(a.dbPath, "role"), metaOf(b.dbPath, "role"); ra != "leader" || rb != "standby" {
			t.Fatalf("after %s of %s latency: a is %q, b is %q; want a to lead and b to stand by (no takeover)",
				time.Since(began).Round(time.Millisecond), slow, ra, rb)
		}
		polls++
		for _, n := range []*node{a, b} {
			if r := readyz(n.admin); r != "" {
				notReady[n.name]++
				reasons[n.name] = r
				if !strings.Contains(r, "failed") {
					t.Errorf("%s not ready without saying why: %q", n.name, r)
				}
			}
		}
		time.Sleep(250 * time.Millisecond)
	}
	// Between two polls a replica could have lost and regained the lease:
	// its log says so.
	if n := strings.Count(a.out.String(), "gained the leader lease"); n != 1 {
		t.Errorf("a gained the lease %d times, want once (before the latency)", n)
	}
	if strings.Contains(b.out.String(), "gained the leader lease") {
		t.Error("b gained the lease")
	}
	for _, n := range []*node{a, b} {
		pw.replicaFaults(n, func(p *testutil.FaultProxy) { p.Latency(0) })
	}
	time.Sleep(2 * time.Second) // data changes at full speed again
	figures := pw.finish(a, b)
	t.Logf(
		"slow network figures: %s added each way to both replicas' NATS connections for %s (lease TTL %s): no takeover; /readyz polled %d times a replica: not ready a %d, b %d (last reasons %q); %s",
		slow,
		window,
		ttl,
		polls,
		notReady["a"],
		notReady["b"],
		reasons,
		figures,
	)
}
