package cluster_test

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// reasonCounts counts the reasons a follower reports, as the
// syncd_rejected_messages_total{reason} counter does.
type reasonCounts struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *reasonCounts) add(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[reason]++
}

func (r *reasonCounts) get() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[string]int{}
	for k, v := range r.n {
		out[k] = v
	}
	return out
}

// attacker is a plain NATS client of the same account: not syncd.
func attacker(t *testing.T, js jetstream.JetStream) *nats.Conn {
	t.Helper()
	nc, err := nats.Connect(js.Conn().ConnectedUrl())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// attackerJS is attacker's JetStream.
func attackerJS(t *testing.T, js jetstream.JetStream) jetstream.JetStream {
	t.Helper()
	ajs, err := jetstream.New(attacker(t, js))
	if err != nil {
		t.Fatal(err)
	}
	return ajs
}

// publishForged publishes a CloudEvent of syncd's shape on subject, as an
// attacker or a faulty peer would, and returns its stream sequence once the
// stream holds it.
func publishForged(t *testing.T, nc *nats.Conn, subject, id, typ, eventSubject, data string) uint64 {
	t.Helper()
	ce, err := json.Marshal(map[string]any{
		"specversion":     "1.0",
		"id":              id,
		"source":          "evil",
		"type":            "dev.syncd." + typ,
		"subject":         eventSubject,
		"time":            "2026-01-03T00:00:00Z",
		"datacontenttype": "application/json",
		"data":            json.RawMessage(data),
	})
	if err != nil {
		t.Fatal(err)
	}
	ajs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ack, err := ajs.Publish(context.Background(), subject, ce)
	if err != nil {
		t.Fatal(err)
	}
	return ack.Sequence
}

// TestFollower_PoisonMessageSetAside: an event that decodes but cannot be
// applied ("after":{"uid":5}), and a forged tag.moved whose id matches no
// history position, published by a plain NATS client between two genuine
// events, are terminated and counted by reason, never redelivered; the
// genuine tags before and after them, in the same batch, reach the
// follower's mirror.
func TestFollower_PoisonMessageSetAside(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	nc := attacker(t, js)
	leader.change(1)
	leader.publish()
	poison := publishForged(
		t,
		nc,
		"ev.tag.created.nginx",
		"poison-1",
		"tag.created",
		"g/r1/evil",
		`{"before":null,"after":{"uid":5}}`,
	)
	// g/r1/t1 exists, so the move reaches the position search.
	move := publishForged(
		t,
		nc,
		"ev.tag.moved.nginx",
		"forged-move",
		"tag.moved",
		"g/r1/t1",
		`{"before":null,"after":{"uid":"g/r1/t1","repoUid":"g/r1","repo":"nginx","name":"v1","digest":"sha256:evil","updateTime":"2026-01-03T00:00:00Z"}}`,
	)
	ack, err := attackerJS(t, js).Publish(ctx, "ev.garbage.x", []byte("not json"))
	if err != nil {
		t.Fatal(err)
	}
	leader.change(1) // the genuine tag after the poison
	leader.publish()

	follower, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	var rej reasonCounts
	var logs testutil.Buffer
	f := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond, OnReject: rej.add, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if err := f.CatchUp(ctx); err != nil {
		t.Fatalf("catch-up failed on the poison: %v", err)
	}
	for _, want := range []string{
		fmt.Sprintf(
			"level=WARN msg=\"an event on the stream cannot be applied; set aside, never to be retried\" stream_seq=%d reason=apply",
			poison,
		),
		fmt.Sprintf(
			"level=WARN msg=\"an event on the stream cannot be applied; set aside, never to be retried\" stream_seq=%d reason=position",
			move,
		),
		fmt.Sprintf(
			"level=WARN msg=\"not a syncd event; set aside, never to be retried\" stream_seq=%d subject=ev.garbage.x reason=decode",
			ack.Sequence,
		)} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("the log lacks %q:\n%s", want, logs.String())
		}
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Fatalf("the follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
	if got := rej.get(); got[cluster.RejectApply] != 1 || got[cluster.RejectPosition] != 1 ||
		got[cluster.RejectDecode] != 1 ||
		len(got) != 3 {
		t.Errorf("reasonCounts %v, want one each of apply, position, decode", got)
	}
	// Terminated, not NAK'd: nothing is pending or waiting for an ack, and
	// another catch-up sees none of them again.
	cons, err := js.Consumer(ctx, "EV", "f1")
	if err != nil {
		t.Fatal(err)
	}
	ci, err := cons.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ci.NumPending != 0 || ci.NumAckPending != 0 || ci.NumRedelivered != 0 {
		t.Errorf(
			"consumer pending %d, ack pending %d, redelivered %d: want 0, 0, 0",
			ci.NumPending,
			ci.NumAckPending,
			ci.NumRedelivered,
		)
	}
	leader.change(1)
	leader.publish()
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rej.get(); got[cluster.RejectApply] != 1 || got[cluster.RejectPosition] != 1 {
		t.Errorf("reasonCounts after another catch-up %v: a poison message came again", got)
	}
	var evil int
	if err := follower.Reader().QueryRow(
		`SELECT count(*) FROM tags WHERE uid = 'g/r1/evil' OR digest = 'sha256:evil'`,
	).Scan(
		&evil,
	); err != nil ||
		evil != 0 {
		t.Errorf("the poison left %d rows (%v)", evil, err)
	}
}

// TestFollower_FetchBoundedInBytes: a fetch takes no more than MaxBytes of
// messages, whatever the batch size: here 200 messages of about 1 KiB, in
// fetches of at most 32 KiB.
func TestFollower_FetchBoundedInBytes(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(200)
	leader.publish()
	follower, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	const maxBytes = 32 << 10
	var sizes []int
	stream, err := js.Stream(ctx, "EV")
	if err != nil {
		t.Fatal(err)
	}
	si, err := stream.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	f := cluster.NewFollower(
		js,
		follower,
		cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1", Batch: 1000,
			MaxWait: 200 * time.Millisecond, MaxBytes: maxBytes, OnBatch: func(n int, _ uint64) { sizes = append(sizes, n) }},
	)
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	// The messages differ in size (a tag.created, a history.recorded):
	// a fetch of most messages holds at least most of the smallest.
	smallest, largest := math.MaxInt, 0
	for seq := si.State.FirstSeq; seq <= si.State.LastSeq; seq++ {
		m, err := stream.GetMsg(ctx, seq)
		if err != nil {
			t.Fatal(err)
		}
		size := len(m.Subject) + len(m.Data)
		for k, vs := range m.Header {
			for _, v := range vs {
				size += len(k) + len(v)
			}
		}
		smallest, largest = min(smallest, size), max(largest, size)
	}
	total, most := 0, 0
	for _, n := range sizes {
		total, most = total+n, max(most, n)
	}
	if total != int(si.State.Msgs) {
		t.Fatalf("applied %d events, the stream holds %d", total, si.State.Msgs)
	}
	if most*smallest > maxBytes+largest || most >= int(si.State.Msgs) {
		t.Errorf("a fetch took %d messages of at least %d bytes: more than %d bytes", most, smallest, maxBytes)
	}
	if !strings.Contains(mirrorRows(t, follower), "g/r1/t200") {
		t.Error("the last tag is missing")
	}
}

// snapshotBody is a copy of st as a snapshot's object holds it (zstd),
// after the SQL in mutate ran on the copy (a planted snapshot).
func snapshotBody(t *testing.T, st *store.Store, mutate func(path string)) []byte {
	t.Helper()
	path := filepath.Join(t.TempDir(), "copy.db")
	if err := store.CreateEmpty(path); err != nil {
		t.Fatal(err)
	}
	if err := st.Backup(context.Background(), path); err != nil {
		t.Fatal(err)
	}
	if mutate != nil {
		mutate(path)
	}
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return zstdOf(t, raw)
}

func zstdOf(t *testing.T, raw []byte) []byte {
	t.Helper()
	var b bytes.Buffer
	enc, err := zstd.NewWriter(&b, zstd.WithEncoderLevel(zstd.SpeedFastest))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := enc.Write(raw); err != nil {
		t.Fatal(err)
	}
	if err := enc.Close(); err != nil {
		t.Fatal(err)
	}
	return b.Bytes()
}

// execOn runs q on the database file at path.
func execOn(q string) func(path string) {
	return func(path string) {
		db, err := sql.Open("sqlite", path)
		if err != nil {
			panic(err)
		}
		defer db.Close()
		if _, err := db.Exec(q); err != nil {
			panic(err)
		}
	}
}

// plant puts body into bucket as a snapshot named name with the metadata
// given, as any client of the account can (ajs: the attacker's).
func plant(t *testing.T, ajs jetstream.JetStream, bucket, name string, created time.Time, seq uint64, body []byte) {
	t.Helper()
	ctx := context.Background()
	obj, err := ajs.CreateOrUpdateObjectStore(
		ctx,
		jetstream.ObjectStoreConfig{Bucket: bucket, Storage: jetstream.FileStorage},
	)
	if err != nil {
		t.Fatal(err)
	}
	_, err = obj.Put(
		ctx,
		jetstream.ObjectMeta{Name: name, Metadata: map[string]string{"stream_seq": strconv.FormatUint(seq, 10),
			"created": created.Format(time.RFC3339Nano), "raw_bytes": "4096"}},
		bytes.NewReader(body),
	)
	if err != nil {
		t.Fatal(err)
	}
}

// lastSeq is the stream's last sequence.
func lastSeq(t *testing.T, js jetstream.JetStream) uint64 {
	t.Helper()
	s, err := js.Stream(context.Background(), "EV")
	if err != nil {
		t.Fatal(err)
	}
	si, err := s.Info(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return si.State.LastSeq
}

// objectNames lists bucket's objects.
func objectNames(ctx context.Context, js jetstream.JetStream, bucket string) ([]string, error) {
	obj, err := js.ObjectStore(ctx, bucket)
	if err != nil {
		return nil, err
	}
	lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	list, err := obj.List(lctx)
	var names []string
	for _, o := range list {
		names = append(names, o.Name)
	}
	sort.Strings(names)
	return names, err
}

// TestSnapshot_PlantedFutureSnapshotIgnored: an object planted in the
// snapshot bucket that claims created = 2099 and a stream sequence far
// beyond the stream's neither stops the leader writing snapshots nor makes
// it prune its genuine one, and a new follower restores the genuine one,
// counting the planted one as rejected.
func TestSnapshot_PlantedFutureSnapshotIgnored(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(3)
	leader.publish()
	const planted = "mirror-20990101T000000.000Z"
	future := time.Date(2099, 1, 1, 0, 0, 0, 0, time.UTC)
	body := snapshotBody(t, leader.st, nil)

	// A bucket holding only the planted object: the leader writes its
	// own snapshot at once.
	ajs := attackerJS(t, js)
	plant(t, ajs, "fresh", planted, future, 18446744073709551000, body)
	fresh := cluster.NewSnapshotter(
		js,
		leader.st,
		cluster.SnapshotConfig{Bucket: "fresh", Stream: "EV", Every: time.Hour, Keep: 1, Dir: t.TempDir()},
	)
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- fresh.Run(rctx) }()
	testutil.Eventually(t, 20*time.Second, func() error {
		if l := fresh.Last(); l.Name == "" || l.Name == planted {
			return fmt.Errorf("the leader's last snapshot is %q", l.Name)
		}
		return nil
	})
	cancel()
	<-done

	// A bucket with the leader's genuine snapshot, then the planted one:
	// the leader's Run takes the genuine one as the newest (and writes
	// none for an hour), and prunes nothing at keep = 1.
	snaps := cluster.NewSnapshotter(
		js,
		leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 1, Dir: t.TempDir()},
	)
	genuine, err := snaps.Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	plant(t, ajs, "snaps", planted, future, 18446744073709551000, body)
	snaps = cluster.NewSnapshotter(
		js,
		leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 1, Dir: t.TempDir()},
	)
	rctx, cancel = context.WithCancel(ctx)
	go func() { done <- snaps.Run(rctx) }()
	testutil.Eventually(t, 20*time.Second, func() error {
		if l := snaps.Last(); l.Name != genuine.Name {
			return fmt.Errorf("the leader's newest snapshot is %q, want its own %q", l.Name, genuine.Name)
		}
		return nil
	})
	cancel()
	<-done
	if names, err := objectNames(ctx, js, "snaps"); err != nil || !slices.Contains(names, genuine.Name) {
		t.Fatalf("the bucket holds %v (%v): the genuine snapshot %s was pruned", names, err, genuine.Name)
	}

	follower, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	var rej reasonCounts
	f := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond, SnapshotBucket: "snaps", SnapshotDir: t.TempDir(), OnReject: rej.add})
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if got := f.Restored(); got.Name != genuine.Name || got.Seq != genuine.Seq {
		t.Errorf("restored %+v, want the genuine snapshot %+v", got, genuine)
	}
	if got := rej.get(); got[cluster.RejectSnapshot] != 1 {
		t.Errorf("reasonCounts %v, want one snapshot", got)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Errorf("follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
}

// TestSnapshot_BadSnapshotsFallBack: snapshots planted with plausible
// metadata but an extra view (a recursive one) or trigger, damaged pages,
// or decompressing beyond the bound, are each refused before anything is
// copied and counted; the follower restores the older genuine one, and
// with none genuine follows the stream from its start.
func TestSnapshot_BadSnapshotsFallBack(t *testing.T) {
	ctx := context.Background()
	js, leader := newStreamLeader(t)
	leader.change(3)
	leader.publish()
	damage := func(path string) {
		b, err := os.ReadFile(path)
		if err != nil {
			panic(err)
		}
		for i := 4096 + 100; i < len(b); i += 7 {
			b[i] ^= 0x5a
		}
		if err := os.WriteFile(path, b, 0o600); err != nil {
			panic(err)
		}
	}
	const bound = 4 << 20
	bad := map[string][]byte{
		"mirror-bad1-view": snapshotBody(
			t,
			leader.st,
			execOn(`CREATE VIEW boom AS WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT x FROM c`),
		),
		"mirror-bad2-trigger": snapshotBody(
			t,
			leader.st,
			execOn(`CREATE TRIGGER evil AFTER INSERT ON tags BEGIN DELETE FROM repos; END`),
		),
		"mirror-bad3-damaged": snapshotBody(t, leader.st, damage),
		"mirror-bad4-bomb":    zstdOf(t, make([]byte, 4*bound)),
	}
	ajs := attackerJS(t, js)
	plantAll := func(bucket string) {
		for _, name := range slices.Sorted(maps.Keys(bad)) {
			plant(t, ajs, bucket, name, time.Now(), lastSeq(t, js), bad[name])
		}
	}
	if n := len(bad["mirror-bad4-bomb"]); n > 32<<10 {
		t.Fatalf("the bomb is %d bytes compressed, want a small one", n)
	}
	follow := func(bucket string) (*cluster.Follower, *store.Store, map[string]int) {
		t.Helper()
		st, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		var rej reasonCounts
		f := cluster.NewFollower(js, st, cluster.FollowerConfig{
			Stream:          "EV",
			SubjectPrefix:   "ev",
			Consumer:        "f-" + bucket,
			MaxWait:         200 * time.Millisecond,
			SnapshotBucket:  bucket,
			SnapshotDir:     t.TempDir(),
			MaxRestoreBytes: bound,
			OnReject:        rej.add,
		})
		if err := f.CatchUp(ctx); err != nil {
			t.Fatalf("catch-up with bad snapshots in %s: %v", bucket, err)
		}
		if l, fo := mirrorRows(t, leader.st), mirrorRows(t, st); l != fo {
			t.Errorf("%s: follower differs from the leader:\nleader:\n%s\nfollower:\n%s", bucket, l, fo)
		}
		var extra int
		if err := st.Reader().QueryRow(`SELECT count(*) FROM sqlite_schema WHERE name IN ('boom', 'evil')`).Scan(
			&extra,
		); err != nil ||
			extra != 0 {
			t.Errorf("%s: the follower's mirror holds %d of the planted objects (%v)", bucket, extra, err)
		}
		return f, st, rej.get()
	}

	// None genuine: the stream.
	plantAll("none")
	f, _, rej := follow("none")
	if f.Restored().Name != "" {
		t.Errorf("restored %q, want none", f.Restored().Name)
	}
	if rej[cluster.RejectSnapshot] != len(bad) {
		t.Errorf("reasonCounts %v, want %d snapshots", rej, len(bad))
	}

	// An older genuine one.
	snaps := cluster.NewSnapshotter(
		js,
		leader.st,
		cluster.SnapshotConfig{Bucket: "snaps", Stream: "EV", Every: time.Hour, Keep: 10, Dir: t.TempDir()},
	)
	genuine, err := snaps.Write(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	leader.change(2)
	leader.publish()
	plantAll("snaps")
	f, _, rej = follow("snaps")
	if got := f.Restored(); got.Name != genuine.Name {
		t.Errorf("restored %q, want the genuine %q", got.Name, genuine.Name)
	}
	if rej[cluster.RejectSnapshot] != len(bad) {
		t.Errorf("reasonCounts %v, want %d snapshots", rej, len(bad))
	}
}
