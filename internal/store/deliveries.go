package store

import (
	"context"
	"fmt"
	"time"
)

// FirstDelivery records the CloudEvents id of a pushed event and reports
// whether it is new, so a redelivery, even after a restart, is recognised.
func (s *Store) FirstDelivery(ctx context.Context, id string) (bool, error) {
	res, err := s.w.ExecContext(
		ctx,
		`INSERT INTO webhook_deliveries (ce_id, received_time) VALUES (?, ?) ON CONFLICT(ce_id) DO NOTHING`,
		id,
		FormatTime(s.now()),
	)
	if err != nil {
		return false, fmt.Errorf("record delivery %s: %w", id, err)
	}
	n, err := res.RowsAffected()
	return n == 1, err
}

// ForgetDelivery removes a delivery id, so that its redelivery is new.
func (s *Store) ForgetDelivery(ctx context.Context, id string) error {
	if _, err := s.w.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE ce_id = ?`, id); err != nil {
		return fmt.Errorf("forget delivery %s: %w", id, err)
	}
	return nil
}

// PruneDeliveries forgets delivery ids recorded before cutoff; no sender
// redelivers that late.
func (s *Store) PruneDeliveries(ctx context.Context, cutoff time.Time) (int64, error) {
	res, err := s.w.ExecContext(ctx, `DELETE FROM webhook_deliveries WHERE received_time < ?`, FormatTime(cutoff))
	if err != nil {
		return 0, fmt.Errorf("prune deliveries: %w", err)
	}
	return res.RowsAffected()
}
