package events

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/store"
)

// Registrar keeps exactly one subscription with syncd's sink on each
// configured group: it creates a missing one (also after someone deleted
// it upstream), removes duplicates of its own, and leaves everyone else's
// subscriptions alone.
type Registrar struct {
	Client *platform.Client
	Store  *store.Store
	Groups []string
	Sink   string
	Logger *slog.Logger
}

func (r *Registrar) log() *slog.Logger {
	if r.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return r.Logger
}

// own lists the group's subscriptions whose sink is syncd's.
func (r *Registrar) own(ctx context.Context, group string) ([]platform.Subscription, error) {
	var mine []platform.Subscription
	for sub, err := range r.Client.Subscriptions(platform.ListQuery{ChildrenOf: group}).All(ctx) {
		if err != nil {
			return nil, fmt.Errorf("list subscriptions of group %s: %w", group, err)
		}
		// Children of the group only, whatever the server's filter did.
		if sub.Sink == r.Sink && strings.HasPrefix(sub.UID, group+"/") {
			mine = append(mine, sub)
		}
	}
	return mine, nil
}

// Ensure reconciles every group's subscription.
func (r *Registrar) Ensure(ctx context.Context) error {
	var errs []error
	for _, g := range r.Groups {
		if err := r.ensure(ctx, g); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

func (r *Registrar) ensure(ctx context.Context, group string) error {
	mine, err := r.own(ctx, group)
	if err != nil {
		return err
	}
	if len(mine) == 0 {
		sub, err := r.Client.CreateSubscription(ctx, group, r.Sink)
		if err != nil {
			return fmt.Errorf("subscribe group %s to %s: %w", group, r.Sink, err)
		}
		r.log().Info("registered event subscription", "group", group, "sink", r.Sink, "uid", sub.UID)
		mine = []platform.Subscription{sub}
	}
	// Keep the oldest; a duplicate (from a create whose answer was lost)
	// would deliver every event twice.
	keep := mine[0]
	for _, s := range mine[1:] {
		if s.CreateTime.Before(keep.CreateTime) {
			keep = s
		}
	}
	for _, s := range mine {
		if s.UID == keep.UID {
			continue
		}
		if err := r.Client.DeleteSubscription(ctx, s.UID); err != nil && !platform.IsNotFound(err) {
			return fmt.Errorf("remove duplicate subscription %s: %w", s.UID, err)
		}
		if err := r.Store.DeleteSubscription(ctx, s.UID); err != nil {
			return err
		}
		r.log().Info("removed duplicate event subscription", "group", group, "uid", s.UID)
	}
	known, err := r.Store.Subscriptions(ctx)
	if err != nil {
		return err
	}
	for _, k := range known {
		// Recorded earlier but gone upstream (recreated above): forget it.
		if k.GroupUID == group && k.UID != keep.UID {
			if err := r.Store.DeleteSubscription(ctx, k.UID); err != nil {
				return err
			}
		}
	}
	return r.Store.UpsertSubscription(
		ctx,
		store.Subscription{UID: keep.UID, GroupUID: group, Sink: keep.Sink, CreateTime: keep.CreateTime},
	)
}

// List returns syncd's subscriptions on every group.
func (r *Registrar) List(ctx context.Context) ([]platform.Subscription, error) {
	var all []platform.Subscription
	for _, g := range r.Groups {
		mine, err := r.own(ctx, g)
		if err != nil {
			return nil, err
		}
		all = append(all, mine...)
	}
	return all, nil
}

// Remove deletes syncd's subscriptions on every group and returns how many.
func (r *Registrar) Remove(ctx context.Context) (int, error) {
	mine, err := r.List(ctx)
	if err != nil {
		return 0, err
	}
	for i, s := range mine {
		if err := r.Client.DeleteSubscription(ctx, s.UID); err != nil && !platform.IsNotFound(err) {
			return i, fmt.Errorf("remove subscription %s: %w", s.UID, err)
		}
		if err := r.Store.DeleteSubscription(ctx, s.UID); err != nil {
			return i, err
		}
	}
	return len(mine), nil
}
