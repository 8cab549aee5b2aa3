package store

import (
	"context"
	"fmt"
)

// Writable checks that the mirror can take a write: it begins an immediate
// transaction (taking SQLite's write lock) and rolls it back.
func (s *Store) Writable(ctx context.Context) error {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("database not writable: %w", err)
	}
	return tx.Rollback()
}
