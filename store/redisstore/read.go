package redisstore

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
)

// Device reads one device; gateway.ErrNotFound if the store never saw it.
func (s *Store) Device(ctx context.Context, id gateway.DeviceID) (gateway.DeviceInfo, error) {
	c, err := s.client()
	if err != nil {
		return gateway.DeviceInfo{}, err
	}
	shard := gateway.ShardOf(id, s.shards)
	res, err := s.view.Run(ctx, c, s.keys[shard].data, "get", string(id)).Slice()
	if err != nil {
		return gateway.DeviceInfo{}, unavailable("device", err)
	}
	if len(res) == 0 {
		return gateway.DeviceInfo{}, fmt.Errorf("device %s: %w", id, gateway.ErrNotFound)
	}
	d, err := parseView(res[0])
	if err != nil {
		return gateway.DeviceInfo{}, fmt.Errorf("redisstore: device %s: %w", id, err)
	}
	return d, nil
}

// parseScan reads the view script's "scan" reply: the HSCAN cursor to
// resume at, the items of its step to pass over, and the devices.
func parseScan(res []any) (cursor string, skip int, devs []gateway.DeviceInfo, err error) {
	if len(res) < 2 {
		return "", 0, nil, errors.New("short reply")
	}
	for _, v := range res[2:] {
		d, err := parseView(v)
		if err != nil {
			return "", 0, nil, err
		}
		devs = append(devs, d)
	}
	return str(res[0]), int(num(res[1])), devs, nil
}

// parseView reads a device view of view.lua.
func parseView(v any) (gateway.DeviceInfo, error) {
	f, ok := v.([]any)
	if !ok || len(f) != 8 {
		return gateway.DeviceInfo{}, fmt.Errorf("malformed device view %v", v)
	}
	d := gateway.DeviceInfo{
		Device:  gateway.DeviceID(str(f[0])),
		State:   gateway.Offline,
		Ver:     uint64(num(f[2])),
		Since:   time.UnixMilli(num(f[3])),
		Gateway: str(f[4]),
		Session: gateway.SessionID(str(f[5])),
	}
	if num(f[1]) == 1 {
		d.State = gateway.Online
	}
	if dl := num(f[6]); dl >= 0 {
		d.Deadline = time.UnixMilli(dl)
	}
	sess, _ := f[7].([]any)
	for i := 0; i+3 < len(sess); i += 4 {
		d.Sessions = append(d.Sessions, gateway.SessionInfo{
			ID:       gateway.SessionID(str(sess[i])),
			Deadline: time.UnixMilli(num(sess[i+1])),
			Gateway:  str(sess[i+2]),
			Epoch:    uint64(num(sess[i+3])),
		})
	}
	return d, nil
}

// checkScanCursor accepts a position of view.lua's scan: an HSCAN cursor,
// or "lp" (inside a listpack's one step).
func checkScanCursor(c string) error {
	if c == "lp" {
		return nil
	}
	_, err := strconv.ParseUint(c, 10, 64)
	return err
}

const (
	// defaultLimit is the page size of Events for a limit ≤ 0.
	defaultLimit = 100
	// maxListLimit caps a List page and a snapshot page.
	maxListLimit = 1000
	// scanCount is the HSCAN COUNT of a snapshot page. It never changes
	// between pages: a page token's skip counts items of the step HSCAN
	// returns at that cursor with this COUNT.
	scanCount = 100
)

// viewShards runs view.lua with args on every shard in one pipeline (one
// per Cluster node, in parallel), falling back to EVAL for a shard whose
// node lacks the script; the replies are in shard order.
func (s *Store) viewShards(ctx context.Context, c redis.UniversalClient, op string, args ...any) ([][]any, error) {
	cmds := make([]*redis.Cmd, s.shards)
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			cmds[i] = s.view.EvalSha(ctx, p, s.keys[i].data, args...)
		}
		return nil
	})
	out := make([][]any, s.shards)
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			res, err = s.view.Run(ctx, c, s.keys[i].data, args...).Slice()
		}
		if err != nil {
			return nil, unavailable(op, err)
		}
		out[i] = res
	}
	return out, nil
}

// List pages through the devices in q's order (gateway.ListQuery) in two
// round trips: view.lua's "keys" on every shard reads the shard's next
// keys from its index ({P:s}:idx, record.lua "Indexes"; built there on
// first use), merged into the page's (gateway.MergeListRuns); then
// "views" reads those devices, on their shards. A device that changed
// between the two (its state or last change no longer what the index
// said) is left out: by last change it is now further up. At most 1000
// devices a page.
func (s *Store) List(ctx context.Context, q gateway.ListQuery) (gateway.ListPage, error) {
	c, err := s.client()
	if err != nil {
		return gateway.ListPage{}, err
	}
	order, limit, after, err := q.Check(maxListLimit)
	if err != nil {
		return gateway.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
	}
	asince, adev := "", ""
	if after != nil {
		asince, adev = strconv.FormatInt(after.Since, 10), string(after.Device)
	}
	replies, err := s.viewShards(ctx, c, "list", "keys", string(order), string(q.State), q.Prefix, asince, adev, limit)
	if err != nil {
		return gateway.ListPage{}, err
	}
	var runs []gateway.ListRun
	for i, res := range replies {
		rs, err := parseRuns(res)
		if err != nil {
			return gateway.ListPage{}, fmt.Errorf("redisstore: list: shard %d: %w", i, err)
		}
		runs = append(runs, rs...)
	}
	keys, next := gateway.MergeListRuns(order, runs, limit)
	var page gateway.ListPage
	if next != nil {
		page.Next = order.Cursor(*next)
	}
	if len(keys) == 0 {
		return page, nil
	}
	views, err := s.views(ctx, c, keys)
	if err != nil {
		return gateway.ListPage{}, err
	}
	for _, k := range keys {
		d, ok := views[k.Device]
		if !ok || (q.State != "" && d.State != q.State) || (order == gateway.OrderChanged && d.Since.UnixMilli() != k.Since) {
			continue
		}
		page.Devices = append(page.Devices, d)
	}
	return page, nil
}

// parseRuns reads the runs of view.lua's "keys": {more, bound since,
// bound device, {since, device, ...}} each.
func parseRuns(res []any) ([]gateway.ListRun, error) {
	var runs []gateway.ListRun
	for _, v := range res {
		r, ok := v.([]any)
		if !ok || len(r) != 4 {
			return nil, fmt.Errorf("malformed run %v", v)
		}
		keys, _ := r[3].([]any)
		run := gateway.ListRun{More: num(r[0]) == 1, Bound: gateway.ListKey{Since: num(r[1]), Device: gateway.DeviceID(str(r[2]))}}
		for i := 0; i+1 < len(keys); i += 2 {
			run.Keys = append(run.Keys, gateway.ListKey{Since: num(keys[i]), Device: gateway.DeviceID(str(keys[i+1]))})
		}
		runs = append(runs, run)
	}
	return runs, nil
}

// views reads the devices of keys with view.lua's "views", one call per
// shard they are on, in one pipeline; a device without a record is
// absent from the result.
func (s *Store) views(ctx context.Context, c redis.UniversalClient, keys []gateway.ListKey) (map[gateway.DeviceID]gateway.DeviceInfo, error) {
	byShard := map[int][]any{}
	for _, k := range keys {
		sh := gateway.ShardOf(k.Device, s.shards)
		if byShard[sh] == nil {
			byShard[sh] = []any{"views"}
		}
		byShard[sh] = append(byShard[sh], string(k.Device))
	}
	cmds := map[int]*redis.Cmd{}
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for sh, args := range byShard {
			cmds[sh] = s.view.EvalSha(ctx, p, s.keys[sh].data, args...)
		}
		return nil
	})
	out := make(map[gateway.DeviceID]gateway.DeviceInfo, len(keys))
	for sh, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			res, err = s.view.Run(ctx, c, s.keys[sh].data, byShard[sh]...).Slice()
		}
		if err != nil {
			return nil, unavailable("list", err)
		}
		for _, v := range res {
			d, err := parseView(v)
			if err != nil {
				return nil, fmt.Errorf("redisstore: list: %w", err)
			}
			out[d.Device] = d
		}
	}
	return out, nil
}

// Events reads up to limit events of shard after position after (XRANGE,
// exclusive); "" or "0" reads from the start. limit ≤ 0 means 100.
func (s *Store) Events(ctx context.Context, shard int, after string, limit int) ([]gateway.Event, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	if err := s.checkShard("events", shard); err != nil {
		return nil, err
	}
	if limit <= 0 {
		limit = defaultLimit
	}
	start := "-"
	if after != "" && after != "0" {
		if !validStreamID(after) {
			return nil, fmt.Errorf("redisstore: events: position %q is not <ms>-<seq>", after)
		}
		start = "(" + after
	}
	msgs, err := c.XRangeN(ctx, s.keys[shard].data[2], start, "+", int64(limit)).Result()
	if err != nil {
		return nil, unavailable("events", err)
	}
	evs := make([]gateway.Event, 0, len(msgs))
	for _, m := range msgs {
		e, err := streamEvent(shard, m)
		if err != nil {
			return nil, fmt.Errorf("redisstore: events: %w", err)
		}
		evs = append(evs, e)
	}
	return evs, nil
}

// validStreamID reports whether id is a stream ID "<ms>-<seq>".
func validStreamID(id string) bool {
	ms, seq, ok := strings.Cut(id, "-")
	_, err1 := strconv.ParseUint(ms, 10, 64)
	_, err2 := strconv.ParseUint(seq, 10, 64)
	return ok && err1 == nil && err2 == nil
}

func streamEvent(shard int, m redis.XMessage) (gateway.Event, error) {
	field := func(k string) string {
		v, _ := m.Values[k].(string)
		return v
	}
	ver, err1 := strconv.ParseUint(field("ver"), 10, 64)
	at, err2 := strconv.ParseInt(field("at"), 10, 64)
	if err := errors.Join(err1, err2); err != nil {
		return gateway.Event{}, fmt.Errorf("event %s: %w", m.ID, err)
	}
	if field("device") == "" {
		// a gateway event (lua/record.lua, gatewayevent)
		contact, err := strconv.ParseInt(field("contact"), 10, 64)
		if err != nil {
			return gateway.Event{}, fmt.Errorf("event %s: contact: %w", m.ID, err)
		}
		return gateway.Event{ID: m.ID, Shard: shard, State: gateway.State(field("state")), Ver: ver,
			At: time.UnixMilli(at), Gateway: field("gateway"), Contact: time.UnixMilli(contact)}, nil
	}
	e := gateway.Event{
		ID:      m.ID,
		Shard:   shard,
		Device:  gateway.DeviceID(field("device")),
		State:   gateway.State(field("state")),
		Ver:     ver,
		At:      time.UnixMilli(at),
		Reason:  gateway.Reason(field("reason")),
		Gateway: field("gw"),
		Session: gateway.SessionID(field("session")),
	}
	if dl := field("deadline"); dl != "" {
		ms, err := strconv.ParseInt(dl, 10, 64)
		if err != nil {
			return gateway.Event{}, fmt.Errorf("event %s: deadline: %w", m.ID, err)
		}
		e.Deadline = time.UnixMilli(ms)
	}
	return e, nil
}

// Counts sums the shards' counts of view.lua's "counts" (record.lua,
// ONLINE_COUNT; the suspect devices by ZCOUNT of the deadline index):
// one pipeline of script calls (one per Cluster node).
func (s *Store) Counts(ctx context.Context, window time.Duration) (gateway.Counts, error) {
	c, err := s.client()
	if err != nil {
		return gateway.Counts{}, err
	}
	replies, err := s.viewShards(ctx, c, "counts", "counts", max(window, 0).Milliseconds(), s.nowArg())
	if err != nil {
		return gateway.Counts{}, err
	}
	var n gateway.Counts
	for i, res := range replies {
		if len(res) != 3 {
			return gateway.Counts{}, fmt.Errorf("redisstore: counts: shard %d: malformed reply %v", i, res)
		}
		n.Online += num(res[0])
		n.Offline += num(res[1])
		n.Suspect += num(res[2])
	}
	return n, nil
}

// Gateways merges view.lua's "gateways" of every shard (one pipeline,
// one per Cluster node): the newest epoch and the latest contact of
// each gateway over the shards, behind as of that contact, lost as shard
// 0 keeps it, its sessions summed.
func (s *Store) Gateways(ctx context.Context) ([]gateway.GatewayInfo, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	replies, err := s.viewShards(ctx, c, "gateways", "gateways")
	if err != nil {
		return nil, err
	}
	byID := map[string]*gateway.GatewayInfo{}
	for i, res := range replies {
		if len(res)%6 != 0 {
			return nil, fmt.Errorf("redisstore: gateways: shard %d: malformed reply %v", i, res)
		}
		for j := 0; j < len(res); j += 6 {
			id := str(res[j])
			g := byID[id]
			if g == nil {
				g = &gateway.GatewayInfo{ID: id}
				byID[id] = g
			}
			g.Epoch = max(g.Epoch, uint64(num(res[j+1])))
			if at := num(res[j+2]); at >= 0 && time.UnixMilli(at).After(g.Contact) {
				g.Contact, g.Behind = time.UnixMilli(at), num(res[j+3]) == 1
			}
			if i == 0 {
				g.Lost = num(res[j+4]) == 1
			}
			g.Sessions += num(res[j+5])
		}
	}
	return sortedGateways(byID), nil
}

// sortedGateways is the gateways of byID ordered by ID.
func sortedGateways(byID map[string]*gateway.GatewayInfo) []gateway.GatewayInfo {
	out := make([]gateway.GatewayInfo, 0, len(byID))
	for _, g := range byID {
		out = append(out, *g)
	}
	slices.SortFunc(out, func(a, b gateway.GatewayInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}
