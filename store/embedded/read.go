package embedded

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"

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

// List pages through devices in (shard, device ID) order, filtered by
// state. The cursor is "<shard>/<device ID>", the next record to read.
// One call reads a bounded number of records (and returns at most
// 10 000), so a page with a selective filter may hold fewer devices than
// the limit while Next is not yet "".
func (s *Store) List(ctx context.Context, q gateway.ListQuery) (gateway.ListPage, error) {
	const op = "embedded: list"
	if err := s.ready(ctx); err != nil {
		return gateway.ListPage{}, fmt.Errorf("%s: %w", op, err)
	}
	switch q.State {
	case "", gateway.Online, gateway.Offline:
	default:
		return gateway.ListPage{}, fmt.Errorf("%s: state filter %q: want online, offline or none", op, q.State)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = defaultLimit
	}
	limit = min(limit, maxListLimit)
	startShard, from, err := parseListCursor(q.Cursor, s.shards)
	if err != nil {
		return gateway.ListPage{}, fmt.Errorf("%s: %w", op, err)
	}
	budget := 16*limit + 1024
	var page gateway.ListPage
	err = s.db.View(func(tx *bolt.Tx) error {
		for n := startShard; n < s.shards; n++ {
			sh, err := openShard(tx, n)
			if err != nil {
				return err
			}
			c := sh.dev.Cursor()
			k, v := c.First()
			if n == startShard && from != nil {
				k, v = c.Seek(from)
			}
			for ; k != nil; k, v = c.Next() {
				if len(page.Devices) == limit || budget == 0 {
					page.Next = strconv.Itoa(n) + "/" + string(k)
					return nil
				}
				budget--
				r, err := decodeRecord(v)
				if err != nil {
					return fmt.Errorf("device %s: %w", k, err)
				}
				if q.State == "" || (q.State == gateway.Online) == r.online {
					page.Devices = append(page.Devices, deviceInfo(gateway.DeviceID(k), &r))
				}
			}
		}
		return nil
	})
	if err != nil {
		return gateway.ListPage{}, fmt.Errorf("%s: %w", op, err)
	}
	return page, nil
}

// parseListCursor returns the shard and device ID at which a List
// resumes.
func parseListCursor(c string, shards int) (int, []byte, error) {
	if c == "" {
		return 0, nil, nil
	}
	ns, key, ok := strings.Cut(c, "/")
	n, err := strconv.Atoi(ns)
	if !ok || err != nil || n < 0 || n >= shards || key == "" {
		return 0, nil, fmt.Errorf("bad cursor %q", c)
	}
	return n, []byte(key), nil
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
