package publish_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// testPrefix and testStream are the subject prefix and stream of every test.
const (
	testPrefix = "syncd"
	testStream = "SYNCD"
	testSource = "https://platform.test/group-1"
)

// baseTime is when the simulated upstream changes begin.
var baseTime = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// testServer is an embedded nats-server with JetStream on a loopback port,
// which a test can stop and start again on the same port and storage.
type testServer struct{ *testutil.NATSServer }

// startServer starts a server; mutate, when set, adjusts its options (auth,
// TLS, limits).
func startServer(tb testing.TB, mutate func(*server.Options)) testServer {
	tb.Helper()
	if mutate == nil {
		return testServer{testutil.NATS(tb)}
	}
	return testServer{testutil.NATS(tb, mutate)}
}

// config is the publish.Config of a test connecting to s.
func (s testServer) config(log *slog.Logger) publish.Config { return configFor(s.URL(), log) }

// configFor is the publish.Config of a test connecting to the servers of url.
func configFor(url string, log *slog.Logger) publish.Config {
	return publish.Config{
		URL: url, SubjectPrefix: testPrefix, Stream: testStream, MaxAge: time.Hour, DuplicateWindow: 10 * time.Minute,
		Source: testSource, Logger: log, ReconnectMaxWait: 500 * time.Millisecond,
	}
}

// mustConnect connects to s and provisions the stream.
func mustConnect(tb testing.TB, cfg publish.Config) *publish.Conn {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := publish.Connect(ctx, cfg)
	if err != nil {
		tb.Fatalf("connect: %v", err)
	}
	tb.Cleanup(c.Close)
	return c
}

// mustOpenStore opens a store in a temporary directory, past its baseline so
// that every change is an event.
func mustOpenStore(tb testing.TB) *store.Store {
	tb.Helper()
	ctx := context.Background()
	st, err := store.Open(ctx, filepath.Join(tb.TempDir(), "syncd.db"), store.Options{})
	if err != nil {
		tb.Fatalf("open store: %v", err)
	}
	tb.Cleanup(func() { st.Close() })
	if err := st.EndBaseline(ctx); err != nil {
		tb.Fatalf("end baseline: %v", err)
	}
	return st
}

// storedEvent is a row of the events table as the tests check it.
type storedEvent struct {
	Seq       int64
	ID        string
	Subject   string
	Published bool
}

// storedEvents returns the events table in commit order.
func storedEvents(tb testing.TB, st *store.Store) []storedEvent {
	tb.Helper()
	rows, err := st.Reader().Query(`SELECT seq, id, subject, published_time IS NOT NULL FROM events ORDER BY seq`)
	if err != nil {
		tb.Fatalf("read events: %v", err)
	}
	defer rows.Close()
	var evs []storedEvent
	for rows.Next() {
		var e storedEvent
		if err := rows.Scan(&e.Seq, &e.ID, &e.Subject, &e.Published); err != nil {
			tb.Fatal(err)
		}
		evs = append(evs, e)
	}
	if err := rows.Err(); err != nil {
		tb.Fatal(err)
	}
	return evs
}

// producer makes upstream changes through the store's Apply functions, as
// the crawler would: repos, tags, and digest moves in the tags' histories.
type producer struct {
	tb    testing.TB
	st    *store.Store
	repos []store.Repo
	tags  map[string][]store.Tag // by repo uid
	refs  map[string]store.TagRef
	moves map[string]int // moves recorded per tag uid
	round int            // updateAll calls
}

func newProducer(tb testing.TB, st *store.Store) *producer {
	return &producer{
		tb:    tb,
		st:    st,
		tags:  make(map[string][]store.Tag),
		refs:  make(map[string]store.TagRef),
		moves: make(map[string]int),
	}
}

// addRepos creates n repos named name-0.. with tagsPerRepo tags each: one
// repo.created per repo and one tag.created per tag.
func (p *producer) addRepos(ctx context.Context, name string, n, tagsPerRepo int) {
	p.tb.Helper()
	var repos []store.Repo
	for i := range n {
		uid := fmt.Sprintf("%s-uid-%d", name, i)
		repos = append(
			repos,
			store.Repo{
				UID:         uid,
				Name:        fmt.Sprintf("%s-%d", name, i),
				Description: "first",
				CreateTime:  baseTime,
				UpdateTime:  baseTime,
			},
		)
	}
	p.applyRepos(ctx, repos)
	p.repos = append(p.repos, repos...)
	for _, r := range repos {
		if tagsPerRepo == 0 {
			continue
		}
		var tags []store.Tag
		for j := range tagsPerRepo {
			tags = append(
				tags,
				store.Tag{UID: fmt.Sprintf("%s-tag-%d", r.UID, j), Name: fmt.Sprintf("v%d", j), Digest: digest(0),
					CreateTime: baseTime, UpdateTime: baseTime},
			)
		}
		need, _, err := p.st.ApplyTags(ctx, r, tags)
		if err != nil {
			p.tb.Fatalf("apply tags of %s: %v", r.Name, err)
		}
		p.tags[r.UID] = tags
		for _, ref := range need {
			p.refs[ref.UID] = ref
			// The first history read, the original record alone,
			// announces the tag.
			if _, err := p.st.ApplyHistory(ctx, ref, []store.HistoryRecord{{Time: baseTime, Digest: digest(0)}},
				true); err != nil {
				p.tb.Fatalf("apply history of %s: %v", ref.UID, err)
			}
		}
	}
}

// applyRepos applies repos in pages of 500, as the crawler would.
func (p *producer) applyRepos(ctx context.Context, repos []store.Repo) {
	p.tb.Helper()
	for start := 0; start < len(repos); start += 500 {
		if _, err := p.st.ApplyRepos(ctx, repos[start:min(start+500, len(repos))]); err != nil {
			p.tb.Fatalf("apply repos: %v", err)
		}
	}
}

// updateAll changes every repo's description: one repo.updated per repo,
// in a few transactions.
func (p *producer) updateAll(ctx context.Context) {
	p.tb.Helper()
	p.round++
	for i := range p.repos {
		p.repos[i].Description = fmt.Sprintf("round %d", p.round)
		p.repos[i].UpdateTime = baseTime.Add(time.Duration(p.round) * time.Minute)
	}
	p.applyRepos(ctx, p.repos)
}

// move records k digest moves of tag, in one history read, which is k
// tag.moved events (its original record was read by addRepos).
func (p *producer) move(ctx context.Context, tagUID string, k int) {
	p.tb.Helper()
	ref := p.refs[tagUID]
	var recs []store.HistoryRecord
	for range k {
		p.moves[tagUID]++
		n := p.moves[tagUID]
		recs = append(recs, store.HistoryRecord{Time: baseTime.Add(time.Duration(n) * time.Minute), Digest: digest(n)})
	}
	if _, err := p.st.ApplyHistory(ctx, ref, recs, true); err != nil {
		p.tb.Fatalf("apply history of %s: %v", tagUID, err)
	}
}

// moveAll moves every tag k times, tag by tag.
func (p *producer) moveAll(ctx context.Context, k int) {
	for _, r := range p.repos {
		for _, t := range p.tags[r.UID] {
			p.move(ctx, t.UID, k)
		}
	}
}

func digest(n int) string { return fmt.Sprintf("sha256:%064x", n) }

// received is a message read from the stream by a consumer.
type received struct {
	StreamSeq uint64
	Stored    time.Time // when the stream stored it
	Subject   string
	Header    map[string][]string
	Data      []byte
}

// consumeAll reads the whole stream with a JetStream pull consumer until it
// has want messages, or fails the test at the deadline. Reading on for a
// moment after want would find extra messages only if there were
// duplicates, which the callers check by counting ids.
func consumeAll(tb testing.TB, js jetstream.JetStream, want int) []received {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cons, err := js.OrderedConsumer(ctx, testStream, jetstream.OrderedConsumerConfig{})
	if err != nil {
		tb.Fatalf("create consumer: %v", err)
	}
	var got []received
	for len(got) < want {
		if ctx.Err() != nil {
			tb.Fatalf("consumer got %d messages before the deadline, want %d", len(got), want)
		}
		batch, err := cons.Fetch(1000, jetstream.FetchMaxWait(500*time.Millisecond))
		if err != nil {
			tb.Fatalf("fetch: %v", err)
		}
		for m := range batch.Messages() {
			md, err := m.Metadata()
			if err != nil {
				tb.Fatalf("metadata: %v", err)
			}
			got = append(got, received{StreamSeq: md.Sequence.Stream, Stored: md.Timestamp, Subject: m.Subject(),
				Header: m.Headers(), Data: m.Data()})
		}
		if err := batch.Error(); err != nil {
			tb.Fatalf("fetch: %v", err)
		}
	}
	info, err := js.Stream(ctx, testStream)
	if err != nil {
		tb.Fatalf("stream info: %v", err)
	}
	if n := info.CachedInfo().State.Msgs; n != uint64(want) {
		tb.Fatalf("stream holds %d messages, want exactly %d", n, want)
	}
	return got
}

// unpublished is a testutil.Eventually condition: the outbox is empty.
func unpublished(tb testing.TB, st *store.Store) func() error {
	return func() error {
		n, _, err := st.UnpublishedCount(context.Background())
		if err != nil {
			tb.Fatalf("count unpublished: %v", err)
		}
		if n > 0 {
			return fmt.Errorf("%d events unpublished", n)
		}
		return nil
	}
}

// logBuffer is a concurrency-safe log sink for asserting on logs.
type logBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuffer) logger() *slog.Logger {
	return slog.New(slog.NewTextHandler(l, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// startRelay runs the relay until the test ends.
func startRelay(tb testing.TB, r *publish.Relay) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("relay: %v", err)
		}
	})
}
