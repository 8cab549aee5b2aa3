package cluster_test

import (
	"context"
	"encoding/json"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/store"
)

// rejections counts the reasons a follower reports, as the
// syncd_rejected_messages_total{reason} counter does.
type rejections struct {
	mu sync.Mutex
	n  map[string]int
}

func (r *rejections) add(reason string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.n == nil {
		r.n = map[string]int{}
	}
	r.n[reason]++
}

func (r *rejections) get() map[string]int {
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

// publishForged publishes a CloudEvent of syncd's shape on subject, as an
// attacker or a faulty peer would, and waits for the stream to hold it.
func publishForged(t *testing.T, nc *nats.Conn, subject, id, typ, eventSubject, data string) {
	t.Helper()
	ce, err := json.Marshal(map[string]any{"specversion": "1.0", "id": id, "source": "evil", "type": "dev.syncd." + typ,
		"subject": eventSubject, "time": "2026-01-03T00:00:00Z", "datacontenttype": "application/json", "data": json.RawMessage(data)})
	if err != nil {
		t.Fatal(err)
	}
	ajs, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ajs.Publish(context.Background(), subject, ce); err != nil {
		t.Fatal(err)
	}
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
	publishForged(t, nc, "ev.tag.created.nginx", "poison-1", "tag.created", "g/r1/evil", `{"before":null,"after":{"uid":5}}`)
	// g/r1/t1 exists, so the move reaches the position search.
	publishForged(t, nc, "ev.tag.moved.nginx", "forged-move", "tag.moved", "g/r1/t1",
		`{"before":null,"after":{"uid":"g/r1/t1","repoUid":"g/r1","repo":"nginx","name":"v1","digest":"sha256:evil","updateTime":"2026-01-03T00:00:00Z"}}`)
	if _, err := nc.Request("ev.garbage.x", []byte("not json"), 5*time.Second); err != nil {
		t.Fatal(err) // the stream's acknowledgement
	}
	leader.change(1) // the genuine tag after the poison
	leader.publish()

	follower, err := store.Open(ctx, filepath.Join(t.TempDir(), "follower.db"), store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { follower.Close() })
	var rej rejections
	f := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1",
		MaxWait: 200 * time.Millisecond, OnReject: rej.add})
	if err := f.CatchUp(ctx); err != nil {
		t.Fatalf("catch-up failed on the poison: %v", err)
	}
	if l, fo := mirrorRows(t, leader.st), mirrorRows(t, follower); l != fo {
		t.Fatalf("the follower differs from the leader:\nleader:\n%s\nfollower:\n%s", l, fo)
	}
	if got := rej.get(); got[cluster.RejectApply] != 1 || got[cluster.RejectPosition] != 1 || got[cluster.RejectDecode] != 1 || len(got) != 3 {
		t.Errorf("rejections %v, want one each of apply, position, decode", got)
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
		t.Errorf("consumer pending %d, ack pending %d, redelivered %d: want 0, 0, 0", ci.NumPending, ci.NumAckPending, ci.NumRedelivered)
	}
	leader.change(1)
	leader.publish()
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	if got := rej.get(); got[cluster.RejectApply] != 1 || got[cluster.RejectPosition] != 1 {
		t.Errorf("rejections after another catch-up %v: a poison message came again", got)
	}
	var evil int
	if err := follower.Reader().QueryRow(`SELECT count(*) FROM tags WHERE uid = 'g/r1/evil' OR digest = 'sha256:evil'`).Scan(&evil); err != nil || evil != 0 {
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
	f := cluster.NewFollower(js, follower, cluster.FollowerConfig{Stream: "EV", SubjectPrefix: "ev", Consumer: "f1", Batch: 1000,
		MaxWait: 200 * time.Millisecond, MaxBytes: maxBytes, OnBatch: func(n int, _ uint64) { sizes = append(sizes, n) }})
	if err := f.CatchUp(ctx); err != nil {
		t.Fatal(err)
	}
	perMsg := int(si.State.Bytes / si.State.Msgs)
	total, most := 0, 0
	for _, n := range sizes {
		total, most = total+n, max(most, n)
	}
	if total != int(si.State.Msgs) {
		t.Fatalf("applied %d events, the stream holds %d", total, si.State.Msgs)
	}
	if most*perMsg > maxBytes+perMsg*2 || most >= int(si.State.Msgs) {
		t.Errorf("a fetch took %d messages of ~%d bytes: more than %d bytes", most, perMsg, maxBytes)
	}
	if !strings.Contains(mirrorRows(t, follower), "g/r1/t200") {
		t.Error("the last tag is missing")
	}
}
