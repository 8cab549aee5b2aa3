package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// benchScale reads BENCH_SCALE (the Makefile's bench-quick sets 0.1), so
// the same benchmark runs at full size or quickly.
func benchScale(b *testing.B) float64 {
	v := os.Getenv("BENCH_SCALE")
	if v == "" {
		return 1
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 {
		b.Fatalf("BENCH_SCALE=%q: want a positive number", v)
	}
	return f
}

// BenchmarkHistoryIngest measures ApplyHistory against SQLite's own rate on
// the same machine in the same run: a plain loop that inserts the same
// rows into the same schema, one transaction per page and the same rows per
// statement, without change detection, bookmarks or events. The ratio of
// the two is what the issue sets a floor for (>= 0.5).
//
// "baseline" is the first crawl of a mirror (no events); "moves" is a
// mirror past its baseline where every record is a move, so every row also
// writes a tag.moved event: the worst case.
func BenchmarkHistoryIngest(b *testing.B) {
	rows := int(1_000_000 * benchScale(b))
	tags := max(rows/historyPage, 1)
	rows = tags * historyPage
	for _, mode := range []string{"baseline", "moves"} {
		b.Run(mode, func(b *testing.B) {
			var ingest, plain time.Duration
			for range b.N {
				i, p := ingestAgainstPlain(b, tags, mode == "baseline")
				ingest += i
				plain += p
			}
			total := float64(rows * b.N)
			ingestRate, plainRate := total/ingest.Seconds(), total/plain.Seconds()
			b.ReportMetric(ingestRate, "rows/s")
			b.ReportMetric(plainRate, "plain-rows/s")
			b.ReportMetric(ingestRate/plainRate, "ratio")
		})
	}
}

// ingestAgainstPlain writes a page of history for each of tags tags twice:
// through the store, and with the plain loop into a second database. The
// two alternate page by page, so that whatever else the machine does at the
// time slows both alike. It returns the time each side took.
func ingestAgainstPlain(b *testing.B, tags int, baseline bool) (ingest, plain time.Duration) {
	ctx := context.Background()
	b.StopTimer()
	// Past the baseline, the tags are new ones, whose every move is news
	// (the history of a tag the baseline found is taken as given).
	st, _ := openTemp(b, newClock(), baseline, store.Options{})
	refs := ingestTags(b, st, tags)
	pl := openPlain(b, tags)
	pages := make([][]store.HistoryRecord, tags)
	for i := range pages {
		pages[i] = historyOf(i, historyPage)
	}
	b.StartTimer()
	events := 0
	for i, ref := range refs {
		start := time.Now()
		pl.insertPage(b, ref.UID, pages[i])
		mid := time.Now()
		n, err := st.ApplyHistory(ctx, ref, pages[i], true)
		if err != nil {
			b.Fatal(err)
		}
		ingest += time.Since(mid)
		plain += mid.Sub(start)
		events += n
	}
	b.StopTimer()
	if want := map[bool]int{true: 0, false: tags * (historyPage - 1)}[baseline]; events != want {
		b.Fatalf("ingest recorded %d events, want %d", events, want)
	}
	return ingest, plain
}

// plainDB is the yardstick: the store's schema and connection settings, and
// nothing but a loop of multi-row INSERTs, one transaction per page.
type plainDB struct {
	db   *sql.DB
	stmt *sql.Stmt // one full chunk; prepared once, as a careful loop would
	args []any
}

// plainChunk is the store's rows per statement.
const plainChunk = 200

func openPlain(b *testing.B, tags int) *plainDB {
	ctx := context.Background()
	path := filepath.Join(b.TempDir(), "plain.db")
	st, err := store.Open(ctx, path, store.Options{}) // the schema, then set aside
	if err != nil {
		b.Fatal(err)
	}
	if err := st.Close(); err != nil {
		b.Fatal(err)
	}
	db, err := sql.Open(
		"sqlite",
		"file:"+path+"?_pragma=busy_timeout(10000)&_pragma=journal_mode(WAL)&_pragma=foreign_keys(1)"+
			"&_pragma=synchronous(NORMAL)&_pragma=temp_store(MEMORY)&_txlock=immediate&_pragma=cache_size(-65536)",
	)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { db.Close() })
	db.SetMaxOpenConns(1)
	if _, err := db.ExecContext(
		ctx,
		`INSERT INTO repos (uid, name, first_seen_time) VALUES ('g1/r1', 'nginx', '')`,
	); err != nil {
		b.Fatal(err)
	}
	for i := range tags {
		if _, err := db.ExecContext(ctx, `INSERT INTO tags (uid, repo_uid, name, first_seen_time) VALUES (?, 'g1/r1', ?, '')`,
			fmt.Sprintf("g1/r1/t%06d", i), fmt.Sprintf("v%d", i)); err != nil {
			b.Fatal(err)
		}
	}
	stmt, err := db.PrepareContext(ctx, `INSERT INTO tag_history (tag_uid, seq, update_time, digest) VALUES `+
		strings.TrimSuffix(strings.Repeat("(?,?,?,?),", plainChunk), ","))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { stmt.Close() })
	return &plainDB{db: db, stmt: stmt, args: make([]any, 0, 4*plainChunk)}
}

// insertPage inserts one page (a multiple of plainChunk records) of a tag.
func (p *plainDB) insertPage(b *testing.B, uid string, page []store.HistoryRecord) {
	ctx := context.Background()
	tx, err := p.db.BeginTx(ctx, nil)
	if err != nil {
		b.Fatal(err)
	}
	stmt := tx.StmtContext(ctx, p.stmt)
	for s := 0; s < len(page); s += plainChunk {
		p.args = p.args[:0]
		for j, r := range page[s : s+plainChunk] {
			p.args = append(p.args, uid, s+j, store.FormatTime(r.Time), r.Digest)
		}
		if _, err := stmt.ExecContext(ctx, p.args...); err != nil {
			b.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkOutboxRead measures what the relay costs the store per event:
// reading an outbox of 20,000 tag.moved events as the relay does (one
// ReadUnpublished, batches of 256), and marking them published in
// transactions of 2,000 as the relay does.
func BenchmarkOutboxRead(b *testing.B) {
	ctx := context.Background()
	fill := func(b *testing.B) (*store.Store, []int64) {
		st, _ := openTemp(b, newClock(), false, store.Options{})
		for i, ref := range ingestTags(b, st, 20) {
			if _, err := st.ApplyHistory(ctx, ref, historyOf(i, 1000), true); err != nil {
				b.Fatal(err)
			}
		}
		var seqs []int64
		err := st.ReadUnpublished(ctx, 0, 256, func(evs []store.Event) error {
			for _, e := range evs {
				seqs = append(seqs, e.Seq)
			}
			return nil
		})
		if err != nil {
			b.Fatal(err)
		}
		return st, seqs
	}
	// Read reads the outbox again and again; AfterCommit has the writer
	// commit before each read, as the relay's marking does between its
	// passes, so that each read transaction begins on a changed database.
	for _, tc := range []struct {
		name   string
		commit bool
	}{{"Read", false}, {"ReadAfterCommit", true}} {
		b.Run(tc.name, func(b *testing.B) {
			st, seqs := fill(b)
			n := 0
			for i := 0; b.Loop(); i++ {
				if tc.commit {
					if err := st.SetMeta(ctx, "bench", strconv.Itoa(i)); err != nil {
						b.Fatal(err)
					}
				}
				err := st.ReadUnpublished(ctx, 0, 256, func(evs []store.Event) error {
					n += len(evs)
					return nil
				})
				if err != nil {
					b.Fatal(err)
				}
			}
			if n != b.N*len(seqs) {
				b.Fatalf("read %d events, want %d", n, b.N*len(seqs))
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/event")
		})
	}
	b.Run("Mark", func(b *testing.B) {
		n := 0
		for range b.N {
			b.StopTimer()
			st, seqs := fill(b)
			b.StartTimer()
			for i := 0; i < len(seqs); i += 2000 {
				if err := st.MarkPublished(ctx, seqs[i:min(i+2000, len(seqs))]); err != nil {
					b.Fatal(err)
				}
			}
			n += len(seqs)
			b.StopTimer()
			if left, _, err := st.UnpublishedCount(ctx); err != nil || left != 0 {
				b.Fatalf("after marking: %d unpublished (%v)", left, err)
			}
			b.StartTimer()
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(n), "ns/event")
	})
}
