package bench

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"fmt"
	"net/url"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/store"
)

// ceilingRowsPerStatement and ceilingRowsPerTx shape the plain insert loop
// that syncd's ingest is compared with: 200-row statements (the best size
// measured on the build machines) in large transactions, so the loop is as
// fast as SQLite goes on this schema.
const (
	ceilingRowsPerStatement = 200
	ceilingRowsPerTx        = 10000
)

// sqliteCeiling inserts rows tag_history rows, spread evenly over tags
// tags (one tag's records together, as syncd writes them), into a fresh
// store's schema with the store's own pragmas, rowsPerTx rows per
// transaction, and returns rows per second. Only the transactions are
// timed, not making up the rows. The history's indexes by time and digest
// are kept up row by row: the loop as the schema stands.
func sqliteCeiling(ctx context.Context, dir string, rows, tags, rowsPerTx int) (float64, error) {
	return ceilingLoop(ctx, dir, rows, tags, rowsPerTx, false)
}

// sqliteCeilingDeferred is sqliteCeiling with the history's indexes by time
// and digest dropped before the inserts and built after them, timed too:
// what a crawl's baseline and a follower catching up from nothing do.
func sqliteCeilingDeferred(ctx context.Context, dir string, rows, tags, rowsPerTx int) (float64, error) {
	return ceilingLoop(ctx, dir, rows, tags, rowsPerTx, true)
}

// historyIndexes are the history's indexes by time and digest, as the
// migrations create them.
var historyIndexes = []string{
	`CREATE INDEX tag_history_time ON tag_history(update_time)`,
	`CREATE INDEX tag_history_digest ON tag_history(digest)`,
}

func ceilingLoop(ctx context.Context, dir string, rows, tags, rowsPerTx int, deferIndexes bool) (float64, error) {
	path := filepath.Join(dir, fmt.Sprintf("ceiling-%d-%t.db", rowsPerTx, deferIndexes))
	st, err := store.Open(ctx, path, store.Options{})
	if err != nil {
		return 0, err
	}
	if err := st.Close(); err != nil {
		return 0, err
	}
	q := url.Values{}
	// The writer's pragmas in store.Open, page cache size included.
	for _, p := range []string{"busy_timeout(10000)", "journal_mode(WAL)", "foreign_keys(1)", "synchronous(NORMAL)",
		"temp_store(MEMORY)", "cache_size(-65536)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	db, err := sql.Open("sqlite", "file:"+path+"?"+q.Encode())
	if err != nil {
		return 0, err
	}
	defer db.Close()
	db.SetMaxOpenConns(1)

	// The foreign key of tag_history needs the tags to exist.
	uids := make([]string, tags)
	for i := range uids {
		uids[i] = fmt.Sprintf("org1/%016x/%016x", hash64("repo", i/50), hash64("tag", i))
	}
	if err := inTx(ctx, db, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO repos (uid, name, first_seen_time) VALUES ('org1/r', 'r', '2026-01-01T00:00:00.000Z')`); err != nil {
			return err
		}
		for i, uid := range uids {
			if _, err := tx.ExecContext(ctx,
				`INSERT INTO tags (uid, repo_uid, name, first_seen_time) VALUES (?, 'org1/r', ?, '2026-01-01T00:00:00.000Z')`,
				uid, strconv.Itoa(i)); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return 0, fmt.Errorf("ceiling: insert tags: %w", err)
	}

	if deferIndexes {
		if _, err := db.ExecContext(ctx, `DROP INDEX tag_history_time; DROP INDEX tag_history_digest`); err != nil {
			return 0, fmt.Errorf("ceiling: drop the history indexes: %w", err)
		}
	}
	perTag := (rows + tags - 1) / tags
	base := time.Date(2024, 1, 1, 0, 0, 0, 0, time.UTC)
	stmt := "INSERT INTO tag_history (tag_uid, seq, update_time, digest) VALUES " +
		strings.TrimSuffix(strings.Repeat("(?,?,?,?),", ceilingRowsPerStatement), ",")
	var timed time.Duration
	args := make([]any, 0, 4*rowsPerTx)
	for done := 0; done < rows; {
		n := min(rowsPerTx, rows-done)
		args = args[:0]
		for i := done; i < done+n; i++ {
			seq := i % perTag
			args = append(args, uids[i/perTag], seq, base.Add(time.Duration(i)*time.Minute).Format(store.TimeFormat),
				"sha256:"+hex.EncodeToString(digest(i)))
		}
		start := time.Now()
		err := inTx(ctx, db, func(tx *sql.Tx) error {
			for off := 0; off < n; off += ceilingRowsPerStatement {
				k := min(ceilingRowsPerStatement, n-off)
				s := stmt
				if k != ceilingRowsPerStatement {
					s = "INSERT INTO tag_history (tag_uid, seq, update_time, digest) VALUES " + strings.TrimSuffix(
						strings.Repeat("(?,?,?,?),", k),
						",",
					)
				}
				if _, err := tx.ExecContext(ctx, s, args[4*off:4*(off+k)]...); err != nil {
					return err
				}
			}
			return nil
		})
		timed += time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("ceiling: insert history: %w", err)
		}
		done += n
	}
	if deferIndexes {
		// Sorting on both cores, as the store's builds do.
		if _, err := db.ExecContext(ctx, `PRAGMA threads = 2`); err != nil {
			return 0, err
		}
		start := time.Now()
		err := inTx(ctx, db, func(tx *sql.Tx) error {
			for _, q := range historyIndexes {
				if _, err := tx.ExecContext(ctx, q); err != nil {
					return err
				}
			}
			return nil
		})
		timed += time.Since(start)
		if err != nil {
			return 0, fmt.Errorf("ceiling: build the history indexes: %w", err)
		}
	}
	return float64(rows) / timed.Seconds(), nil
}

func inTx(ctx context.Context, db *sql.DB, fn func(*sql.Tx) error) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

func hash64(kind string, i int) uint64 {
	h := sha256.Sum256([]byte(kind + strconv.Itoa(i)))
	var v uint64
	for _, b := range h[:8] {
		v = v<<8 | uint64(b)
	}
	return v
}

func digest(i int) []byte {
	h := sha256.Sum256([]byte(strconv.Itoa(i)))
	return h[:]
}

// jetstreamCeiling publishes msgs to a stream of its own (capturing the
// first subject token of the messages) on the same server as the relay, with a plain async loop holding up to window
// publishes in flight (the relay's default), and returns messages per
// second. The messages are the relay's own, headers and all, on another
// subject prefix.
func jetstreamCeiling(
	ctx context.Context,
	js jetstream.JetStream,
	stream string,
	msgs []*nats.Msg,
	window int,
) (float64, error) {
	subject, _, _ := strings.Cut(msgs[0].Subject, ".")
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject + ".>"},
		Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute}); err != nil {
		return 0, fmt.Errorf("ceiling stream: %w", err)
	}
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	start := time.Now()
	for i, m := range msgs {
		if i >= window {
			if err := waitAck(ctx, futs[i-window]); err != nil {
				return 0, err
			}
		}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			return 0, fmt.Errorf("ceiling publish: %w", err)
		}
		futs = append(futs, f)
	}
	for _, f := range futs[max(0, len(futs)-window):] {
		if err := waitAck(ctx, f); err != nil {
			return 0, err
		}
	}
	return float64(len(msgs)) / time.Since(start).Seconds(), nil
}

func waitAck(ctx context.Context, f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return fmt.Errorf("ceiling publish: %w", err)
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settle readies the machine for a timed run: the pages earlier runs
// wrote are synced to disk and the heap is collected, so that the run
// neither waits for the kernel's writeback of another's files nor
// collects another's garbage (a restore timed right after its reference
// took 1.8 s where the same download alone took 1.4 s).
func settle() {
	syscall.Sync()
	runtime.GC()
}
