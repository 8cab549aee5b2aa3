package store

import (
	"context"
	"database/sql"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

//go:embed migrations/*.sql
var migrationFS embed.FS

// TimeFormat is how every timestamp is stored: ISO 8601 UTC with milliseconds.
const TimeFormat = "2006-01-02T15:04:05.000Z"

// FormatTime renders t as stored in the mirror; the zero time is "".
func FormatTime(t time.Time) string {
	if t.IsZero() {
		return ""
	}
	return t.UTC().Format(TimeFormat)
}

// ParseTime reads a stored timestamp; "" is the zero time.
func ParseTime(s string) (time.Time, error) {
	if s == "" {
		return time.Time{}, nil
	}
	return time.Parse(time.RFC3339Nano, s)
}

// Options configure Open.
type Options struct {
	// InitialEvents is "none" (the first crawl of an empty mirror is a silent
	// baseline) or "snapshot" (it emits one created event per resource).
	InitialEvents string
	// Now is the clock for first_seen, deleted and recorded times; default
	// time.Now.
	Now func() time.Time
	// Logger receives migration notices; default discards.
	Logger *slog.Logger
	// Readers is the size of the read-only pool; default 4.
	Readers int
	// CacheKiB is the writer's page cache in KiB; default DefaultCacheKiB.
	CacheKiB int
	// BeforeCommit, when set, runs inside every mirror write transaction
	// (a page of repos, tags, history or advisories, a deletion) after all
	// of its rows and events are written and before COMMIT; an error rolls
	// the transaction back. It exists for fault injection: crash tests stop
	// the process here to prove a page lands whole or not at all.
	BeforeCommit func(ctx context.Context) error
	// OnEvents, when set, is told after each commit that recorded events
	// how many of each type it recorded (for metrics).
	OnEvents func(byType map[string]int)
}

// DefaultCacheKiB is the writer's page cache unless Options say otherwise:
// 16 MiB, four times SQLite's default. History writes land at scattered
// places in the indexes by time and digest, and with SQLite's 2 MiB those
// index pages were reread from the file and uncommitted ones spilled into the
// WAL before COMMIT. It was 64 MiB while the baseline kept those indexes up;
// since it defers them (DeferIndexes), 16 MiB syncs as fast, and the page
// cache costs twice its size in memory: SQLite allocates each 4 KiB page with
// its header, which the allocator rounds up to 8 KiB.
const DefaultCacheKiB = 16 << 10

// Store is the SQLite mirror.
type Store struct {
	w, r *sql.DB
	// bg reads for syncd's own bookkeeping through the whole mirror (the
	// backfill's next tags, what it has left), one connection that does
	// not map the file: read through r's mapped pages, every tag's row
	// the backfill looked up stayed in the process's resident memory, the
	// size of the tags table (the 4x organization's peak RSS doubled).
	bg       *sql.DB
	now      func() time.Time
	log      *slog.Logger
	snapshot bool
	readOnly bool // OpenReadOnly: w is the reader pool
	cacheKiB int  // the writer's page cache
	notify   chan struct{}
	// history receives a value after a write of history (HistoryWritten).
	history chan struct{}
	// baselineOver is closed once EndBaseline has ended the baseline
	// (WaitBaselineOver).
	baselineOver    chan struct{}
	endBaselineOnce sync.Once
	// beforeCommit is Options.BeforeCommit.
	beforeCommit func(ctx context.Context) error
	onEvents     func(map[string]int)
	// writeErr is the last write transaction's refusal by the file, nil
	// once one succeeds (see Writable).
	writeErr atomic.Pointer[error]
	// catchUpDeferred: a follower's catch-up goes without the history
	// indexes (DeferIndexesForCatchUp) until BuildIndexes.
	catchUpDeferred atomic.Bool

	bulk  [numBulk]*sql.Stmt // full-size multi-row statements, prepared at Open
	stmts stmtCache          // the writer's statements of varying text, prepared when first free
}

// Open opens (creating it 0600 if needed) the database at path and applies
// pending migrations.
func Open(ctx context.Context, path string, opts Options) (*Store, error) {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Readers <= 0 {
		opts.Readers = 4
	}
	if opts.CacheKiB <= 0 {
		opts.CacheKiB = DefaultCacheKiB
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("create data directory: %w", err)
	}
	// Create the file ourselves so it is 0600 whatever the umask; SQLite
	// gives its -wal and -shm files the same mode as the database file.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("open database file: %w", err)
	}
	f.Close()

	w, err := sql.Open("sqlite", dsn(path, false, opts.CacheKiB))
	if err != nil {
		return nil, fmt.Errorf("open writer on %s: %w", path, err)
	}
	w.SetMaxOpenConns(1)
	w.SetConnMaxIdleTime(0)
	s := &Store{w: w, cacheKiB: opts.CacheKiB, now: opts.Now, log: opts.Logger, snapshot: opts.InitialEvents == "snapshot",
		notify: make(
			chan struct{},
			1,
		), history: make(chan struct{}, 1), baselineOver: make(chan struct{}),
		beforeCommit: opts.BeforeCommit, onEvents: opts.OnEvents}
	if err := s.migrate(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("migrate %s: %w", path, explain(path, err))
	}
	if err := s.repairIndexes(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", path, explain(path, err))
	}
	if err := s.ensureDigest(ctx); err != nil {
		w.Close()
		return nil, fmt.Errorf("open %s: %w", path, explain(path, err))
	}

	r, err := sql.Open("sqlite", dsn(path, true, 0))
	if err != nil {
		w.Close()
		return nil, fmt.Errorf("open readers on %s: %w", path, err)
	}
	r.SetMaxOpenConns(opts.Readers)
	// Every reader stays open once opened: database/sql keeps two idle by
	// default, and a reader closed and opened again prepares its statements
	// anew (a fifth of the query service's CPU, measured with
	// BENCH_QUERYPROFILE; reads doubled with all four kept).
	r.SetMaxIdleConns(opts.Readers)
	s.r = r
	bg, err := sql.Open("sqlite", readerDSN(path, 0))
	if err != nil {
		s.Close()
		return nil, fmt.Errorf("open the background reader on %s: %w", path, err)
	}
	bg.SetMaxOpenConns(1)
	bg.SetMaxIdleConns(1)
	s.bg = bg
	if err := s.prepareBulk(ctx); err != nil {
		s.Close()
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	return s, nil
}

// OpenReadOnly opens the existing mirror at path for reading only, as a
// process beside the one that writes it ("syncd status") does: it creates
// nothing and migrates nothing, so it never contends with the writer for
// the locks a migration or a change of journal mode takes, and it refuses a
// mirror whose schema is still being created or is newer than this binary.
func OpenReadOnly(ctx context.Context, path string) (*Store, error) {
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("open mirror: %w", err)
	}
	r, err := sql.Open("sqlite", dsn(path, true, 0))
	if err != nil {
		return nil, fmt.Errorf("open reader on %s: %w", path, err)
	}
	r.SetMaxOpenConns(1)
	s := &Store{w: r, r: r, now: time.Now, log: slog.New(slog.DiscardHandler), readOnly: true}
	ms, err := migrations()
	if err != nil {
		r.Close()
		return nil, err
	}
	cur, err := s.SchemaVersion(ctx)
	switch latest := ms[len(ms)-1].version; {
	case err != nil && strings.Contains(err.Error(), "no such table"), err == nil && cur == 0:
		r.Close()
		return nil, fmt.Errorf("mirror %s has no schema yet: syncd is creating it, try again in a moment", path)
	case err != nil:
		r.Close()
		return nil, fmt.Errorf("read mirror %s: %w", path, explain(path, err))
	case cur > latest:
		r.Close()
		return nil, fmt.Errorf(
			"mirror %s has schema version %d, newer than this syncd knows (%d): upgrade syncd",
			path,
			cur,
			latest,
		)
	}
	return s, nil
}

// readerMmapBytes is how much of the database file a reader maps.
const readerMmapBytes = 2 << 30

// dsn is the connection string of the writer (with its page cache size in
// KiB) or of a reader.
func dsn(path string, readOnly bool, cacheKiB int) string {
	if readOnly {
		return readerDSN(path, readerMmapBytes)
	}
	return connDSN(path, false, cacheKiB, 0)
}

// readerDSN is the connection string of a reader that maps up to mmap bytes
// of the file.
func readerDSN(path string, mmap int64) string { return connDSN(path, true, 0, mmap) }

func connDSN(path string, readOnly bool, cacheKiB int, mmap int64) string {
	q := url.Values{}
	q.Add("_pragma", "busy_timeout(10000)")
	q.Add("_pragma", "journal_mode(WAL)")
	q.Add("_pragma", "foreign_keys(1)")
	q.Add("_pragma", "synchronous(NORMAL)")
	// Statement journals (which a multi-row INSERT inside a transaction
	// keeps, to undo itself alone on a constraint error) in memory: in a
	// temporary file, writing them was a fifth of ingest's CPU, in pwrite.
	q.Add("_pragma", "temp_store(MEMORY)")
	if readOnly {
		q.Add("_pragma", "query_only(1)")
		// Readers map the file rather than read it into their page caches.
		// A read transaction that begins after a commit throws its page
		// cache away, and freeing those pages cost the relay a fifth of its
		// CPU (the allocator hands them back to the OS); mapped pages have
		// nothing to free. SQLite caps the size at its compile-time limit,
		// just under 2 GiB; the pages of a larger file are read as usual.
		q.Add("_pragma", fmt.Sprintf("mmap_size(%d)", mmap))
	} else {
		q.Set("_txlock", "immediate")
		q.Add("_pragma", fmt.Sprintf("cache_size(-%d)", cacheKiB))
	}
	return "file:" + path + "?" + q.Encode()
}

// Close closes the pools.
func (s *Store) Close() error {
	var errs []error
	for _, stmt := range append(s.bulk[:], s.stmts.all()...) {
		if stmt != nil {
			errs = append(errs, stmt.Close())
		}
	}
	if s.readOnly {
		return s.r.Close()
	}
	if s.bg != nil {
		errs = append(errs, s.bg.Close())
	}
	return errors.Join(append(errs, s.r.Close(), s.w.Close())...)
}

// Reader returns the read-only pool, for queries that must not wait on ingest.
func (s *Store) Reader() *sql.DB { return s.r }

// Notify returns a channel that receives a value after a commit that added
// events; it holds at most one pending signal.
func (s *Store) Notify() <-chan struct{} { return s.notify }

func (s *Store) signal() {
	select {
	case s.notify <- struct{}{}:
	default:
	}
}

// HistoryWritten returns a channel that receives a value after a commit
// that may have added history records, and when the baseline ends: what
// can bring a tag's next maturation nearer (Mature). It holds at most one
// pending signal.
func (s *Store) HistoryWritten() <-chan struct{} { return s.history }

func (s *Store) signalHistory() {
	select {
	case s.history <- struct{}{}:
	default:
	}
}

// SchemaVersion returns the newest migration applied.
func (s *Store) SchemaVersion(ctx context.Context) (int, error) {
	var v int
	err := s.w.QueryRowContext(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v)
	return v, err
}

type migration struct {
	version int
	name    string
	sql     string
}

func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFS, "migrations")
	if err != nil {
		return nil, err
	}
	var ms []migration
	for _, e := range entries {
		num, _, ok := strings.Cut(e.Name(), "_")
		v, err := strconv.Atoi(num)
		if !ok || err != nil {
			return nil, fmt.Errorf("migration %s: name must start with a number", e.Name())
		}
		b, err := migrationFS.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		ms = append(ms, migration{v, e.Name(), string(b)})
	}
	sort.Slice(ms, func(i, j int) bool { return ms[i].version < ms[j].version })
	return ms, nil
}

// createMigrationsSQL creates the table of the migrations applied.
const createMigrationsSQL = `CREATE TABLE IF NOT EXISTS schema_migrations (
		version INTEGER PRIMARY KEY, name TEXT NOT NULL, applied_time TEXT NOT NULL)`

// migrate applies every embedded migration newer than the database, each in
// its own transaction, and refuses a database newer than this binary.
func (s *Store) migrate(ctx context.Context) error {
	if _, err := s.w.ExecContext(ctx, createMigrationsSQL); err != nil {
		return err
	}
	ms, err := migrations()
	if err != nil {
		return err
	}
	cur, err := s.SchemaVersion(ctx)
	if err != nil {
		return err
	}
	if latest := ms[len(ms)-1].version; cur > latest {
		return fmt.Errorf("database schema version %d is newer than this syncd knows (%d): upgrade syncd", cur, latest)
	}
	for _, m := range ms {
		if m.version <= cur {
			continue
		}
		err := s.tx(ctx, func(tx *sql.Tx) error {
			if _, err := tx.ExecContext(ctx, m.sql); err != nil {
				return fmt.Errorf("%s: %w", m.name, err)
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO schema_migrations (version, name, applied_time) VALUES (?, ?, ?)`,
				m.version, m.name, FormatTime(s.now()))
			return err
		})
		if err != nil {
			return err
		}
		s.log.Info("applied migration", "version", m.version, "name", m.name)
	}
	return nil
}

// tx runs fn in a write transaction.
func (s *Store) tx(ctx context.Context, fn func(*sql.Tx) error) error {
	tx, err := s.w.BeginTx(ctx, nil)
	err = runTx(tx, err, fn)
	s.noteWrite(err)
	s.stmts.ended(tx)
	s.stmts.prepareWanted(ctx, s.w, s.log)
	return err
}

// runTx runs fn in tx, which began with err, and commits it, or rolls it
// back if fn fails.
func runTx(tx *sql.Tx, err error, fn func(*sql.Tx) error) error {
	if err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		tx.Rollback()
		return err
	}
	return tx.Commit()
}

// queryer is a pool, a connection or a transaction.
type queryer interface {
	QueryRowContext(context.Context, string, ...any) *sql.Row
}

// meta reads a value from the meta table; "" when absent.
func (s *Store) meta(ctx context.Context, q queryer, key string) (string, error) {
	var v string
	err := q.QueryRowContext(ctx, `SELECT value FROM meta WHERE key = ?`, key).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return "", nil
	}
	return v, err
}

// Meta returns the value of key in the meta table, "" when unset.
func (s *Store) Meta(ctx context.Context, key string) (string, error) {
	return s.meta(ctx, s.w, key)
}

// SetMeta sets key in the meta table.
func (s *Store) SetMeta(ctx context.Context, key, value string) error {
	return setMeta(ctx, s.w, "main", key, value)
}

// execer runs a statement: a pool, a connection or a transaction.
type execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
}

// setMeta sets meta key to value in schema (main, or an attached
// database's name) through e.
func setMeta(ctx context.Context, e execer, schema, key, value string) error {
	_, err := e.ExecContext(
		ctx,
		`INSERT INTO `+schema+`.meta (key, value) VALUES (?, ?) ON CONFLICT(key) DO UPDATE SET value = excluded.value`,
		key,
		value,
	)
	return err
}
