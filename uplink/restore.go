package uplink

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// restoreShards re-sends this gateway's sessions of the shards whose
// state the store lost or replaced (Options.Sessions), as renewals of
// their newest evidence in restore batches of at most MaxBatch writes:
// the live ones, and those that ran out recently (with their passed
// deadlines: the store may have lost them before it wrote their
// offline) of which a write had been accepted; and, after them, the
// leaves the store accepted recently (noteLeaves), of devices this
// process no longer knows: the store may have lost such a session
// before its leave's grace ran out and the reap wrote its offline, and a
// leave in a restore writes that offline (gateway.Batch.Restore) where
// no other gateway may still bring the device. Round k writes the k-th
// batch of every shard, all in one write call. A session with a connect
// still queued is left out: that connect, not a silent restore, must
// bring it online. A session whose leave is queued (it is gone from the
// table) is restored from the leave's observation, so that the leave
// still finds it and writes its offline. A failed batch is logged, its
// shard's later batches are not sent, and the shard stays due
// (restoreDue) until a whole restore of it has gone through: the next
// call it answers tries again (the sessions' renewals would write the
// live ones, but nothing would write the offline of a device that
// stopped). Called with sendMu held.
func (u *Uplink) restoreShards(ctx context.Context, t timing, shards []int) {
	if u.sessions == nil {
		return
	}
	want := make([]bool, u.shards)
	for _, s := range shards {
		want[s] = true
	}
	now := u.clock.Now()
	per := make(map[int][]timedWrite)
	n := 0
	queued := make(map[key]slot)
	for _, s := range shards {
		for _, it := range u.queues[s].peek() {
			queued[it.key] = it.slot
			if it.kind != gateway.Connect && !it.leave.IsZero() && now.Sub(it.leave) < t.lease {
				lease := cmp.Or(it.leaveLease, t.lease)
				per[s] = append(per[s], timedWrite{it.leave, gateway.Write{Device: it.device, Session: it.session, Kind: gateway.Renew, Lease: lease}})
				n++
			}
		}
	}
	lapsed, inherited := 0, 0
	// the devices this process knows (table or queue): their own sessions
	// speak for them, and a held session of theirs is not restored
	known := make(map[gateway.DeviceID]bool)
	for k := range queued {
		known[k.device] = true
	}
	restore := func(v gateway.SessionView) bool {
		s := gateway.ShardOf(v.Device, u.shards)
		sl, isQueued := queued[key{v.Device, v.Session}]
		live := v.Deadline.After(now)
		// its newest evidence, with the lease that holds it until the
		// session's deadline
		if want[s] && (live || !v.LastSent.IsZero()) && !(isQueued && (sl.kind == gateway.Connect || !sl.leave.IsZero())) {
			per[s] = append(per[s], timedWrite{v.LastSeen, gateway.Write{Device: v.Device, Session: v.Session, Kind: gateway.Renew,
				Lease: v.Deadline.Sub(v.LastSeen)}})
			n++
			if !live {
				lapsed++
			}
			return true
		}
		return false
	}
	u.sessions(func(v gateway.SessionView) bool {
		known[v.Device] = true
		restore(v)
		return true
	})
	if u.ledger != nil {
		// the sessions of a previous process (and its replayed ones) of
		// devices this process does not know: the store may have lost the
		// only record of a device that stopped before that process ended.
		// A device back on this gateway (a new session, perhaps its
		// connect still queued) is left to its own evidence: a held
		// session of it, lapsed, would recreate a record the reap could
		// end before that connect lands.
		for _, v := range u.ledger.heldAt(now) {
			if !known[v.Device] && restore(v) {
				inherited++
			}
		}
	}
	// last in each shard's writes: a device with a session restored
	// above is online before a leave of another of its sessions comes
	left := 0
	u.left = slices.DeleteFunc(u.left, func(l leftSession) bool { return !now.Before(l.keep) })
	for _, l := range u.left {
		if s := gateway.ShardOf(l.device, u.shards); want[s] && !known[l.device] {
			per[s] = append(per[s], timedWrite{l.at, gateway.Write{Device: l.device, Session: l.session, Kind: gateway.Leave, Lease: l.lease}})
			n++
			left++
		}
	}
	for _, s := range shards {
		// due until its last batch is acknowledged (none: done now)
		u.restoreDue[s] = len(per[s]) > 0
	}
	u.log.Warn("store lost or replaced this gateway's shards: restoring their sessions", "shards", shards, "sessions", n, "ran_out", lapsed, "inherited", inherited, "left", left)
	for len(per) > 0 {
		var ws []shardWrites
		for s, tws := range per {
			k := min(len(tws), t.maxBatch)
			ws = append(ws, shardWrites{shard: s, tws: tws[:k]})
		}
		for i, err := range u.write(ctx, t, restoreWrite, ws) {
			w := ws[i]
			if err != nil {
				u.log.Warn("restore failed", "shard", w.shard, "sessions", len(w.tws), "err", err)
				delete(per, w.shard)
				continue
			}
			u.m.restored.Add(float64(len(w.tws)))
			if rest := per[w.shard][len(w.tws):]; len(rest) > 0 {
				per[w.shard] = rest
			} else {
				delete(per, w.shard)
				u.restoreDue[w.shard] = false
			}
		}
	}
}

// leftSession is a leave the store accepted: its session, observed at,
// under lease (gateway.Write.Lease), restorable until keep.
type leftSession struct {
	device  gateway.DeviceID
	session gateway.SessionID
	at      time.Time
	lease   time.Duration
	keep    time.Time
}

// noteLeaves keeps the leaves of tws, which the store accepted, for a
// restore (restoreShards) until keepLapsed after their observation: the
// table forgot the session at its leave, and the store ends it only when
// the leave's grace has run out and the gateway's coverage has reached
// it, within lease + grace. The list is pruned when it has doubled
// since it last was. Called with sendMu held.
func (u *Uplink) noteLeaves(t timing, tws []timedWrite, now time.Time) {
	for _, tw := range tws {
		if tw.w.Kind == gateway.Leave {
			u.left = append(u.left, leftSession{device: tw.w.Device, session: tw.w.Session, at: tw.at,
				lease: cmp.Or(tw.w.Lease, t.lease), keep: tw.at.Add(u.keepLapsed(t))})
		}
	}
	if len(u.left) >= 2*max(u.leftPruned, 64) {
		u.left = slices.DeleteFunc(u.left, func(l leftSession) bool { return !now.Before(l.keep) })
		u.leftPruned = len(u.left)
	}
}
