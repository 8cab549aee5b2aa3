package testutil_test

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestLoseTail: a server started again after LoseTail holds the stream
// (its creation time the same) without its last messages, and gives the
// next message the first lost sequence, with its id accepted again.
func TestLoseTail(t *testing.T) {
	ctx := context.Background()
	ns := testutil.NATS(t)
	nc, err := nats.Connect(ns.URL(), nats.MaxReconnects(-1))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "TAIL", Subjects: []string{"tail.>"}})
	if err != nil {
		t.Fatal(err)
	}
	publish := func(i int) *jetstream.PubAck {
		t.Helper()
		m := &nats.Msg{Subject: fmt.Sprintf("tail.%d", i%3), Data: []byte(fmt.Sprint(i)), Header: nats.Header{}}
		m.Header.Set(jetstream.MsgIDHeader, fmt.Sprint("id-", i))
		ack, err := js.PublishMsg(ctx, m)
		if err != nil {
			t.Fatal(err)
		}
		return ack
	}
	for i := 1; i <= 10; i++ {
		publish(i)
	}
	before, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}

	ns.Stop()
	lost := ns.LoseTail("TAIL", 3)
	ns.Start()

	if want := []uint64{8, 9, 10}; !slices.Equal(lost, want) {
		t.Fatalf("lost %v, want %v", lost, want)
	}
	testutil.Eventually(t, 10*time.Second, func() error {
		_, err := s.Info(ctx)
		return err
	})
	after, err := s.Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if after.State.LastSeq != 7 || after.State.Msgs != 7 || !after.Created.Equal(before.Created) {
		t.Fatalf("after the loss: last %d, %d messages, created %v; want 7, 7, %v",
			after.State.LastSeq, after.State.Msgs, after.Created, before.Created)
	}
	if m, err := s.GetLastMsgForSubject(ctx, "tail.1"); err != nil || string(m.Data) != "7" {
		t.Fatalf("tail.1's last message after the loss = %v, %v; want 7's", m, err)
	}
	if ack := publish(8); ack.Sequence != 8 || ack.Duplicate {
		t.Fatalf("a lost message's id published again: %+v; want sequence 8, not a duplicate", ack)
	}
}
