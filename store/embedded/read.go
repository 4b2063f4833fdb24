package embedded

import (
	"bytes"
	"context"
	"errors"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// defaultLimit is the page size of List and Events when the caller
// gives none; maxListLimit bounds a List page.
const (
	defaultLimit = 100
	maxListLimit = 10_000
)

// Device reads one device; gateway.ErrNotFound if the store never saw it.
func (s *Store) Device(ctx context.Context, id gateway.DeviceID) (gateway.DeviceInfo, error) {
	const op = "embedded: device"
	if err := s.ready(ctx); err != nil {
		return gateway.DeviceInfo{}, fmt.Errorf("%s: %w", op, err)
	}
	var info gateway.DeviceInfo
	err := s.db.View(func(tx *bolt.Tx) error {
		sh, err := openShard(tx, gateway.ShardOf(id, s.shards))
		if err != nil {
			return err
		}
		r, ok, err := sh.record(id)
		if err != nil {
			return err
		}
		if !ok {
			return fmt.Errorf("device %s: %w", id, gateway.ErrNotFound)
		}
		info = deviceInfo(id, &r)
		return nil
	})
	if errors.Is(err, gateway.ErrNotFound) {
		return gateway.DeviceInfo{}, err // an answer, not a failure of the store
	}
	if err != nil {
		return gateway.DeviceInfo{}, fmt.Errorf("%s: %w", op, err)
	}
	return info, nil
}

func deviceInfo(id gateway.DeviceID, r *record) gateway.DeviceInfo {
	info := gateway.DeviceInfo{
		Device:   id,
		State:    gateway.Offline,
		Deadline: msTime(r.deadline()),
		Ver:      r.ver,
		Since:    msTime(r.since),
		Gateway:  r.gw,
		Session:  r.session,
	}
	if r.online {
		info.State = gateway.Online
	}
	for _, x := range r.sessions {
		info.Sessions = append(info.Sessions, gateway.SessionInfo{
			ID: x.id, Deadline: msTime(x.deadline), Gateway: x.gw, Epoch: x.epoch,
		})
	}
	return info
}

// List pages through devices in q's order (gateway.ListQuery), in one
// read transaction: by ID, each shard's dev/ from the cursor (or the
// prefix) on, a state filter reading at most 2 × limit + 64 records
// of a shard; by last change, each shard's chg/ backwards from the
// cursor, one walk per state; the shards' runs merged
// (gateway.MergeListRuns). At most 10 000 devices a page.
func (s *Store) List(ctx context.Context, q gateway.ListQuery) (gateway.ListPage, error) {
	const op = "embedded: list"
	if err := s.ready(ctx); err != nil {
		return gateway.ListPage{}, fmt.Errorf("%s: %w", op, err)
	}
	order, limit, after, err := q.Check(maxListLimit)
	if err != nil {
		return gateway.ListPage{}, fmt.Errorf("%s: %w", op, err)
	}
	var page gateway.ListPage
	err = s.db.View(func(tx *bolt.Tx) error {
		shards := make([]shard, s.shards)
		var runs []gateway.ListRun
		for n := range s.shards {
			sh, err := openShard(tx, n)
			if err != nil {
				return err
			}
			shards[n] = sh
			if order == gateway.OrderID {
				run, err := idRun(sh, q.Prefix, q.State, after, limit)
				if err != nil {
					return fmt.Errorf("shard %d: %w", n, err)
				}
				runs = append(runs, run)
				continue
			}
			for _, online := range []bool{true, false} {
				if q.State == "" || (q.State == gateway.Online) == online {
					runs = append(runs, changeRun(sh, online, after, limit))
				}
			}
		}
		keys, next := gateway.MergeListRuns(order, runs, limit)
		for _, k := range keys {
			r, ok, err := shards[gateway.ShardOf(k.Device, s.shards)].record(k.Device)
			if err != nil {
				return err
			}
			if !ok {
				return fmt.Errorf("device %s: indexed, but no record: %w", k.Device, errCorrupt)
			}
			page.Devices = append(page.Devices, deviceInfo(k.Device, &r))
		}
		if next != nil {
			page.Next = order.Cursor(*next)
		}
		return nil
	})
	if err != nil {
		return gateway.ListPage{}, fmt.Errorf("%s: %w", op, err)
	}
	return page, nil
}

// idRun reads the devices of sh whose ID starts with prefix, after the
// cursor key after (nil: from the start), in ID order: at most limit,
// of state when it is not "" (reading at most 2 × limit + 64
// records).
func idRun(sh shard, prefix string, state gateway.State, after *gateway.ListKey, limit int) (gateway.ListRun, error) {
	var run gateway.ListRun
	start := []byte(prefix)
	if after != nil && string(after.Device) >= prefix {
		start = append([]byte(after.Device), 0)
	}
	budget := 2*limit + 64
	c := sh.dev.Cursor()
	for k, v := c.Seek(start); k != nil && bytes.HasPrefix(k, []byte(prefix)); k, v = c.Next() {
		if len(run.Keys) == limit || budget == 0 {
			run.More = true
			return run, nil
		}
		budget--
		run.Bound = gateway.ListKey{Device: gateway.DeviceID(k)}
		if state != "" {
			online, err := recordOnline(v)
			if err != nil {
				return run, fmt.Errorf("device %s: %w", k, err)
			}
			if online != (state == gateway.Online) {
				continue
			}
		}
		run.Keys = append(run.Keys, run.Bound)
	}
	return run, nil
}

// changeRun reads the devices of sh in one state by last change, newest
// first, after the cursor key after (nil: from the newest): at most
// limit.
func changeRun(sh shard, online bool, after *gateway.ListKey, limit int) gateway.ListRun {
	var run gateway.ListRun
	state := byte(0)
	if online {
		state = 1
	}
	below := []byte{state + 1}
	if after != nil {
		below = chgKey(online, after.Since, after.Device)
	}
	c := sh.chg.Cursor()
	k, _ := c.Seek(below)
	if k == nil {
		k, _ = c.Last()
	} else {
		k, _ = c.Prev()
	}
	for ; k != nil && k[0] == state; k, _ = c.Prev() {
		if len(run.Keys) == limit {
			run.More = true
			return run
		}
		if _, since, d, ok := parseChgKey(k); ok {
			run.Bound = gateway.ListKey{Since: since, Device: d}
			run.Keys = append(run.Keys, run.Bound)
		}
	}
	return run
}

// Events reads up to limit events of shard after position after ("" or
// "0" for the start; "<ms>" means "<ms>-0"). limit ≤ 0 means 100.
func (s *Store) Events(ctx context.Context, shard int, after string, limit int) ([]gateway.Event, error) {
	const op = "embedded: events"
	if err := s.checkShard(ctx, shard); err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	from, err := parseAfter(after)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	if limit <= 0 {
		limit = defaultLimit
	}
	var out []gateway.Event
	err = s.db.View(func(tx *bolt.Tx) error {
		sh, err := openShard(tx, shard)
		if err != nil {
			return err
		}
		c := sh.ev.Cursor()
		for k, v := c.Seek(from); k != nil && len(out) < limit; k, v = c.Next() {
			e, err := decodeEvent(shard, k, v)
			if err != nil {
				return fmt.Errorf("event %x: %w", k, err)
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("%s: %w", op, err)
	}
	return out, nil
}

// parseAfter returns the first log key after position after.
func parseAfter(after string) ([]byte, error) {
	if after == "" || after == "0" {
		return nil, nil
	}
	id, err := parseEventID(after)
	if err != nil {
		return nil, err
	}
	if id.ms == ^uint64(0) && id.seq == ^uint64(0) {
		return nil, fmt.Errorf("position %q: past the end", after)
	}
	return id.next(0).key(), nil
}
