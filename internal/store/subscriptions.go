package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Subscription is one of syncd's own subscriptions on the platform: where
// the platform delivers the events of a group.
type Subscription struct {
	UID        string
	GroupUID   string
	Sink       string
	CreateTime time.Time
}

// UpsertSubscription records a subscription syncd registered or found on
// the platform, reviving it if it was deleted.
func (s *Store) UpsertSubscription(ctx context.Context, sub Subscription) error {
	_, err := s.w.ExecContext(
		ctx,
		`INSERT INTO subscriptions (uid, group_uid, sink, create_time, synced_time) VALUES (?, ?, ?, ?, ?)
		ON CONFLICT(uid) DO UPDATE SET group_uid=excluded.group_uid, sink=excluded.sink, create_time=excluded.create_time,
			synced_time=excluded.synced_time, deleted_time=NULL`,
		sub.UID,
		sub.GroupUID,
		sub.Sink,
		nullTime(sub.CreateTime),
		FormatTime(s.now()),
	)
	if err != nil {
		return fmt.Errorf("record subscription %s: %w", sub.UID, err)
	}
	return nil
}

// Subscriptions returns the live subscriptions, oldest first.
func (s *Store) Subscriptions(ctx context.Context) ([]Subscription, error) {
	var subs []Subscription
	err := queryRows(ctx, s.w, `SELECT uid, group_uid, sink, COALESCE(create_time,'') FROM subscriptions
		WHERE deleted_time IS NULL ORDER BY create_time, uid`, nil, func(rows *sql.Rows) error {
		var sub Subscription
		var ct string
		if err := rows.Scan(&sub.UID, &sub.GroupUID, &sub.Sink, &ct); err != nil {
			return err
		}
		var err error
		if sub.CreateTime, err = ParseTime(ct); err != nil {
			return err
		}
		subs = append(subs, sub)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list subscriptions: %w", err)
	}
	return subs, nil
}

// DeleteSubscription records that the subscription uid is gone from the
// platform. The row stays, with deleted_time set, as the record of where
// events were once delivered; deleting an unknown or deleted uid does
// nothing.
func (s *Store) DeleteSubscription(ctx context.Context, uid string) error {
	_, err := s.w.ExecContext(
		ctx,
		`UPDATE subscriptions SET deleted_time = ? WHERE uid = ? AND deleted_time IS NULL`,
		FormatTime(s.now()),
		uid,
	)
	if err != nil {
		return fmt.Errorf("delete subscription %s: %w", uid, err)
	}
	return nil
}
