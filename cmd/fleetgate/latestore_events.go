package main

import (
	"context"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// lateStore's gateway.EventLog methods (store.go): errNotYet until the
// Redis store has opened.

func (l *lateStore) SnapshotShard(ctx context.Context, shard int, page string, limit int) (gateway.SnapshotPage, error) {
	s, err := l.store()
	if err != nil {
		return gateway.SnapshotPage{}, err
	}
	return s.SnapshotShard(ctx, shard, page, limit)
}

func (l *lateStore) ReadEvents(ctx context.Context, shard int, after gateway.Position, limit int, block time.Duration) ([]gateway.Event, error) {
	s, err := l.store()
	if err != nil {
		return nil, err
	}
	return s.ReadEvents(ctx, shard, after, limit, block)
}

func (l *lateStore) AcquirePublisher(ctx context.Context, shard int, owner string, ttl time.Duration) (gateway.Position, bool, error) {
	s, err := l.store()
	if err != nil {
		return gateway.Position{}, false, err
	}
	return s.AcquirePublisher(ctx, shard, owner, ttl)
}

func (l *lateStore) SavePublisher(ctx context.Context, shard int, owner string, pos gateway.Position) error {
	s, err := l.store()
	if err != nil {
		return err
	}
	return s.SavePublisher(ctx, shard, owner, pos)
}

func (l *lateStore) ReleasePublisher(ctx context.Context, shard int, owner string) error {
	s, err := l.store()
	if err != nil {
		return err
	}
	return s.ReleasePublisher(ctx, shard, owner)
}
