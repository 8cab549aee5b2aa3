package store

import (
	"context"
	"database/sql"
	"log/slog"
	"sync"
)

// maxCachedStmts bounds the statements a store keeps prepared. The texts
// it is given are few: a VALUES list of a power of two rows for each bulk
// write, and a lookup or deletion by a JSON list of uids for each caller.
const maxCachedStmts = 256

// stmtCache keeps the writer's statements whose text the code builds
// (bulkSQL of n rows, execByUIDs) prepared across transactions: preparing
// one, with its triggers coded in, costs more than running it. The writer
// has one connection, which a transaction holds, so a statement cannot be
// prepared while one runs: a transaction that finds a text missing runs it
// unprepared and asks for it, and the store prepares what was asked for
// once the transaction has ended (prepareWanted).
//
// Until then the transaction keeps what it prepared itself (inTx): a
// follower's batch writes a few rows of each kind at a time.
//
// A text is asked for when a second transaction runs it: a store that
// writes a few times and closes, as tools and tests do, would otherwise
// parse each text twice.
type stmtCache struct {
	mu     sync.Mutex
	stmts  map[string]*sql.Stmt
	seen   map[string]bool
	wanted map[string]bool
	inTx   map[*sql.Tx]map[string]*sql.Stmt
}

// stmt returns query prepared for tx, the writer's transaction; shared
// says whether to keep it prepared for later transactions too.
func (c *stmtCache) stmt(ctx context.Context, tx *sql.Tx, query string, shared bool) (*sql.Stmt, error) {
	c.mu.Lock()
	st, ok := c.inTx[tx][query]
	c.mu.Unlock()
	if ok {
		return st, nil
	}
	var kept *sql.Stmt
	if shared {
		kept = c.get(query)
	}
	if kept != nil {
		st = tx.StmtContext(ctx, kept)
	} else {
		var err error
		if st, err = tx.PrepareContext(ctx, query); err != nil {
			return nil, err
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.inTx == nil {
		c.inTx = map[*sql.Tx]map[string]*sql.Stmt{}
	}
	if c.inTx[tx] == nil {
		c.inTx[tx] = map[string]*sql.Stmt{}
	}
	c.inTx[tx][query] = st
	return st, nil
}

// ended forgets what tx prepared (database/sql closed it with tx).
func (c *stmtCache) ended(tx *sql.Tx) {
	c.mu.Lock()
	delete(c.inTx, tx)
	c.mu.Unlock()
}

// get returns query's prepared statement, or nil after asking for it.
func (c *stmtCache) get(query string) *sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.stmts[query]; ok {
		return st
	}
	switch {
	case len(c.stmts)+len(c.wanted) >= maxCachedStmts:
	case c.seen[query]:
		if c.wanted == nil {
			c.wanted = map[string]bool{}
		}
		c.wanted[query] = true
	case len(c.seen) < 4*maxCachedStmts:
		if c.seen == nil {
			c.seen = map[string]bool{}
		}
		c.seen[query] = true
	}
	return nil
}

// prepareWanted prepares on db what transactions asked for. A statement
// that fails to prepare is not asked for again: it runs unprepared, as it
// would have anyway.
func (c *stmtCache) prepareWanted(ctx context.Context, db *sql.DB, log *slog.Logger) {
	c.mu.Lock()
	wanted := c.wanted
	c.wanted = nil
	c.mu.Unlock()
	for q := range wanted {
		st, err := db.PrepareContext(ctx, q)
		if ctx.Err() != nil {
			return // asked for again by the next transaction that runs it
		}
		if err != nil {
			log.Debug("statement left unprepared", "err", err)
		}
		c.mu.Lock()
		if c.stmts == nil {
			c.stmts = map[string]*sql.Stmt{}
		}
		if _, ok := c.stmts[q]; ok && st != nil {
			st.Close()
		} else {
			c.stmts[q] = st // nil when it failed: run unprepared
		}
		c.mu.Unlock()
	}
}

// all returns the prepared statements, for Close.
func (c *stmtCache) all() []*sql.Stmt {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]*sql.Stmt, 0, len(c.stmts))
	for _, st := range c.stmts {
		out = append(out, st)
	}
	return out
}

// exec runs query in tx, the writer's transaction, prepared.
func (s *Store) exec(ctx context.Context, tx *sql.Tx, query string, args ...any) (sql.Result, error) {
	st, err := s.stmts.stmt(ctx, tx, query, true)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}
