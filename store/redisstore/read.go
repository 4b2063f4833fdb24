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

// listCursor is the position of List: a shard, an HSCAN cursor of that
// shard's {P:s}:dev, and how many items of that cursor's step were already
// returned. Encoded "<shard>.<cursor>.<skip>".
type listCursor struct {
	shard  int
	cursor string
	skip   int
}

func (c listCursor) String() string { return fmt.Sprintf("%d.%s.%d", c.shard, c.cursor, c.skip) }

// checkScanCursor accepts a position of view.lua's scan: an HSCAN cursor,
// or "lp" (inside a listpack's one step).
func checkScanCursor(c string) error {
	if c == "lp" {
		return nil
	}
	_, err := strconv.ParseUint(c, 10, 64)
	return err
}

func parseListCursor(s string, shards int) (listCursor, error) {
	if s == "" {
		return listCursor{cursor: "0"}, nil
	}
	p := strings.Split(s, ".")
	if len(p) == 3 {
		shard, err1 := strconv.Atoi(p[0])
		err2 := checkScanCursor(p[1])
		skip, err3 := strconv.Atoi(p[2])
		if err1 == nil && err2 == nil && err3 == nil && shard >= 0 && shard < shards && skip >= 0 {
			return listCursor{shard: shard, cursor: p[1], skip: skip}, nil
		}
	}
	return listCursor{}, fmt.Errorf("bad cursor %q", s)
}

const (
	// maxListCalls bounds the script calls of one List page.
	maxListCalls = 64
	// defaultLimit is the page size of List and Events for a limit ≤ 0.
	defaultLimit = 100
	// maxListLimit caps a List page.
	maxListLimit = 1000
	// scanCount is the HSCAN COUNT of List. It never changes between
	// pages: a cursor's skip counts items of the step HSCAN returns at
	// that cursor with this COUNT.
	scanCount = 100
)

// List pages through the devices of every shard in shard order (HSCAN of
// {P:s}:dev), filtered by state, at most 1000 a page. As with SCAN, a
// device present for the whole iteration is returned at least once,
// except that one changing between two pages whose boundary falls inside
// one HSCAN step may be skipped or repeated.
func (s *Store) List(ctx context.Context, q gateway.ListQuery) (gateway.ListPage, error) {
	c, err := s.client()
	if err != nil {
		return gateway.ListPage{}, err
	}
	filter := ""
	switch q.State {
	case "":
	case gateway.Online, gateway.Offline:
		filter = string(q.State)
	default:
		return gateway.ListPage{}, fmt.Errorf("redisstore: list: state filter %q: the store knows online and offline only", q.State)
	}
	limit := q.Limit
	if limit <= 0 {
		limit = defaultLimit
	}
	limit = min(limit, maxListLimit)
	cur, err := parseListCursor(q.Cursor, s.shards)
	if err != nil {
		return gateway.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
	}
	var page gateway.ListPage
	for calls := 0; calls < maxListCalls && len(page.Devices) < limit; calls++ {
		res, err := s.view.Run(ctx, c, s.keys[cur.shard].data,
			"scan", cur.cursor, cur.skip, limit-len(page.Devices), filter, scanCount).Slice()
		if err != nil {
			return gateway.ListPage{}, unavailable("list", err)
		}
		var devs []gateway.DeviceInfo
		cur.cursor, cur.skip, devs, err = parseScan(res)
		if err != nil {
			return gateway.ListPage{}, fmt.Errorf("redisstore: list: %w", err)
		}
		page.Devices = append(page.Devices, devs...)
		if cur.cursor == "0" && cur.skip == 0 {
			if cur.shard+1 == s.shards {
				return page, nil
			}
			cur = listCursor{shard: cur.shard + 1, cursor: "0"}
		}
	}
	page.Next = cur.String()
	return page, nil
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
// ONLINE_COUNT): one pipeline of script calls (one per Cluster node).
func (s *Store) Counts(ctx context.Context) (gateway.Counts, error) {
	c, err := s.client()
	if err != nil {
		return gateway.Counts{}, err
	}
	cmds := make([]*redis.Cmd, s.shards)
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			cmds[i] = s.view.EvalSha(ctx, p, s.keys[i].data, "counts")
		}
		return nil
	})
	var n gateway.Counts
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			res, err = s.view.Run(ctx, c, s.keys[i].data, "counts").Slice()
		}
		if err != nil {
			return gateway.Counts{}, unavailable("counts", err)
		}
		if len(res) != 2 {
			return gateway.Counts{}, fmt.Errorf("redisstore: counts: shard %d: malformed reply %v", i, res)
		}
		n.Online += num(res[0])
		n.Offline += num(res[1])
	}
	return n, nil
}

// Gateways merges view.lua's "gateways" of every shard (one pipeline,
// one per Cluster node): the newest epoch and the latest contact of
// each gateway over the shards, behind as of that contact, lost as shard
// 0 keeps it.
func (s *Store) Gateways(ctx context.Context) ([]gateway.GatewayInfo, error) {
	c, err := s.client()
	if err != nil {
		return nil, err
	}
	cmds := make([]*redis.Cmd, s.shards)
	_, _ = c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i := range cmds {
			cmds[i] = s.view.EvalSha(ctx, p, s.keys[i].data, "gateways")
		}
		return nil
	})
	byID := map[string]*gateway.GatewayInfo{}
	for i, cmd := range cmds {
		res, err := cmd.Slice()
		if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			res, err = s.view.Run(ctx, c, s.keys[i].data, "gateways").Slice()
		}
		if err != nil {
			return nil, unavailable("gateways", err)
		}
		if len(res)%5 != 0 {
			return nil, fmt.Errorf("redisstore: gateways: shard %d: malformed reply %v", i, res)
		}
		for j := 0; j < len(res); j += 5 {
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
