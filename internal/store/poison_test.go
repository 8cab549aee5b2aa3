package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// leaderWithMoves is a leader whose tag g/r1/t1 moved twice, and the
// stream of its events.
func leaderWithMoves(t *testing.T) []store.StreamEvent {
	t.Helper()
	ctx := context.Background()
	clk := newClock()
	leader, _ := openTemp(t, clk, false, store.Options{})
	repo := store.Repo{UID: "g/r1", Name: "nginx", CreateTime: clk.Now(), UpdateTime: clk.Now()}
	if _, err := leader.ApplyRepos(ctx, []store.Repo{repo}); err != nil {
		t.Fatal(err)
	}
	d := func(c string) string { return "sha256:" + strings.Repeat(c, 64) }
	t0 := clk.Now()
	need, _, err := leader.ApplyTags(
		ctx,
		repo,
		[]store.Tag{{UID: "g/r1/t1", Name: "latest", Digest: d("a"), CreateTime: t0, UpdateTime: t0}},
	)
	if err != nil {
		t.Fatal(err)
	}
	recs := []store.HistoryRecord{
		{Time: t0, Digest: d("a")},
		{Time: t0.Add(time.Second), Digest: d("b")},
		{Time: t0.Add(2 * time.Second), Digest: d("c")},
	}
	if _, err := leader.ApplyHistory(ctx, need[0], recs, true); err != nil {
		t.Fatal(err)
	}
	return stream(t, leader)
}

// TestApplyStream_PoisonSetAside: an event that decodes but cannot be
// applied is rejected alone, in a savepoint: the events before and after
// it in the same batch are applied, and it leaves no row behind.
func TestApplyStream_PoisonSetAside(t *testing.T) {
	ctx := context.Background()
	evs := leaderWithMoves(t)
	follower, _ := openTemp(t, newClock(), false, store.Options{})
	poison := store.StreamEvent{ID: "poison", Type: store.TagCreated, Subject: "g/r1/evil", Seq: 1000,
		Data: json.RawMessage(`{"before":null,"after":{"uid":5}}`)}
	unknown := store.StreamEvent{
		ID:      "unknown",
		Type:    "nothing.created",
		Subject: "x",
		Seq:     1001,
		Data:    json.RawMessage(`{}`),
	}
	batch := append(append([]store.StreamEvent{evs[0], poison}, evs[1:]...), unknown)
	res, err := follower.ApplyStream(ctx, batch)
	if err != nil {
		t.Fatal(err)
	}
	if res.Applied != len(evs) {
		t.Errorf("applied %d events, want the %d genuine ones", res.Applied, len(evs))
	}
	if len(res.Rejected) != 2 || res.Rejected[0].Event.ID != "poison" || res.Rejected[1].Event.ID != "unknown" {
		t.Fatalf("rejected %+v, want poison and unknown", res.Rejected)
	}
	var tags, events int
	if err := follower.Reader().QueryRow(`SELECT (SELECT count(*) FROM tags), (SELECT count(*) FROM event_log)`).Scan(
		&tags,
		&events,
	); err != nil {
		t.Fatal(err)
	}
	if tags != 1 || events != len(evs) {
		t.Errorf("the mirror holds %d tags and %d events, want 1 and %d", tags, events, len(evs))
	}
	if seq, _, err := follower.StreamPosition(ctx); err != nil || seq != 1001 {
		t.Errorf("stream position %d (%v), want 1001: the rejected events are behind the mirror too", seq, err)
	}
}

// TestApplyStream_MovePositionFromData: a tag.moved event carries its
// history position, and the follower places it without searching; an
// event of an older leader (no position) is found near the bookmark; a
// forged one whose id matches no position is rejected after at most
// MaxMoveCandidates tries, not 131,072.
func TestApplyStream_MovePositionFromData(t *testing.T) {
	ctx := context.Background()
	evs := leaderWithMoves(t)
	var moves []store.StreamEvent
	for _, e := range evs {
		if e.Type == store.TagMoved {
			moves = append(moves, e)
		}
	}
	if len(moves) != 2 {
		t.Fatalf("%d moves, want 2", len(moves))
	}
	for i, m := range moves {
		var d struct{ Position int }
		if err := json.Unmarshal(m.Data, &d); err != nil || d.Position != i+1 {
			t.Fatalf("move %d carries position %d (%v), want %d", i, d.Position, err, i+1)
		}
	}
	follower, _ := openTemp(t, newClock(), false, store.Options{})
	before := store.MoveCandidates()
	if _, err := follower.ApplyStream(ctx, evs[:len(evs)-1]); err != nil {
		t.Fatal(err)
	}
	if n := store.MoveCandidates() - before; n != 0 {
		t.Errorf("placing a move with its position tried %d positions, want 0", n)
	}
	// The last move as an older leader wrote it.
	old := evs[len(evs)-1]
	var d map[string]json.RawMessage
	if err := json.Unmarshal(old.Data, &d); err != nil {
		t.Fatal(err)
	}
	delete(d, "position")
	old.Data, _ = json.Marshal(d)
	before = store.MoveCandidates()
	if res, err := follower.ApplyStream(ctx, []store.StreamEvent{old}); err != nil || res.Applied != 1 {
		t.Fatalf("an older leader's move: %+v, %v", res, err)
	}
	if n := store.MoveCandidates() - before; n != 1 {
		t.Errorf("placing an older leader's move tried %d positions, want 1 (the one after the bookmark)", n)
	}
	var seq int
	if err := follower.Reader().QueryRow(`SELECT max(seq) FROM tag_history WHERE tag_uid = 'g/r1/t1'`).Scan(
		&seq,
	); err != nil ||
		seq != 2 {
		t.Errorf("the move is at position %d (%v), want 2", seq, err)
	}
	forged := old
	forged.ID, forged.Seq = "ffffffffffffffffffffffffffffffff", 99
	before = store.MoveCandidates()
	res, err := follower.ApplyStream(ctx, []store.StreamEvent{forged})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Rejected) != 1 || !errors.Is(res.Rejected[0].Err, store.ErrUnknownPosition) {
		t.Fatalf("the forged move: %+v, want rejected with ErrUnknownPosition", res)
	}
	if n := store.MoveCandidates() - before; n > store.MaxMoveCandidates {
		t.Errorf("the forged move tried %d positions, want at most %d", n, store.MaxMoveCandidates)
	}
}
