package crawler

import (
	"context"
	"log/slog"
	"time"

	"github.com/robfig/cron/v3"
)

// Pruner is what the prune job needs of the store.
type Pruner interface {
	PruneEvents(ctx context.Context, cutoff time.Time) (int64, error)
	PruneDeliveries(ctx context.Context, cutoff time.Time) (int64, error)
}

// deliveryRetention is how long the ids of pushed events are remembered:
// far longer than the platform retries a delivery.
const deliveryRetention = 7 * 24 * time.Hour

// PruneJob deletes published events older than retention, and the ids of
// deliveries older than a week, at start and hourly. Every role runs it: a
// standby's and a follower's mirror keep the events they applied.
func PruneJob(st Pruner, retention time.Duration, log *slog.Logger) Job {
	return Job{Name: JobPrune, Schedule: cron.Every(time.Hour), Run: func(ctx context.Context) error {
		if n, err := st.PruneEvents(ctx, time.Now().Add(-retention)); err != nil && ctx.Err() == nil {
			log.Warn("pruning old events failed", "err", err)
		} else if n > 0 {
			log.Info("pruned published events", "count", n, "older_than", retention.String())
		}
		if _, err := st.PruneDeliveries(ctx, time.Now().Add(-deliveryRetention)); err != nil && ctx.Err() == nil {
			log.Warn("pruning old delivery ids failed", "err", err)
		}
		return nil
	}}
}
