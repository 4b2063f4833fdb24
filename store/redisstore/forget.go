package redisstore

import (
	"context"
	_ "embed"
	"fmt"

	"github.com/fleetgate/fleetgate/gateway"
)

//go:embed lua/forget.lua
var forgetLua string

var _ gateway.Forgetter = (*Store)(nil)

// Forget removes device from the store with the semantics of
// gateway.Forgetter, in one script call on its shard (lua/forget.lua).
func (s *Store) Forget(ctx context.Context, device gateway.DeviceID, by string) (gateway.Event, error) {
	c, err := s.client()
	if err != nil {
		return gateway.Event{}, err
	}
	shard := gateway.ShardOf(device, s.shards)
	sent := s.localNow()
	res, err := s.forget.Run(ctx, c, s.keys[shard].data,
		// in the order of forget.lua's G_ positions
		string(device), // G_DEVICE
		by,             // G_BY
		s.nowArg(),     // G_NOW
		s.maxLen,       // G_MAXLEN
	).Slice()
	if err != nil {
		return gateway.Event{}, unavailable("forget", err)
	}
	if len(res) < 2 {
		return gateway.Event{}, fmt.Errorf("redisstore: forget: malformed reply of %d items", len(res))
	}
	s.seen(shard, num(res[1]), sent)
	if num(res[0]) == 0 {
		return gateway.Event{}, fmt.Errorf("redisstore: forget: device %s: %w", device, gateway.ErrNotFound)
	}
	evs, err := parseEvents(shard, res[2:])
	if err != nil || len(evs) != 1 {
		return gateway.Event{}, fmt.Errorf("redisstore: forget: malformed reply: %v", err)
	}
	return evs[0], nil
}
