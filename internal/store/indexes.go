package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"runtime"
	"time"
)

// deferredIndexes are the indexes a baseline crawl goes without, with the
// statements that build them: they index tag_history by time and by digest,
// values that arrive in no order, so that each history row inserted lands
// on a page of its own in each of them. Kept up row by row they were most
// of an initial sync's cost (a write transaction of a thousand rows dirtied
// two thousand index pages); built once when the baseline ends, from a
// sort, they take a few seconds for a million rows. The statements must
// match the migrations that created the indexes (TestDeferredIndexes).
var deferredIndexes = []struct{ name, create string }{
	{"tag_history_time", `CREATE INDEX tag_history_time ON tag_history(update_time)`},
	{"tag_history_digest", `CREATE INDEX tag_history_digest ON tag_history(digest)`},
}

// DeferIndexes drops the indexes that wait for the end of the backfill, if
// the mirror is in its baseline; EndBackfill builds them (EndBaseline when
// nothing is left to backfill). A baseline crawl calls it before it starts.
// Until the backfill ends, queries of tag_history by time or digest scan
// the table.
func (s *Store) DeferIndexes(ctx context.Context) error {
	return s.tx(ctx, func(tx *sql.Tx) error {
		baseline, err := s.inBaseline(ctx, tx)
		if err != nil || !baseline {
			return err
		}
		dropped, err := dropDeferred(ctx, tx)
		if err != nil {
			return err
		}
		if len(dropped) > 0 {
			s.log.Info("baseline: history indexes are built when it ends", "indexes", dropped)
		}
		return nil
	})
}

// dropDeferred drops whichever deferred indexes the mirror has, and
// returns their names.
func dropDeferred(ctx context.Context, tx *sql.Tx) ([]string, error) {
	var dropped []string
	for _, ix := range deferredIndexes {
		ok, err := hasIndex(ctx, tx, ix.name)
		if err != nil {
			return nil, err
		}
		if !ok {
			continue
		}
		if _, err := tx.ExecContext(ctx, `DROP INDEX `+ix.name); err != nil {
			return nil, fmt.Errorf("defer index %s: %w", ix.name, err)
		}
		dropped = append(dropped, ix.name)
	}
	return dropped, nil
}

// DeferIndexesForCatchUp drops the indexes DeferIndexes drops, if the
// mirror is empty (no repo, advisory or event): a follower catching up from
// the stream's start writes every history row of the leader's baseline,
// and kept up row by row those indexes were more than half of its time
// (docs/performance.md), as they were most of a crawl's. It reports
// whether the mirror goes without them now; BuildIndexes builds them again
// once the follower has caught up, and until then the baseline's end that
// the first applied batch records leaves them out. A mirror opened again without them builds them at Open (see
// repairIndexes), so a follower stopped during its catch-up never leaves a
// mirror without them for good.
func (s *Store) DeferIndexesForCatchUp(ctx context.Context) (bool, error) {
	deferred, dropped := false, []string(nil)
	err := s.tx(ctx, func(tx *sql.Tx) error {
		deferred = false
		empty, err := isEmpty(ctx, tx)
		if err != nil || !empty {
			return err
		}
		dropped, err = dropDeferred(ctx, tx)
		deferred = err == nil
		return err
	})
	if err != nil {
		return false, fmt.Errorf("defer the history indexes: %w", err)
	}
	if deferred {
		s.catchUpDeferred.Store(true)
		s.log.Info("catching up from the stream's start: history indexes are built once caught up",
			"indexes", dropped)
	}
	return deferred, nil
}

// BuildIndexes builds whichever deferred indexes are missing (those
// DeferIndexes or DeferIndexesForCatchUp dropped), from a sort.
func (s *Store) BuildIndexes(ctx context.Context) error {
	if err := s.sortingTx(ctx, func(tx *sql.Tx) error { return s.buildIndexes(ctx, tx) }); err != nil {
		return fmt.Errorf("build the history indexes: %w", err)
	}
	s.catchUpDeferred.Store(false)
	return nil
}

// endBaseline records that the baseline is over, if it was not already, and
// builds the deferred indexes in the same transaction, unless build is
// false: a mirror past its baseline has them, but for the leader's while
// its backfill writes the histories (see EndBackfill).
//
// The repos whose crawl failed (a repo failure in crawl_failures) keep
// their baseline pending: their tags were not all listed, and those listed
// once the repo recovers are the starting point, not news. ClearFailure
// ends it.
func (s *Store) endBaseline(ctx context.Context, tx *sql.Tx, now string, build bool) error {
	res, err := tx.ExecContext(
		ctx,
		`INSERT INTO meta (key, value) VALUES ('baseline_time', ?) ON CONFLICT(key) DO NOTHING`,
		now,
	)
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		return err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE repos SET baseline_pending = 1
		WHERE uid IN (SELECT repo_uid FROM crawl_failures WHERE kind = 'repo')`); err != nil {
		return fmt.Errorf("mark repos whose baseline is pending: %w", err)
	}
	if !build {
		return nil
	}
	return s.buildIndexes(ctx, tx)
}

// EndBackfill builds the indexes the baseline deferred, once the backfill
// has read every tag's history: built from a sort after the last history
// row, rather than kept up row by row while the backfill wrote them.
func (s *Store) EndBackfill(ctx context.Context) error {
	if ready, err := s.HistoryReady(ctx); err != nil || !ready {
		return err
	}
	if err := s.BuildIndexes(ctx); err != nil {
		return fmt.Errorf("end backfill: %w", err)
	}
	return nil
}

// buildIndexes builds whichever deferred indexes are missing.
func (s *Store) buildIndexes(ctx context.Context, tx *sql.Tx) error {
	for _, ix := range deferredIndexes {
		ok, err := hasIndex(ctx, tx, ix.name)
		if err != nil {
			return err
		}
		if ok {
			continue
		}
		start := time.Now()
		if _, err := tx.ExecContext(ctx, ix.create); err != nil {
			return fmt.Errorf("build index %s: %w", ix.name, err)
		}
		s.log.Info("built index", "index", ix.name, "took", time.Since(start).Round(time.Millisecond).String())
	}
	return nil
}

// hasIndex reports whether the database has the index name.
func hasIndex(ctx context.Context, q queryer, name string) (bool, error) {
	var n int
	err := q.QueryRowContext(ctx, `SELECT COUNT(*) FROM sqlite_schema WHERE type = 'index' AND name = ?`, name).Scan(&n)
	return n > 0, err
}

// repairIndexes builds the deferred indexes of a mirror past its baseline
// and backfill that lacks any: none should, since their end builds them in
// its own transaction, but a mirror must never be left without them.
func (s *Store) repairIndexes(ctx context.Context) error {
	ready, err := s.historyReady(ctx, s.w)
	if err != nil || !ready {
		return err
	}
	for _, ix := range deferredIndexes {
		ok, err := hasIndex(ctx, s.w, ix.name)
		if err != nil {
			return err
		}
		if !ok {
			return s.BuildIndexes(ctx)
		}
	}
	return nil
}

// sortingTx runs fn in a write transaction on a writer connection set up
// for building indexes: the sort spills to temporary files once it holds
// sortCacheKiB, instead of keeping all of it in memory as temp_store=MEMORY
// would, and a page cache larger than that shrinks to it, so that the memory
// it gives back holds the sort. The writer's settings are restored after.
func (s *Store) sortingTx(ctx context.Context, fn func(*sql.Tx) error) error {
	return s.sortingConn(ctx, func(conn *sql.Conn) error {
		tx, err := conn.BeginTx(ctx, nil)
		return runTx(tx, err, fn)
	})
}

// sortingConn runs fn on the writer's connection with sortingTx's settings.
func (s *Store) sortingConn(ctx context.Context, fn func(*sql.Conn) error) (err error) {
	conn, err := s.w.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	set := func(ctx context.Context, temp string, cacheKiB, threads int) error {
		_, err := conn.ExecContext(
			ctx,
			fmt.Sprintf(`PRAGMA temp_store = %s; PRAGMA cache_size = -%d; PRAGMA threads = %d`, temp, cacheKiB, threads),
		)
		return err
	}
	if err := set(ctx, "FILE", min(sortCacheKiB, s.cacheKiB), sortThreads()); err != nil {
		return err
	}
	defer func() {
		// Even when ctx ended: fn may have committed (a restore).
		if rerr := set(context.WithoutCancel(ctx), "MEMORY", s.cacheKiB, 0); rerr != nil && err == nil {
			// The connection cannot be trusted with the wrong settings.
			err = errors.Join(rerr, conn.Raw(func(any) error { return driver.ErrBadConn }))
		}
	}()
	return fn(conn)
}

// sortCacheKiB is the memory an index build sorts in before it spills.
// SQLite's sort takes about six times it (the page cache, whose pages the
// allocator rounds up to twice their size; the sort's buffer, rounded up
// too, and its copy while it grows): building both indexes over a million
// rows took 103 MB of SQLite's allocations with 16 MiB, which at the end
// of a baseline came on top of everything else and made the crawl's peak,
// and 29 MB with 4 MiB, in no more time (2.9 s against 3.6 s; 4 million
// rows: the same 103 MB against 18 MB with 2 MiB).
const sortCacheKiB = 4 << 10

// sortThreads is how many helper threads SQLite's sort may use for an index
// build, beside the writer's own: one per processor Go runs on, up to two.
// Building both history indexes over a million rows took 1.7 s with two
// against 2.25 s with none, on two cores.
func sortThreads() int { return min(runtime.GOMAXPROCS(0), 2) }
