package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/cluster"
	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/store"
)

// replicaState is what the query service tells of the replica it runs on.
type replicaState struct {
	role    func() string
	lag     func() uint64
	refresh func(ctx context.Context) (uint64, error)
}

// newQuery builds the query service of a replica; nil when [query]
// enabled is false. It refuses a stream that would capture the queries.
func newQuery(ctx context.Context, cfg config.Config, nc *publish.Conn, st *store.Store, pos *query.Position,
	rs replicaState, version string, log *slog.Logger) (*query.Service, error) {
	q := cfg.Query
	if !q.Enabled {
		return nil, nil
	}
	if err := checkQuerySubjects(ctx, nc.JS, cfg); err != nil {
		return nil, err
	}
	// Its statements are closed with the store's reader pool.
	return query.New(
		nc.NC,
		st.Queries(),
		pos,
		query.Config{Prefix: q.Prefix, Version: version, MaxWait: q.MaxWait.Duration,
			MaxLimit: q.MaxLimit, Concurrency: q.Concurrency, MaxPending: q.MaxPending,
			Role: rs.role, Lag: rs.lag, Refresh: rs.refresh, Logger: log.With("part", "query")},
	), nil
}

// checkQuerySubjects refuses a stream that captures <prefix>.>: it would
// store every query, and a request answered by the stream is no answer. A
// stream that does not exist yet (a follower before its leader) is left
// to the stream's own checks.
func checkQuerySubjects(ctx context.Context, js jetstream.JetStream, cfg config.Config) error {
	s, err := js.Stream(ctx, cfg.NATS.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("look up stream %s: %w", cfg.NATS.Stream, err)
	}
	want := cfg.Query.Prefix + ".>"
	for _, subj := range s.CachedInfo().Config.Subjects {
		if query.SubjectsOverlap(subj, want) {
			return ConfigError{
				&config.Error{
					Key: "query.prefix",
					Msg: fmt.Sprintf("stream %s captures %s, which overlaps the query subjects %s: choose another prefix",
						cfg.NATS.Stream, subj, want),
				},
			}
		}
	}
	return nil
}

// streamLast is a leader's position: its mirror holds every event on the
// stream, since it commits an event before publishing it.
func streamLast(js jetstream.JetStream, stream string) func(ctx context.Context) (uint64, error) {
	return func(ctx context.Context) (uint64, error) {
		s, err := js.Stream(ctx, stream)
		if err != nil {
			return 0, fmt.Errorf("look up stream %s: %w", stream, err)
		}
		info, err := s.Info(ctx)
		if err != nil {
			return 0, fmt.Errorf("stream %s info: %w", stream, err)
		}
		return info.State.LastSeq, nil
	}
}

// consumerAcked is a follower's position: what its consumer acknowledged
// (it acknowledges after the commit), or the sequence its snapshot covers.
func consumerAcked(
	js jetstream.JetStream,
	st *store.Store,
	stream, consumer string,
) func(ctx context.Context) (uint64, error) {
	return func(ctx context.Context) (uint64, error) {
		seq, err := st.SnapshotSeq(ctx)
		if err != nil {
			return 0, err
		}
		c, err := js.Consumer(ctx, stream, consumer)
		if err != nil {
			return seq, fmt.Errorf("look up consumer %s: %w", consumer, err)
		}
		info, err := c.Info(ctx)
		if err != nil {
			return seq, fmt.Errorf("consumer %s info: %w", consumer, err)
		}
		return max(seq, info.AckFloor.Stream), nil
	}
}

// onAck advances pos for every event of the stream JetStream acknowledged
// (a publish of the leader's relay).
func onAck(stream string, pos *query.Position) func(*jetstream.PubAck) {
	return func(ack *jetstream.PubAck) {
		if ack.Stream == stream {
			pos.Advance(ack.Sequence)
		}
	}
}

// followAt advances pos after every batch f applies.
func followAt(pos *query.Position, f **cluster.Follower) func(applied int, pending uint64) {
	return func(int, uint64) { pos.Advance((*f).Applied()) }
}

// Query is the query service of "syncd run" in role r; nil when [query]
// enabled is false. A leader's position is the stream's last sequence its
// relay had acknowledged; a standby's, what it has followed.
func (a *App) Query(ctx context.Context, r Leadership) (*query.Service, error) {
	js, stream := a.NATS.JS, a.Config.NATS.Stream
	rs := replicaState{role: func() string { return cluster.RoleLeader }, refresh: streamLast(js, stream)}
	if r.Follower != nil {
		followed := consumerAcked(js, a.Store, stream, a.Config.Cluster.ConsumerName(a.Config.Store.Path))
		leading := func() bool { return r.Current() == cluster.RoleLeader && r.Leading() }
		rs.role = r.Current
		rs.lag = func() uint64 {
			if leading() {
				return 0
			}
			return r.Follower.Lag()
		}
		rs.refresh = func(ctx context.Context) (uint64, error) {
			if leading() {
				return streamLast(js, stream)(ctx)
			}
			return followed(ctx)
		}
	}
	return newQuery(ctx, a.Config, a.NATS, a.Store, a.Position, rs, a.version, a.Log)
}

// Query is the follower's query service; nil when [query] enabled is
// false.
func (f *FollowerApp) Query(ctx context.Context, version string) (*query.Service, error) {
	c := f.Config
	rs := replicaState{role: func() string { return cluster.RoleFollower }, lag: f.Follower.Lag,
		refresh: consumerAcked(f.NATS.JS, f.Store, c.NATS.Stream, c.Cluster.ConsumerName(c.Store.Path))}
	return newQuery(ctx, c, f.NATS, f.Store, f.Position, rs, version, f.Log)
}
