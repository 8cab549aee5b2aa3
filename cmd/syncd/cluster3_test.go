package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/signing"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// clusterTestEnv runs TestCluster_ThreeNodes: it takes a minute or two of
// NATS elections (4-9s each, the server's fixed Raft timeouts), too long for
// make test; make cluster-test (and CI) sets it.
const clusterTestEnv = "SYNCD_TEST_CLUSTER"

// auditWindow is the three-node test's duplicate window: long enough that
// a publish retried across the quorum loss is still deduplicated, short
// enough that the audit publishes again, within the test, what the stream
// lost.
const auditWindow = 45 * time.Second

// freePort is a loopback address the system had free, for a child process
// to listen on.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// readyz asks a replica's admin listener whether it is ready; "" when it
// is, else what it says.
func readyz(addr string) string {
	c := http.Client{Timeout: 2 * time.Second}
	resp, err := c.Get("http://" + addr + "/readyz")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode == http.StatusOK {
		return ""
	}
	return string(body)
}

// streamLeader is the name of the NATS node leading the SYNCD stream, ""
// while none does or the cluster does not answer.
func streamLeader(js jetstream.JetStream) string {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	s, err := js.Stream(ctx, "SYNCD")
	if err != nil {
		return ""
	}
	if ci := s.CachedInfo().Cluster; ci != nil {
		return ci.Leader
	}
	return ""
}

// changer changes the simulator's data in the background until stopped.
type changer struct {
	sim     *platformsim.Sim
	mu      sync.Mutex
	changes int
	stop    chan struct{}
	done    chan struct{}
}

func startChanger(sim *platformsim.Sim) *changer {
	c := &changer{sim: sim, stop: make(chan struct{}), done: make(chan struct{})}
	sim.SetRates(changesOnly())
	go func() {
		defer close(c.done)
		t := time.NewTicker(400 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-c.stop:
				return
			case <-t.C:
				n := len(sim.Step(1))
				c.mu.Lock()
				c.changes += n
				c.mu.Unlock()
			}
		}
	}()
	return c
}

// halt stops changing and returns how many changes were made.
func (c *changer) halt() int {
	close(c.stop)
	<-c.done
	return c.changes
}

// TestCluster_ThreeNodes runs two "syncd run" replicas in cluster mode as
// real processes against a three-node JetStream cluster (stream, lease
// bucket and snapshot bucket R3), while the simulator changes data. It
// kills the NATS node leading the stream; then stops a second node, so
// that no R3 asset has a quorum, and checks that both replicas say
// not-ready; starts the nodes again; and SIGKILLs syncd's leader. After
// the data stops changing: the new leader's mirror equals the truth; the
// stream holds every change exactly once, in order per tag; every event of
// the leader's mirror is on the stream and nothing else is; the restarted
// replica's mirror equals the leader's; and a follower started after the
// stream dropped every event up to the newest snapshot restores it and ends
// with the leader's mirror.
//
// The NATS servers run with the users and permissions of
// deploy/nats-permissions.conf (docs/cluster.md, "Least privilege"): the
// replicas as syncd-replica, the follower as syncd-follower; the replicas
// sign with one key, the follower verifies it. Every message on the stream
// is signed, and no log names a permissions violation or a rejected
// signature.
//
// "Kill" and "stop" of a NATS node are the same here: Shutdown of the
// embedded server, with no lame-duck mode, so it hands no leadership over
// and the others notice it gone only by missed heartbeats, as after a
// crash.
func TestCluster_ThreeNodes(t *testing.T) {
	if os.Getenv(clusterTestEnv) == "" {
		t.Skip("make cluster-test runs it (" + clusterTestEnv + "=1)")
	}
	start := time.Now()
	cl, urls := documentedNATSCluster(t)
	signingKey, verifyKey := signingKeyFile(t)
	nodes := []*node{{name: "a", token: "tok-a-51c2"}, {name: "b", token: "tok-b-83d4"}}
	sim, simURL := testutil.Sim(t, platformsim.Options{Seed: 67, Tokens: []string{nodes[0].token, nodes[1].token}},
		platformsim.Scale{Repos: 3, TagsPerRepo: 3, HistoryPerTag: 4, Advisories: 4, PublicImages: -1})
	dir := t.TempDir()
	for _, n := range nodes {
		n.dbPath, n.replicas, n.admin, n.snapshotEvery = filepath.Join(dir, n.name+".db"), 3, freePort(t), "2s"
		// An audit that can publish again what the stream lost within the
		// test: after the duplicate window and half of it again.
		n.dupWindow, n.auditEvery = auditWindow.String(), "2s"
		// The documented permissions of a "syncd run" replica, and the
		// key every replica that may lead signs with.
		n.natsUser, n.natsPassword, n.signingKey = replicaUser, replicaPassword, signingKey
		n.cfg = clusterNodeConfig(t, simURL, cl.URLs(), n)
	}
	w := &world{t: t, sim: sim, simURL: simURL, natsURL: urls}
	w.takeBaseline()
	js := testutil.JetStream(t, urls, nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond))

	a, b := nodes[0], nodes[1]
	// The logs kept of a failed run: both replicas' (the killed one's
	// before its restart too) and the follower's, once each process still
	// running has ended (registered first, this cleanup runs last).
	logged := slices.Clone(nodes)
	t.Cleanup(func() {
		if t.Failed() {
			for _, n := range logged {
				if n.out != nil {
					t.Logf("%s log tail:\n%s", n.name, logTail(n.out.String(), 40))
					t.Logf("%s role lines:\n%s", n.name, roleLines(withoutDebug(n.out.String())))
					keepLog(t, n)
				}
			}
		}
	})
	a.start(t, "run")
	testutil.WaitFor(t, 60*time.Second, "a to lead and finish its baseline", func() bool {
		return metaOf(a.dbPath, "role") == "leader" && metaOf(a.dbPath, "baseline_time") != ""
	})
	b.start(t, "run")
	testutil.WaitFor(t, 30*time.Second, "b to follow as a standby", func() bool {
		return metaOf(b.dbPath, "role") == "standby" && metaOf(b.dbPath, "baseline_time") != ""
	})
	for _, name := range []string{"SYNCD", "KV_syncd_leader"} {
		s, err := js.Stream(context.Background(), name)
		if err != nil {
			t.Fatal(err)
		}
		if r := s.CachedInfo().Config.Replicas; r != 3 {
			t.Errorf("stream %s has %d replicas, want 3 ([nats] replicas)", name, r)
		}
	}
	ch := startChanger(sim)
	time.Sleep(2 * time.Second) // data changes while a leads

	// 1. The node leading the stream dies.
	first := streamLeader(js)
	if first == "" {
		t.Fatal("the stream has no leader")
	}
	cl.Node(first).Stop()
	killed := time.Now()
	var second string
	testutil.WaitFor(t, 30*time.Second, "the stream to elect another leader", func() bool {
		second = streamLeader(js)
		return second != "" && second != first
	})
	streamTakeover := time.Since(killed)
	time.Sleep(2 * time.Second)

	// 2. A second node stops: one of three left, no quorum anywhere.
	cl.Node(second).Stop()
	lost := time.Now()
	notReady := map[string]string{}
	testutil.WaitFor(t, 30*time.Second, "both replicas to say not-ready without a quorum", func() bool {
		for _, n := range nodes {
			if _, seen := notReady[n.name]; !seen {
				if r := readyz(n.admin); r != "" {
					notReady[n.name] = r
				}
			}
		}
		return len(notReady) == len(nodes)
	})
	notReadyAfter := time.Since(lost)
	time.Sleep(2 * time.Second)
	cl.Node(first).Start()
	restored := time.Now()
	var leader, standby *node
	testutil.WaitFor(t, 60*time.Second, "a leader that publishes again", func() bool {
		for i, n := range nodes {
			if metaOf(n.dbPath, "role") == "leader" && readyz(n.admin) == "" {
				leader, standby = n, nodes[1-i]
				return true
			}
		}
		return false
	})
	quorumBack := time.Since(restored)
	cl.Node(second).Start()

	// 3. syncd's leader dies.
	time.Sleep(2 * time.Second)
	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	leader.cmd.Wait()
	sigkill := time.Now()
	testutil.WaitFor(
		t,
		30*time.Second,
		"the standby to take over",
		func() bool { return metaOf(standby.dbPath, "role") == "leader" },
	)
	takeover := time.Since(sigkill)
	old := leader
	leader = standby
	time.Sleep(2 * time.Second)
	changes := ch.halt()

	// The new leader converges to the truth, and the stream, read from its
	// start, carries every change once, in order per tag.
	w.dbPath = leader.dbPath
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	rcv := consume(ctx, t, urls)
	w.converge(rcv, 60*time.Second)
	expected := eventIDs(t, leader.dbPath)
	onStream, total, described, unsigned := streamIDs(ctx, t, js)
	missing, extra := 0, 0
	streamLost, auditTook := 0, time.Duration(0)
	for id := range expected {
		if onStream[id] == 0 {
			streamLost++
			var typ, subject, created string
			var seq int
			openReader(
				t,
				leader.dbPath,
			).QueryRow(`SELECT seq, type, subject, created_time FROM event_log WHERE id = ?`, id).
				Scan(&seq, &typ, &subject, &created)
			t.Logf("missing from the stream: %s seq %d %s %s recorded %s", id, seq, typ, subject, created)
			// Who published it, and when: a loss of JetStream's or syncd's.
			for _, n := range nodes {
				for _, line := range strings.Split(n.out.String(), "\n") {
					if strings.Contains(line, id) {
						t.Logf("  %s: %s", n.name, line)
					}
				}
			}
		}
	}
	if streamLost > 0 {
		// JetStream lost acknowledged messages (Jepsen found NATS 2.12.1
		// does when nodes die), or syncd marked an event published that
		// was not: either way the leader's audit publishes it again, once
		// the duplicate window and its margin are past.
		auditStart := time.Now()
		testutil.WaitFor(t, 3*auditWindow, "the leader's audit to publish again what the stream lacks", func() bool {
			onStream, total, described, unsigned = streamIDs(ctx, t, js)
			for id := range expected {
				if onStream[id] == 0 {
					return false
				}
			}
			return true
		})
		auditTook = time.Since(auditStart)
		for _, line := range strings.Split(leader.out.String(), "\n") {
			if strings.Contains(line, `"part":"audit"`) && strings.Contains(line, "WARN") {
				t.Logf("%s: %s", leader.name, line)
			}
		}
	}
	for id := range expected {
		if onStream[id] == 0 {
			missing++
		}
	}
	for id := range onStream {
		if !expected[id] {
			extra++
			t.Logf("on the stream, not in the new leader's mirror: %s", described[id])
		}
	}
	if extra > 0 {
		for _, line := range strings.Split(leader.out.String(), "\n") {
			// The roles, the promotions and everything the follower said:
			// how the new leader's catch-up read the stream.
			if strings.Contains(line, `"cluster role"`) || strings.Contains(line, "catching up") ||
				strings.Contains(line, `"leading"`) || strings.Contains(line, "readying") ||
				strings.Contains(line, `"part":"follow"`) || strings.Contains(line, "not leading yet") ||
				strings.Contains(line, "stepping down") ||
				strings.Contains(line, `"part":"lease"`) && !strings.Contains(line, "campaign for the leader lease failed") {
				t.Logf("%s: %s", leader.name, line)
			}
		}
	}
	delivered := len(onStream)
	if missing > 0 || extra > 0 || total != delivered {
		t.Errorf(
			"events: %d in the leader's mirror, %d distinct on the stream (%d messages): %d missing from the stream, %d not in the mirror",
			len(expected),
			delivered,
			total,
			missing,
			extra,
		)
	}
	if unsigned > 0 {
		t.Errorf("%d messages on the stream carry no %s header", unsigned, signing.Header)
	}

	// The replica that was killed restarts as a standby and catches up.
	// Its history has rows the leader lacks (those of tags it crawled
	// before the leader learned of them from the stream: docs/cluster.md),
	// so the resources are compared, not the history.
	logged = append(logged, &node{name: old.name + "-killed", out: old.out})
	old.start(t, "run")
	waitSameState(t, 30*time.Second, old.dbPath, leader.dbPath)

	// The stream drops every event the newest snapshot covers; a follower
	// that starts then restores it and follows the rest.
	obj, err := js.ObjectStore(ctx, "syncd_snapshots")
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := obj.List(ctx)
	if err != nil || len(snaps) == 0 || len(snaps) > 2 {
		t.Fatalf("%d snapshots in the bucket (%v), want 1 or 2 ([snapshot] keep)", len(snaps), err)
	}
	var seq uint64
	for _, o := range snaps {
		s, _ := strconv.ParseUint(o.Metadata["stream_seq"], 10, 64)
		seq = max(seq, s)
	}
	stream, err := js.Stream(ctx, "SYNCD")
	if err != nil {
		t.Fatal(err)
	}
	if err := stream.Purge(ctx, jetstream.WithPurgeSequence(seq+1)); err != nil {
		t.Fatal(err)
	}
	// Changes after the snapshot reach the follower from the stream.
	sim.Step(2)
	testutil.WaitFor(t, 20*time.Second, "the changes after the snapshot on the stream", func() bool {
		info, err := stream.Info(ctx)
		return err == nil && info.State.LastSeq > seq
	})
	late := &node{name: "late", token: "no-platform-access", dbPath: filepath.Join(dir, "late.db"), replicas: 3,
		natsUser: followerUser, natsPassword: followerPassword, verifyKeys: []string{verifyKey}}
	late.cfg = clusterNodeConfig(t, simURL, cl.URLs(), late)
	joined := time.Now()
	logged = append(logged, late)
	late.start(t, "follow")
	waitSameMirror(t, 30*time.Second, late.dbPath, leader.dbPath)
	catchUp := time.Since(joined)
	after := 0
	if info, err := stream.Info(ctx); err == nil {
		after = int(info.State.LastSeq - seq)
	}

	// Every replica that follows ends equal to the leader at the same
	// checkpoint: the standby and the follower compared the same one, and
	// matched it. A change makes a checkpoint after the restarted standby's
	// own last publication, which it cannot be compared at (it holds what
	// it published itself); without one, the next is a minute away.
	moveATag(t, sim)
	var cpSeq string
	testutil.WaitFor(t, 30*time.Second, "the standby and the follower to match the same checkpoint", func() bool {
		cpSeq = metaOf(old.dbPath, "checkpoint_seq")
		return cpSeq != "" && cpSeq == metaOf(late.dbPath, "checkpoint_seq") &&
			metaOf(old.dbPath, "checkpoint_result") == "match" && metaOf(late.dbPath, "checkpoint_result") == "match"
	})
	// The follower had no mirror: the snapshot became its file, checked
	// once it ran.
	for _, want := range []string{`"file_adopted":true`, "the adopted snapshot passed its checks"} {
		if !strings.Contains(late.out.String(), want) {
			t.Errorf("the late follower did not log %s; its log's tail:\n%s", want, tail(late.out.String(), 30))
		}
	}
	// The query service answers under the documented permissions: each
	// replica subscribed to its subjects and replies to what it receives.
	qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
	var pos map[string]any
	if err := (&query.Client{NC: js.Conn(), Prefix: "syncd-query"}).Do(qctx, "position", nil, &pos); err != nil {
		t.Errorf("the query service under the documented permissions: %v", err)
	}
	qcancel()
	t.Logf(
		"three-node figures: standby %s and follower %s matched the leader's checkpoint at stream sequence %s",
		old.name,
		late.name,
		cpSeq,
	)
	t.Logf(
		"three-node figures: stream leader %s killed, %s leads after %s; %s stopped: both replicas not-ready within %s (%q); quorum back, a leader publishing %s after the restart; syncd leader %s SIGKILLed, %s took over after %s (lease TTL %s)",
		first,
		second,
		streamTakeover.Round(time.Millisecond),
		second,
		notReadyAfter.Round(time.Millisecond),
		notReady,
		quorumBack.Round(time.Millisecond),
		old.name,
		leader.name,
		takeover.Round(time.Millisecond),
		clusterTTL,
	)
	t.Logf(
		"three-node figures: %d changes; events expected %d = delivered %d (%d messages, %d duplicates); mirror diffs: leader vs truth 0, standby vs leader 0, follower vs leader 0; follower joined after the stream dropped seqs up to %d: restored the snapshot and applied the %d events after it in %s; whole test %s",
		changes,
		len(expected),
		delivered,
		total,
		total-delivered,
		seq,
		after,
		catchUp.Round(time.Millisecond),
		time.Since(start).Round(time.Second),
	)
	t.Logf(
		"three-node figures: events the stream lacked after the faults: %d, all on it again %s later (the audit: [nats] duplicate_window %s, [verify] audit_every 2s)",
		streamLost,
		auditTook.Round(time.Second),
		auditWindow,
	)

	for _, n := range []*node{leader, old, late} {
		n.cmd.Process.Signal(syscall.SIGTERM)
		if err := n.cmd.Wait(); err != nil {
			t.Errorf("%s after SIGTERM: %v; log tail:\n%s", n.name, err, tail(n.out.String(), 20))
		}
	}
	// Signed, verified, and nothing refused under the documented
	// permissions, in every log of the run.
	for _, n := range logged {
		want := "signing published messages"
		if n == late {
			want = "accepting only signed messages"
		}
		checkTrustLog(t, n, want)
	}
}

// checkTrustLog fails the test unless n's log says want (how it signs or
// verifies), and reports every line of it that names a permissions
// violation, a message rejected for its signature, or unsigned operation.
func checkTrustLog(t *testing.T, n *node, want string) {
	t.Helper()
	log := n.out.String()
	if !strings.Contains(log, want) {
		t.Errorf("%s never logged %q", n.name, want)
	}
	for _, line := range strings.Split(log, "\n") {
		l := strings.ToLower(line)
		if strings.Contains(l, "permissions violation") || strings.Contains(l, `"reason":"unsigned"`) ||
			strings.Contains(l, `"reason":"bad_signature"`) || strings.Contains(l, "no [cluster] signing_key_file") {
			t.Errorf("%s: %s", n.name, line)
		}
	}
}

// streamIDs reads the SYNCD stream message by message and returns how
// many messages carry each event id, how many messages there are, each
// event described, and how many messages (checkpoints included) carry no
// signature.
func streamIDs(
	ctx context.Context,
	t *testing.T,
	js jetstream.JetStream,
) (ids map[string]int, total int, described map[string]string, unsigned int) {
	t.Helper()
	s, err := js.Stream(ctx, "SYNCD")
	if err != nil {
		t.Fatal(err)
	}
	info, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids, described = map[string]int{}, map[string]string{}
	for seq := info.State.FirstSeq; seq <= info.State.LastSeq && info.State.Msgs > 0; seq++ {
		m, err := s.GetMsg(ctx, seq)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			continue
		}
		if err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		var ev cloudEvent
		if err := json.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("stream message %d: %v", seq, err)
		}
		if ev.Type != publish.CheckpointType && publish.Reserved("syncd", m.Subject) {
			continue // term markers and snapshot records: unsigned, and no replica acts on them
		}
		if m.Header.Get(signing.Header) == "" {
			unsigned++
		}
		if ev.Type == publish.CheckpointType {
			continue // the leader's checkpoints: no events
		}
		ids[ev.ID]++
		total++
		described[ev.ID] = fmt.Sprintf(
			"seq %d %s %s %s (at %s)",
			seq,
			ev.ID,
			ev.Type,
			ev.Subject,
			m.Time.UTC().Format(time.RFC3339Nano),
		)
	}
	return ids, total, described, unsigned
}

// eventIDs is the set of event ids in a mirror.
func eventIDs(t *testing.T, path string) map[string]bool {
	t.Helper()
	db := openReader(t, path)
	rows, err := db.Query(`SELECT id FROM event_log`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	ids := map[string]bool{}
	for rows.Next() {
		var id string
		rows.Scan(&id)
		ids[id] = true
	}
	if err := rows.Err(); err != nil {
		t.Fatal(fmt.Errorf("read event ids: %w", err))
	}
	return ids
}

// keepLog writes n's whole log into the directory $SYNCD_TEST_LOGDIR names,
// if any, where it outlives the test's temporary directory.
func keepLog(t *testing.T, n *node) {
	dir := os.Getenv("SYNCD_TEST_LOGDIR")
	if dir == "" {
		return
	}
	path := filepath.Join(dir, t.Name()+"-"+n.name+".log")
	err := os.MkdirAll(dir, 0o700)
	if err == nil {
		err = os.WriteFile(path, []byte(n.out.String()), 0o600)
	}
	if err != nil {
		t.Logf("keep the log of %s: %v", n.name, err)
		return
	}
	t.Logf("%s log: %s", n.name, path)
}

// The users of deploy/nats-permissions.conf, with the passwords the test
// gives nats-server's environment, and the test's own user, which may do
// anything (read the stream message by message, purge it).
const (
	replicaUser      = "syncd-replica"
	replicaPassword  = "replica-secret-6d1e"
	followerUser     = "syncd-follower"
	followerPassword = "follower-secret-0b7a"
	adminUser        = "test-admin"
	adminPassword    = "admin-secret-92fc"
)

// documentedNATSCluster starts three NATS nodes as one JetStream cluster
// whose users and permissions are deploy/nats-permissions.conf's, as
// docs/cluster.md has a server configuration include it, plus the test's
// own unrestricted user; it returns the cluster and the nodes' client URLs
// with that user's credentials.
func documentedNATSCluster(t *testing.T) (*testutil.NATSCluster, string) {
	t.Helper()
	t.Setenv("NATS_SYNCD_REPLICA_PASSWORD", replicaPassword)
	t.Setenv("NATS_SYNCD_FOLLOWER_PASSWORD", followerPassword)
	documented := func(o *server.Options) {
		// Parsed for each node: a server keeps and changes what it is given.
		conf, err := server.ProcessConfigFile(filepath.Join("..", "..", "deploy", "nats-permissions.conf"))
		if err != nil {
			t.Fatal(err)
		}
		if len(conf.Users) == 0 || len(conf.Nkeys) > 0 || conf.NoAuthUser != "" {
			t.Fatalf("deploy/nats-permissions.conf: want users only, got %d users, %d nkeys, no-auth user %q",
				len(conf.Users), len(conf.Nkeys), conf.NoAuthUser)
		}
		o.Users = append(conf.Users, &server.User{Username: adminUser, Password: adminPassword})
	}
	cl := testutil.NATSClusterWith(t, 3, documented, nats.UserInfo(adminUser, adminPassword))
	urls := strings.Split(cl.URLs(), ",")
	for i, u := range urls {
		urls[i] = strings.Replace(u, "nats://", "nats://"+adminUser+":"+adminPassword+"@", 1)
	}
	return cl, strings.Join(urls, ",")
}

// signingKeyFile writes a new nkey seed, mode 0600, for [cluster]
// signing_key_file, and returns the file and the key's public key.
func signingKeyFile(t *testing.T) (path, public string) {
	t.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, err := kp.Seed()
	if err != nil {
		t.Fatal(err)
	}
	if public, err = kp.PublicKey(); err != nil {
		t.Fatal(err)
	}
	path = filepath.Join(t.TempDir(), "signing.nk")
	if err := os.WriteFile(path, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	return path, public
}
