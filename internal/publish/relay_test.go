package publish_test

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding/format"
	cloudevents "github.com/cloudevents/sdk-go/v2/event"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// expectedEvent is an event a test caused, described independently of the
// store: what a consumer must find in the stream.
type expectedEvent struct {
	typ, subject, scope string
	time                time.Time
	// check inspects data.before and data.after (nil for JSON null).
	check func(before, after map[string]any) error
}

func (e expectedEvent) key() string {
	return e.typ + "|" + e.subject + "|" + e.time.UTC().Format(time.RFC3339Nano)
}

func fieldIs(m map[string]any, name string, want any) error {
	if m == nil {
		return fmt.Errorf("%s: object is null", name)
	}
	if got := m[name]; got != want {
		return fmt.Errorf("%s = %v, want %v", name, got, want)
	}
	return nil
}

func isNull(m map[string]any, which string) error {
	if m != nil {
		return fmt.Errorf("data.%s = %v, want null", which, m)
	}
	return nil
}

// TestRelay_CloudEvents publishes every kind of event the store records and
// decodes what a consumer receives with the CloudEvents Go SDK.
func TestRelay_CloudEvents(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	conn := mustConnect(t, srv.config(nil))
	st := mustOpenStore(t)
	p := newProducer(t, st)

	// Repo names with characters NATS forbids in a token exercise escaping.
	p.addRepos(ctx, "team.a web*", 2, 2)
	p.addRepos(ctx, "nginx", 1, 1)
	var want []expectedEvent
	for _, r := range p.repos {
		want = append(want, expectedEvent{typ: store.RepoCreated, subject: r.UID, scope: r.Name, time: baseTime,
			check: func(before, after map[string]any) error {
				if err := isNull(before, "before"); err != nil {
					return err
				}
				return fieldIs(after, "name", r.Name)
			}})
		for _, tag := range p.tags[r.UID] {
			want = append(want, expectedEvent{typ: store.TagCreated, subject: tag.UID, scope: r.Name, time: baseTime,
				check: func(before, after map[string]any) error {
					if err := isNull(before, "before"); err != nil {
						return err
					}
					return fieldIs(after, "digest", digest(0))
				}})
		}
	}
	p.moveAll(ctx, 2)
	for _, r := range p.repos {
		for _, tag := range p.tags[r.UID] {
			// The tag's first history record, which no move announces,
			// as a replication record.
			want = append(want, expectedEvent{typ: store.HistoryRecorded, subject: tag.UID, scope: r.Name, time: baseTime})
			for n := 1; n <= 2; n++ {
				want = append(
					want,
					expectedEvent{
						typ:     store.TagMoved,
						subject: tag.UID,
						scope:   r.Name,
						time:    baseTime.Add(time.Duration(n) * time.Minute),
						check: func(before, after map[string]any) error {
							if err := fieldIs(before, "digest", digest(n-1)); err != nil {
								return fmt.Errorf("before: %w", err)
							}
							return fieldIs(after, "digest", digest(n))
						},
					},
				)
			}
		}
	}
	// One repo changes its description, and one tag is deprecated.
	r0 := p.repos[0]
	r0.Description, r0.UpdateTime = "second", baseTime.Add(time.Hour)
	if _, err := st.ApplyRepos(ctx, []store.Repo{r0}); err != nil {
		t.Fatal(err)
	}
	want = append(want, expectedEvent{typ: store.RepoUpdated, subject: r0.UID, scope: r0.Name, time: r0.UpdateTime,
		check: func(before, after map[string]any) error {
			if err := fieldIs(before, "description", "first"); err != nil {
				return fmt.Errorf("before: %w", err)
			}
			return fieldIs(after, "description", "second")
		}})
	tags := append([]store.Tag(nil), p.tags[r0.UID]...)
	tags[0].Deprecated, tags[0].Digest, tags[0].UpdateTime = true, digest(2), baseTime.Add(2*time.Hour)
	if _, _, err := st.ApplyTags(ctx, r0, tags); err != nil {
		t.Fatal(err)
	}
	want = append(
		want,
		expectedEvent{typ: store.TagDeprecated, subject: tags[0].UID, scope: r0.Name, time: tags[0].UpdateTime,
			check: func(before, after map[string]any) error {
				if err := fieldIs(before, "deprecated", false); err != nil {
					return fmt.Errorf("before: %w", err)
				}
				return fieldIs(after, "deprecated", true)
			}},
	)

	relay := publish.NewRelay(conn.JS, st, srv.config(nil))
	if err := relay.Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	for _, e := range storedEvents(t, st) {
		if !e.Published {
			t.Errorf("event seq %d (%s) not marked published after Flush", e.Seq, e.ID)
		}
	}

	got := consumeAll(t, conn.JS, len(want))
	byKey := make(map[string]cloudevents.Event)
	for _, m := range got {
		ct := first(m.Header, "Content-Type")
		if ct != "application/cloudevents+json" {
			t.Fatalf("message %d: Content-Type %q, want application/cloudevents+json", m.StreamSeq, ct)
		}
		f := format.Lookup(ct)
		if f == nil {
			t.Fatalf("the CloudEvents SDK knows no format %q", ct)
		}
		ev := cloudevents.New()
		if err := f.Unmarshal(m.Data, &ev); err != nil {
			t.Fatalf("message %d: CloudEvents SDK cannot decode %s: %v", m.StreamSeq, m.Data, err)
		}
		if err := ev.Validate(); err != nil {
			t.Fatalf("message %d: invalid CloudEvent: %v", m.StreamSeq, err)
		}
		if got, want := ev.ID(), first(m.Header, jetstream.MsgIDHeader); got != want || got == "" {
			t.Errorf("message %d: id %q, Nats-Msg-Id %q: want equal and non-empty", m.StreamSeq, got, want)
		}
		if ev.SpecVersion() != "1.0" || ev.Source() != testSource || ev.DataContentType() != "application/json" {
			t.Errorf(
				"message %d: specversion %q, source %q, datacontenttype %q",
				m.StreamSeq,
				ev.SpecVersion(),
				ev.Source(),
				ev.DataContentType(),
			)
		}
		typ, ok := strings.CutPrefix(ev.Type(), publish.TypePrefix)
		if !ok {
			t.Fatalf("message %d: type %q lacks prefix %q", m.StreamSeq, ev.Type(), publish.TypePrefix)
		}
		key := typ + "|" + ev.Subject() + "|" + ev.Time().UTC().Format(time.RFC3339Nano)
		if _, dup := byKey[key]; dup {
			t.Errorf("message %d: %s received twice", m.StreamSeq, key)
		}
		byKey[key] = ev
		// The NATS subject carries resource, action and the escaped scope.
		resource, action, _ := strings.Cut(typ, ".")
		tokens := strings.Split(m.Subject, ".")
		if len(tokens) != 4 || tokens[0] != testPrefix || tokens[1] != resource || tokens[2] != action {
			t.Errorf("message %d: subject %q does not match type %s", m.StreamSeq, m.Subject, typ)
		}
	}
	for _, w := range want {
		ev, ok := byKey[w.key()]
		if !ok {
			t.Errorf("no %s event for %s at %s", w.typ, w.subject, w.time)
			continue
		}
		if w.typ == store.HistoryRecorded {
			var rec store.RecordedHistory
			if err := ev.DataAs(&rec); err != nil || rec.Tag != w.subject || len(rec.Records) != 1 || rec.Records[0].Seq != 0 {
				t.Errorf("%s: data %+v (%v), want the tag's first record", w.key(), rec, err)
			}
			continue
		}
		var data struct{ Before, After map[string]any }
		if err := ev.DataAs(&data); err != nil {
			t.Errorf("%s: data: %v", w.key(), err)
			continue
		}
		if err := w.check(data.Before, data.After); err != nil {
			t.Errorf("%s: data: %v", w.key(), err)
		}
	}
	// Every scope is recoverable from the subject.
	scopes := make(map[string]bool)
	for _, w := range want {
		scopes[publish.Subject(testPrefix, "x", "y", w.scope)] = true
	}
	for _, m := range got {
		tok := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
		scope, err := publish.UnescapeToken(tok)
		if err != nil || !scopes[publish.Subject(testPrefix, "x", "y", scope)] {
			t.Errorf("subject %q: scope token %q unescapes to %q (%v), not a repo name", m.Subject, tok, scope, err)
		}
	}
	if len(got) != len(want) {
		t.Errorf("received %d events, want %d", len(got), len(want))
	}
}

func first(h map[string][]string, key string) string {
	if v := h[key]; len(v) > 0 {
		return v[0]
	}
	return ""
}

// assertExactlyOnceInOrder checks the stream against the events table:
// every event once, and the events of each resource in commit order.
func assertExactlyOnceInOrder(t *testing.T, got []received, stored []storedEvent) {
	t.Helper()
	seqOf := make(map[string]storedEvent, len(stored))
	for _, e := range stored {
		seqOf[e.ID] = e
	}
	seen := make(map[string]bool, len(got))
	last := make(map[string]int64) // resource -> store seq of its last event in the stream
	for _, m := range got {
		id := first(m.Header, jetstream.MsgIDHeader)
		e, ok := seqOf[id]
		if !ok {
			t.Fatalf("stream message %d has id %q, which the store never recorded", m.StreamSeq, id)
		}
		if seen[id] {
			t.Errorf("event %s (seq %d) is in the stream twice", id, e.Seq)
		}
		seen[id] = true
		if prev, ok := last[e.Subject]; ok && prev > e.Seq {
			t.Errorf("resource %s: event seq %d reached the stream after seq %d", e.Subject, e.Seq, prev)
		}
		last[e.Subject] = e.Seq
	}
	for _, e := range stored {
		if !seen[e.ID] {
			t.Errorf("event %s (seq %d) never reached the stream", e.ID, e.Seq)
		}
	}
}

// TestRelay_NATSOutage stops the server for a few seconds while changes are
// committed, then starts it again on the same port and storage: the relay
// reconnects and a consumer sees every event once, in per-resource order.
func TestRelay_NATSOutage(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	var logs logBuffer
	cfg := srv.config(logs.logger())
	conn := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	startRelay(t, publish.NewRelay(conn.JS, st, cfg))

	p.addRepos(ctx, "before", 5, 4)
	testutil.Eventually(t, 10*time.Second, unpublished(t, st))

	srv.Stop()
	testutil.WaitFor(
		t,
		5*time.Second,
		"the client to see the disconnection",
		func() bool { return !conn.NC.IsConnected() },
	)
	// Changes keep coming during an outage of about three seconds.
	tagUIDs := []string{p.tags[p.repos[0].UID][0].UID, p.tags[p.repos[1].UID][1].UID}
	outage := time.NewTicker(100 * time.Millisecond)
	for i := range 30 {
		<-outage.C
		p.updateAll(ctx)
		p.move(ctx, tagUIDs[i%2], 2)
	}
	outage.Stop()
	p.addRepos(ctx, "during", 5, 4)
	if n, _, _ := st.UnpublishedCount(ctx); n == 0 {
		t.Fatal("no events waited for the server during the outage")
	}
	srv.Start()

	testutil.Eventually(t, 30*time.Second, unpublished(t, st))
	stored := storedEvents(t, st)
	assertExactlyOnceInOrder(t, consumeAll(t, conn.JS, len(stored)), stored)
	for _, want := range []string{"NATS disconnected", "NATS reconnected"} {
		if !strings.Contains(logs.String(), want) {
			t.Errorf("log lacks %q:\n%s", want, logs.String())
		}
	}
}

// TestRelay_ServerKilledMidBatch cuts the connection while thousands of
// publishes are in flight: some were stored but not acknowledged, some were
// lost. After the restart every event is in the stream once and in order.
func TestRelay_ServerKilledMidBatch(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	cfg := srv.config(nil)
	conn := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	// 1,000 resources with 4 events each, every one in a different batch.
	p.addRepos(ctx, "big", 1000, 0)
	for range 3 {
		p.updateAll(ctx)
	}

	acked := make(chan struct{})
	var n atomic.Int64
	relay := publish.NewRelay(conn.JS, st, cfg, publish.WithOnPublished(func(store.Event) {
		if n.Add(1) == 1000 {
			close(acked)
		}
	}))
	startRelay(t, relay)
	<-acked
	srv.Stop()
	// Acknowledgements that were on their way when the server stopped still
	// count; what matters is that many publishes were cut.
	if cut, total := n.Load(), len(storedEvents(t, st)); cut >= int64(total)*3/4 {
		t.Fatalf("%d of %d events acknowledged before the server stopped; the test cut too little", cut, total)
	}
	srv.Start()

	testutil.Eventually(t, 30*time.Second, unpublished(t, st))
	stored := storedEvents(t, st)
	assertExactlyOnceInOrder(t, consumeAll(t, conn.JS, len(stored)), stored)
}

// TestRelay_WakesOnCommit checks that the relay publishes a new event right
// after its commit, not at its next timer tick (a minute).
func TestRelay_WakesOnCommit(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	cfg := srv.config(nil)
	conn := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	startRelay(t, publish.NewRelay(conn.JS, st, cfg))

	p.addRepos(ctx, "first", 1, 1)
	testutil.Eventually(t, 5*time.Second, unpublished(t, st))
	for i := range 3 {
		p.moveAll(ctx, 1)
		testutil.Eventually(t, 5*time.Second, unpublished(t, st))
		// repo.created, tag.created, history.recorded, and a move a round.
		if got, want := len(storedEvents(t, st)), 3+i+1; got != want {
			t.Fatalf("events = %d, want %d", got, want)
		}
	}
}

// TestRelay_FailedResourceWaits makes one resource's event unpublishable (too
// large for the server): that resource's later events must wait behind it,
// while every other resource's events go out.
func TestRelay_FailedResourceWaits(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, func(o *server.Options) { o.MaxPayload = 8 << 10 })
	cfg := srv.config(nil)
	conn := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	p.addRepos(ctx, "repo", 3, 0)
	huge := p.repos[1]
	huge.Description, huge.UpdateTime = strings.Repeat("x", 16<<10), baseTime.Add(time.Hour)
	if _, err := st.ApplyRepos(ctx, []store.Repo{huge}); err != nil {
		t.Fatal(err)
	}
	// A later, small change of the same repo, and of another repo.
	small, other := huge, p.repos[2]
	small.Description, small.UpdateTime = "small", baseTime.Add(2*time.Hour)
	other.Description, other.UpdateTime = "other", baseTime.Add(2*time.Hour)
	if _, err := st.ApplyRepos(ctx, []store.Repo{small, other}); err != nil {
		t.Fatal(err)
	}

	relay := publish.NewRelay(conn.JS, st, cfg)
	err := relay.Flush(ctx)
	if err == nil || !strings.Contains(err.Error(), "repo.updated") || !strings.Contains(err.Error(), "maximum payload") {
		t.Fatalf("Flush = %v, want an error about the too large repo.updated event", err)
	}
	stored := storedEvents(t, st)
	var published []storedEvent
	for _, e := range stored {
		switch {
		case e.Subject == huge.UID && e.Seq > stored[1].Seq:
			if e.Published {
				t.Errorf("event seq %d of %s published ahead of the one that failed", e.Seq, huge.UID)
			}
		case !e.Published:
			t.Errorf("event seq %d of %s not published, though its resource had no failure", e.Seq, e.Subject)
		default:
			published = append(published, e)
		}
	}
	assertExactlyOnceInOrder(t, consumeAll(t, conn.JS, len(published)), published)
}

// TestRelay_CommitsDuringAPass commits events while the relay is busy
// publishing earlier ones: each pass reads the outbox as of its start, and
// the relay must pass again for what came after, at once rather than at
// its idle timer (a minute).
func TestRelay_CommitsDuringAPass(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	ctx := context.Background()
	srv := startServer(t, nil)
	conn := mustConnect(t, srv.config(nil))
	st := mustOpenStore(t)
	p := newProducer(t, st)
	p.addRepos(ctx, "busy", 10, 50)
	startRelay(t, publish.NewRelay(conn.JS, st, srv.config(nil), publish.WithBatch(16), publish.WithMaxInFlight(32)))
	// One commit after another, while the relay works through the 510
	// created events and each move before the next.
	commits := 0
	for _, r := range p.repos {
		for _, tag := range p.tags[r.UID] {
			p.move(ctx, tag.UID, 1)
			commits++
		}
	}
	const want = 10 + 10*50 + 500 + 500 // repos, tags, each tag's first record (history.recorded), one move each
	if commits != 500 {
		t.Fatalf("made %d moves, want 500", commits)
	}
	testutil.Eventually(t, 20*time.Second, unpublished(t, st))
	if n := len(storedEvents(t, st)); n != want {
		t.Fatalf("store has %d events, want %d", n, want)
	}
	consumeAll(t, conn.JS, want)
}

// TestRelay_ErrWhileNotPublishing: Err, which the leader's readiness
// check reads, says why while JetStream does not take the events (here the
// stream is gone, as when it has no leader), and is nil again once the
// relay publishes.
func TestRelay_ErrWhileNotPublishing(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	cfg := srv.config(nil)
	conn := mustConnect(t, cfg)
	st := mustOpenStore(t)
	p := newProducer(t, st)
	r := publish.NewRelay(conn.JS, st, cfg)
	startRelay(t, r)
	p.addRepos(ctx, "before", 2, 2)
	testutil.Eventually(t, 10*time.Second, unpublished(t, st))
	if err := r.Err(); err != nil {
		t.Fatalf("Err while publishing = %v", err)
	}
	if err := conn.JS.DeleteStream(ctx, testStream); err != nil {
		t.Fatal(err)
	}
	p.addRepos(ctx, "during", 2, 2)
	testutil.WaitFor(t, 10*time.Second, "Err to say the relay does not publish", func() bool { return r.Err() != nil })
	// Until the server has removed the deleted stream's files, creating it
	// again can fail ("error creating store for stream").
	testutil.Eventually(t, 10*time.Second, func() error { return publish.EnsureStream(ctx, conn.JS, cfg) })
	testutil.Eventually(t, 20*time.Second, unpublished(t, st))
	testutil.WaitFor(t, 10*time.Second, "Err to clear", func() bool { return r.Err() == nil })
}
