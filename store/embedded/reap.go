package embedded

import (
	"context"
	"fmt"
	"slices"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// waitScan bounds the due entries one reap looks at beyond its limit:
// those of devices left waiting for their gateway's coverage.
const waitScan = 1024

// Reap handles at most limit due entries (deadline ≤ now) of shard in one
// bolt transaction: it drops their expired sessions and, for a device
// left with none, writes its offline event and removes its entry. With a
// gateway grace, a due device one of whose gateways has not covered its
// deadline (gateway.Batch.Covers) is left as it is and counted in Held,
// until the end of the grace: then it goes offline with reason
// gateway_lost. Next is the earliest deadline left in the shard that is
// not waiting, or a recheck from now when devices wait; More says
// whether the call left due entries it did not look at. A limit ≤ 0
// handles nothing but still reports More and Next.
func (s *Store) Reap(ctx context.Context, shard int, limit int) (gateway.ReapResult, error) {
	const op = "embedded: reap"
	if err := s.checkShard(ctx, shard); err != nil {
		return gateway.ReapResult{}, fmt.Errorf("%s: %w", op, err)
	}
	var res gateway.ReapResult
	err := s.db.Update(func(tx *bolt.Tx) error {
		w, err := s.begin(tx, shard)
		if err != nil {
			return err
		}
		gap := s.gap(shard, w.now)
		if gap {
			s.log.Warn("the shard was not reaped for longer than the reap gap (the process or the host stopped): holding due devices until the gateway's coverage reaches them",
				"shard", shard, "gap", time.Duration(s.reapGap)*time.Millisecond, "grace", time.Duration(s.grace)*time.Millisecond)
		}
		if shard == 0 && s.lostAfter > 0 && !gap {
			if err := w.gatewayEvents(); err != nil {
				return fmt.Errorf("gateway events: %w", err)
			}
		}
		var due [][]byte
		if limit > 0 {
			c := w.sh.exp.Cursor()
			for k, _ := c.First(); k != nil && len(due) < limit+waitScan; k, _ = c.Next() {
				if ms, _, ok := parseExpKey(k); ok && ms > w.now {
					break
				}
				due = append(due, append([]byte(nil), k...))
			}
		}
		waiting := map[string]bool{}
		handled := 0
		for _, k := range due {
			if handled == limit {
				break
			}
			trimmed, wait, err := w.reap(k)
			if err != nil {
				return err
			}
			switch {
			case wait:
				waiting[string(k)] = true
				res.Held++
			case trimmed:
				res.Trimmed++
				handled++
			default:
				handled++
			}
		}
		if err := w.commit(); err != nil {
			return err
		}
		res.Offline = w.events
		res.Gap = gap
		res.Now = msTime(w.now)
		res.Next, res.More = w.next(waiting, limit > 0 && handled == limit)
		return nil
	})
	if err != nil {
		return gateway.ReapResult{}, fmt.Errorf("%s: %w", op, err)
	}
	return res, nil
}

// gap notes a reap of shard at now and reports whether it ends a gap in
// the shard's reaps longer than Options.ReapGap: an outage of the
// process or its host, which stopped the gateway's flushes as well, so
// that the coverage it has not written yet says nothing of its devices.
// Such an outage ends now (gapEnd): graces and silences count from it.
func (s *Store) gap(shard int, now int64) bool {
	last := s.reaped[shard]
	if now > last {
		s.reaped[shard] = now
	}
	if s.reapGap > 0 && last > 0 && now-last > s.reapGap {
		s.gapEnd[shard] = now
		return true
	}
	return false
}

// gapFrom is the end of the last gap in shard's reaps, or now while one
// is under way (no reap for longer than Options.ReapGap); ok is false
// while there is none to count from.
func (s *Store) gapFrom(shard int, now int64) (from int64, ok bool) {
	if s.reapGap <= 0 {
		return 0, false
	}
	if last := s.reaped[shard]; last > 0 && now-last > s.reapGap {
		return now, true
	}
	return s.gapEnd[shard], s.gapEnd[shard] > 0
}

// next is the earliest deadline left in the shard but those waiting, and
// whether it is due; full says the reap stopped at its limit. With
// devices waiting it is at most a recheck from now: a due entry that a
// reap which did not stop at its limit left is behind more waiting
// devices than it looks at, and is looked at then.
func (w *writer) next(waiting map[string]bool, full bool) (time.Time, bool) {
	c := w.sh.exp.Cursor()
	k, _ := c.First()
	for k != nil && waiting[string(k)] {
		k, _ = c.Next()
	}
	var next int64
	more := false
	if k != nil {
		next, _, _ = parseExpKey(k)
		more = next <= w.now
	}
	if len(waiting) > 0 && !(more && full) {
		if recheck := w.now + w.s.recheck; next == 0 || more || next > recheck {
			next, more = recheck, false
		}
	}
	if next == 0 {
		return time.Time{}, false
	}
	return msTime(next), more
}

// reap handles the due index entry k; it reports whether the device kept
// a live session (trimmed, no event), or waits for its gateway's coverage
// (nothing changed).
func (w *writer) reap(k []byte) (trimmed, wait bool, err error) {
	ms, d, ok := parseExpKey(k)
	if !ok {
		w.s.log.Warn("dropping malformed deadline index key", "shard", w.sh.n, "key", fmt.Sprintf("%x", k))
		return false, false, w.sh.exp.Delete(k)
	}
	e, err := w.load(d)
	if err != nil {
		return false, false, err
	}
	if !e.exists || e.deadline != ms {
		// Not the record's entry: the index is repaired, never trusted.
		w.s.log.Warn("dropping stale deadline index entry", "shard", w.sh.n, "device", d, "deadline", ms)
		return false, false, w.sh.exp.Delete(k)
	}
	reason := gateway.ReasonExpired
	if w.s.grace > 0 && e.rec.online {
		wait, own, err := w.waitFor(&e.rec)
		if err != nil {
			return false, false, err
		}
		// the wait lasts the grace; for a held leave (its session ends at
		// the leave's time, not a lease after the last evidence) waiting
		// for another gateway than the device's own (it may have moved
		// there, its connect held up by that gateway's outage), up to
		// that gateway's horizon
		span := w.s.grace
		if wait && !own && slices.ContainsFunc(e.rec.sessions, e.rec.leftAt) {
			span = max(span, w.s.horizon)
		}
		// the grace counts from the deadline, or from the end of a gap
		// in the reaps when that is later
		if wait && w.now < max(ms, w.s.gapEnd[w.sh.n])+span {
			return false, true, nil
		}
		if wait && own {
			// the grace is over: the device goes, lost with its gateway
			reason = gateway.ReasonGatewayLost
		}
	}
	trimmed, err = w.dropExpired(d, e, "", nil, reason, nil)
	return trimmed, false, err
}
