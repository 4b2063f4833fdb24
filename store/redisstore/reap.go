package redisstore

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// reapState is what the reaps of one shard learned of the store's
// outages: a gateway counts as live only once heard after the end of the
// last one (since, store ms). failed: the last reap failed, so the next
// one cannot tell when the outage ended and counts no gateway as live.
type reapState struct {
	inc    string
	failed bool
	since  int64
}

// Reap handles at most limit due entries of shard in one script call;
// limit ≤ 0 handles none and only reports More and Next. With a gateway
// grace, a due device whose last writer is not heard is held instead
// (record.lua, "Held devices"); a gateway counts as heard only after the
// end of the last outage this store saw on the shard: a failed reap, or
// a new incarnation (a restart, a failover, lost data).
func (s *Store) Reap(ctx context.Context, shard int, limit int) (gateway.ReapResult, error) {
	c, err := s.client()
	if err != nil {
		return gateway.ReapResult{}, err
	}
	if err := s.checkShard("reap", shard); err != nil {
		return gateway.ReapResult{}, err
	}
	limit = max(limit, 0)
	s.rmu.Lock()
	st := s.reaps[shard]
	s.rmu.Unlock()
	since := strconv.FormatInt(st.since, 10)
	if st.failed {
		since = "now"
	}
	lostAfter := int64(0)
	if shard == 0 {
		lostAfter = s.lostAfter
	}
	sent := s.localNow()
	res, err := s.reap.Run(ctx, c, s.keys[shard].data,
		// in the order of reap.lua's R_ positions
		limit,                  // R_LIMIT
		s.nowArg(),             // R_NOW
		s.maxLen,               // R_MAXLEN
		s.grace,                // R_GRACE
		s.silence,              // R_SILENCE
		since,                  // R_SINCE
		s.notAfter(ctx, shard), // R_NOTAFTER
		lostAfter,              // R_LOSTAFTER
		s.recheck,              // R_RECHECK
		s.horizon,              // R_HORIZON
		s.reapGap,              // R_GAP
		st.inc,                 // R_SEEN
	).Slice()
	if err == nil && len(res) == 2 && num(res[0]) == -1 {
		s.seen(shard, num(res[1]), sent)
		err = fmt.Errorf("%w: stale call ran at %d, after its caller gave up", gateway.ErrUnavailable, num(res[1]))
	}
	if err != nil {
		s.rmu.Lock()
		s.reaps[shard].failed = true
		s.rmu.Unlock()
		return gateway.ReapResult{}, unavailable("reap", err)
	}
	if len(res) < reapHeader || (len(res)-reapHeader)%reapEventLen != 0 {
		return gateway.ReapResult{}, fmt.Errorf("redisstore: reap: malformed reply of %d items", len(res))
	}
	trimmed, _ := res[0].(int64)
	more, _ := res[1].(int64)
	next, _ := res[2].(int64)
	orphans, _ := res[3].(int64)
	if orphans > 0 {
		s.log.Warn("reap removed due entries without an online record", "shard", shard, "count", orphans)
	}
	now := num(res[4])
	s.seen(shard, now, sent)
	held, _ := res[5].(int64)
	inc := str(res[6])
	gap, _ := res[7].(int64)
	if gap == 1 {
		s.log.Warn("the shard was not reaped for longer than the reap gap (the store, every runner or the host stopped): holding due devices until their gateways are heard again",
			"shard", shard, "gap", time.Duration(s.reapGap)*time.Millisecond, "grace", time.Duration(s.grace)*time.Millisecond)
	}
	s.rmu.Lock()
	cur := &s.reaps[shard]
	if cur.failed || (cur.inc != "" && cur.inc != inc) {
		// an outage ended: gateways count as live once heard again
		cur.since = now
		if s.grace > 0 {
			s.log.Info("store outage or new incarnation seen: holding due devices until their gateways are heard again",
				"shard", shard, "grace", time.Duration(s.grace)*time.Millisecond)
		}
	}
	cur.failed, cur.inc = false, inc
	s.rmu.Unlock()
	r := gateway.ReapResult{Offline: parseReapEvents(shard, now, res[reapHeader:]), Trimmed: int(trimmed), Held: int(held), More: more == 1, Gap: gap == 1, Now: time.UnixMilli(now)}
	if next >= 0 {
		r.Next = time.UnixMilli(next)
	}
	return r, nil
}

// The reap script's flat reply: reapHeader items (trimmed, more, next,
// orphans, now, held, incarnation, gap), then reapEventLen items per offline
// event.
const reapHeader, reapEventLen = 8, 7

// parseReapEvents reads the reap script's events, each
// id, device, ver, gw, session, deadline, reason: all of them are offline
// events at now (ms).
func parseReapEvents(shard int, now int64, items []any) []gateway.Event {
	at := time.UnixMilli(now)
	evs := make([]gateway.Event, 0, len(items)/reapEventLen)
	for i := 0; i+reapEventLen <= len(items); i += reapEventLen {
		evs = append(evs, gateway.Event{
			ID:       str(items[i]),
			Shard:    shard,
			Device:   gateway.DeviceID(str(items[i+1])),
			State:    gateway.Offline,
			Ver:      uint64(num(items[i+2])),
			At:       at,
			Reason:   gateway.Reason(str(items[i+6])),
			Gateway:  str(items[i+3]),
			Session:  gateway.SessionID(str(items[i+4])),
			Deadline: time.UnixMilli(num(items[i+5])),
		})
	}
	return evs
}
