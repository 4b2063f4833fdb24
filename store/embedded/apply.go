package embedded

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// Apply applies a batch whose devices all hash to shard, in one bolt
// transaction, with the semantics of gateway.Store. The batch is refused
// whole with gateway.ErrFenced when its epoch is older than the newest
// the file has seen for its gateway (on any shard), with
// gateway.ErrWrongShard when a device is not in shard.
func (s *Store) Apply(ctx context.Context, shard int, b gateway.Batch) (gateway.ApplyResult, error) {
	r := s.ApplyShards(ctx, []gateway.ShardBatch{{Shard: shard, Batch: b}})[0]
	return r.Result, r.Err
}

// ApplyShards applies the batches of several shards in one bolt
// transaction (one fsync), each with the semantics of Apply. A batch that
// is misrouted or fenced gets its error and the others are applied; an
// error of the file itself fails them all (the transaction rolls back).
func (s *Store) ApplyShards(ctx context.Context, batches []gateway.ShardBatch) []gateway.ShardResult {
	const op = "embedded: apply"
	out := make([]gateway.ShardResult, len(batches))
	valid := 0
	for i := range batches {
		sb := &batches[i]
		if err := s.checkShard(ctx, sb.Shard); err != nil {
			out[i].Err = fmt.Errorf("%s: %w", op, err)
		} else if err := s.checkBatch(sb.Shard, &sb.Batch); err != nil {
			out[i].Err = fmt.Errorf("%s: %w", op, err)
		} else {
			valid++
		}
	}
	if valid == 0 {
		return out
	}
	events := make([][]gateway.Event, len(batches))
	var inc string
	err := s.db.Update(func(tx *bolt.Tx) error {
		var err error
		if inc, err = makeIncarnation(tx); err != nil {
			return err
		}
		now := s.now()
		for i := range batches {
			sb := &batches[i]
			if out[i].Err != nil {
				continue
			}
			// counted from now, not from when the gateway computed them
			b := sb.Batch.AgedTo(now)
			if err := fence(tx, b.Gateway, b.Epoch); err != nil {
				if !errors.Is(err, gateway.ErrFenced) {
					return err
				}
				// "writer": the caller's logger names its own gateway
				s.log.Warn("batch fenced", "writer", b.Gateway, "epoch", b.Epoch, "shard", sb.Shard)
				out[i].Err = fmt.Errorf("%s: %w", op, err)
				continue
			}
			w, err := s.begin(tx, sb.Shard)
			if err != nil {
				return err
			}
			var cover int64
			if b.Covers {
				cover = w.now - b.CoverAge.Milliseconds()
			}
			if err := w.heard(b.Gateway, cover); err != nil {
				return err
			}
			bridged := bridgedLeaves(&b)
			for j := range b.Writes {
				if err := w.apply(&b, &b.Writes[j], bridged[j]); err != nil {
					return err
				}
			}
			if err := w.endLeavers(b.Gateway); err != nil {
				return err
			}
			if err := w.commit(); err != nil {
				return err
			}
			events[i] = w.events
		}
		return nil
	})
	for i := range out {
		switch {
		case out[i].Err != nil:
		case err != nil:
			out[i].Err = fmt.Errorf("%s: %w", op, err)
		default:
			out[i].Result = gateway.ApplyResult{Events: events[i], Incarnation: inc}
		}
	}
	return out
}

// Probe answers for every valid shard whose file can be read (the
// embedded store has no part that can be down while the others answer).
func (s *Store) Probe(ctx context.Context, shards []int) []error {
	out := make([]error, len(shards))
	read := s.db.View(func(*bolt.Tx) error { return nil })
	for i, sh := range shards {
		if err := cmp.Or(s.checkShard(ctx, sh), read); err != nil {
			out[i] = fmt.Errorf("embedded: probe: %w", err)
		}
	}
	return out
}

func (s *Store) checkBatch(shard int, b *gateway.Batch) error {
	if b.Gateway == "" {
		return errors.New("batch without gateway")
	}
	if b.Lease <= 0 {
		return fmt.Errorf("lease %v not positive", b.Lease)
	}
	for i, w := range b.Writes {
		if got := gateway.ShardOf(w.Device, s.shards); got != shard {
			return fmt.Errorf("write %d: device %s is in shard %d, not %d: %w", i, w.Device, got, shard, gateway.ErrWrongShard)
		}
		switch w.Kind {
		case gateway.Connect, gateway.Renew, gateway.Leave:
		default:
			return fmt.Errorf("write %d: device %s: unknown %v", i, w.Device, w.Kind)
		}
		if w.Session == "" {
			return fmt.Errorf("write %d: device %s: empty session", i, w.Device)
		}
		if w.Lease < 0 {
			return fmt.Errorf("write %d: device %s: lease %v negative", i, w.Device, w.Lease)
		}
	}
	return nil
}

// fence refuses an epoch older than the newest seen for gw and records a
// newer one.
func fence(tx *bolt.Tx, gw string, epoch uint64) error {
	b := tx.Bucket(bucketEpochs)
	if b == nil {
		return errors.New("epochs bucket missing")
	}
	key := []byte(gw)
	if v := b.Get(key); v != nil {
		newest, err := decodeU64(v)
		if err != nil {
			return fmt.Errorf("epoch of %s: %w", gw, err)
		}
		if epoch < newest {
			return fmt.Errorf("gateway %s epoch %d, newest seen %d: %w", gw, epoch, newest, gateway.ErrFenced)
		}
		if epoch == newest {
			return nil
		}
	}
	return b.Put(key, u64(epoch))
}

// bridgedLeaves says of each write of b whether it is a leave that a
// later write of the batch bridges: live evidence (its lease longer than
// its age) of another session of the same device, as when a device moved
// away and back while its gateway's writes waited in the outbox. Such a
// leave of the device's last session does not end the device at once:
// its offline waits for the end of the batch, where it is written only
// if no write brought the device a live session (the rule of
// lua/apply.lua).
func bridgedLeaves(b *gateway.Batch) []bool {
	out := make([]bool, len(b.Writes))
	// renewals alone (the steady state) need no more than this pass
	var leaving map[gateway.DeviceID]bool
	for _, wr := range b.Writes {
		if wr.Kind == gateway.Leave {
			if leaving == nil {
				leaving = make(map[gateway.DeviceID]bool)
			}
			leaving[wr.Device] = true
		}
	}
	if leaving == nil {
		return out
	}
	live := make(map[gateway.DeviceID]map[gateway.SessionID]bool)
	for j := len(b.Writes) - 1; j >= 0; j-- {
		wr := &b.Writes[j]
		if wr.Kind == gateway.Leave {
			for sid := range live[wr.Device] {
				if sid != wr.Session {
					out[j] = true
					break
				}
			}
			continue
		}
		if leaving[wr.Device] && wr.LeaseOr(b.Lease) > wr.Age {
			m := live[wr.Device]
			if m == nil {
				m = make(map[gateway.SessionID]bool)
				live[wr.Device] = m
			}
			m[wr.Session] = true
		}
	}
	return out
}

// apply applies one write (gateway.Store semantics, in order);
// leaveBridged is bridgedLeaves' for it.
func (w *writer) apply(b *gateway.Batch, wr *gateway.Write, leaveBridged bool) error {
	e, err := w.load(wr.Device)
	if err != nil {
		return err
	}
	// d = now − Age + Lease (the write's, else the batch's), at
	// millisecond precision; obs is when the evidence was observed.
	lease := wr.LeaseOr(b.Lease)
	d := time.UnixMilli(w.now).Add(lease - wr.Age).UnixMilli()
	obs := d - lease.Milliseconds()
	r := &e.rec
	// Evidence observed before its session's leave never brings the
	// session back (leave tombstones; the rule of lua/record.lua).
	if wr.Kind != gateway.Leave && r.tombed(wr.Session, obs, w.now) {
		return nil
	}
	// Late but valid evidence: a connect or renew observed at or before
	// its session's deadline extends that session even when the deadline
	// has passed by now (an outage delayed it): no offline, no online. A
	// replayed or coalesced write may be up to the gateway grace late, a
	// restore any late (see lua/apply.lua).
	var late gateway.SessionID
	var grace int64
	if b.Replay || wr.Coalesced {
		grace = w.s.grace
	}
	// a session that ran out before a gap in the reaps ended was never
	// judged while nothing ran: evidence of it up to the grace after the
	// gap is late but valid (reap.go, gap)
	gapFrom, gapped := w.s.gapFrom(w.sh.n, w.now)
	gapLate := func(deadline int64) bool { return gapped && deadline <= gapFrom && obs <= gapFrom+w.s.grace }
	if wr.Kind != gateway.Leave {
		if i := r.find(wr.Session); i >= 0 && r.sessions[i].deadline <= w.now && (b.Restore || obs <= r.sessions[i].deadline+grace || gapLate(r.sessions[i].deadline)) {
			late = wr.Session
		}
	}
	// evidence of another session observed by the deadline of the last
	// one that ran out bridges it: the device was never silent (a move
	// whose new gateway wrote late), no offline; a replayed or coalesced
	// write up to the grace after it (its older evidence, the connect
	// that came first, was merged away)
	bridged := func(deadline int64) bool {
		return wr.Kind != gateway.Leave && d > w.now && (obs <= deadline+grace || gapLate(deadline))
	}
	// an expired session waits (the reap judges it) while its gateway's
	// coverage, or that of another gateway heard within the horizon (the
	// device may have moved there), has not reached its deadline
	var holdErr error
	hold := func(x session) bool {
		if w.uncovered(x) {
			return true
		}
		wait, err := w.awaited(b.Gateway, x.deadline)
		holdErr = cmp.Or(holdErr, err)
		return wait
	}
	if _, err := w.dropExpired(wr.Device, e, late, hold, gateway.ReasonExpired, bridged); err != nil {
		return err
	}
	if holdErr != nil {
		return holdErr
	}
	switch wr.Kind {
	case gateway.Connect, gateway.Renew:
		if d <= w.now {
			// a restore of a session that ran out before the loss, whose
			// record the store lost: online again without an event, its
			// session ending now, for the reap to end (lua/apply.lua)
			if !b.Restore || e.exists || wr.Kind != gateway.Renew {
				// lapsed but late and valid evidence of a session the
				// online record still holds moves its passed deadline,
				// for the reap to judge with the true one (lua/apply.lua)
				if i := r.find(late); late != "" && r.online && i >= 0 && d > r.sessions[i].deadline {
					r.sessions[i].deadline = d
					e.dirty = true
				}
				return nil
			}
			d = w.now
		}
		// One rule in both stores (lua/apply.lua): evidence at least as
		// new as its session's takes the session (deadline, gateway,
		// epoch), older evidence changes nothing of it, and the device's
		// last writer is the write of its newest evidence.
		first := len(r.sessions) == 0 && !r.online // online with none left: bridged above
		newest := d >= r.deadline()
		if i := r.find(wr.Session); i < 0 {
			if len(r.sessions) >= gateway.MaxStoreSessions {
				return nil
			}
			r.sessions = append(r.sessions, session{id: wr.Session, deadline: d, gw: b.Gateway, epoch: b.Epoch})
			e.dirty = true
		} else if d >= r.sessions[i].deadline {
			r.sessions[i] = session{id: wr.Session, deadline: d, gw: b.Gateway, epoch: b.Epoch}
			e.dirty = true
		}
		if newest {
			w.touch(e, b.Gateway, wr.Session)
		}
		if first && b.Restore && !e.exists {
			// a restore of a record the store lost: online, no event, a
			// ver above the lost ones for the next (gateway.Batch.Restore)
			r.online, r.ver, r.since = true, nextVer(0, w.now, w.floor()), w.now
			e.exists, e.dirty = true, true
			return nil
		}
		if first {
			reason := gateway.ReasonConnect
			switch {
			case b.Replay:
				reason = gateway.ReasonReplay
			case wr.Kind == gateway.Renew:
				reason = gateway.ReasonRenew
			}
			return w.transition(wr.Device, e, true, reason, b.Gateway, wr.Session, 0)
		}
	case gateway.Leave:
		if b.Restore {
			return w.restoreLeave(wr, b, e, obs, leaveBridged)
		}
		i := r.find(wr.Session)
		if !e.exists || (i >= 0 && r.sessions[i].deadline > d) {
			return nil
		}
		// a leave of a session the record holds (not renewed since), or
		// of one it no longer holds: either way its tombstone stands
		r.entomb(wr.Session, obs, w.now-tombKeep.Milliseconds())
		e.dirty = true
		if i < 0 {
			return nil
		}
		if len(r.sessions) == 1 && r.online && leaveBridged {
			r.sessions = r.sessions[:0]
			w.touch(e, b.Gateway, wr.Session)
			w.leaving(wr.Device, wr.Session)
			return nil
		}
		if len(r.sessions) == 1 && r.online {
			wait, err := w.awaited(b.Gateway, obs)
			if err != nil {
				return err
			}
			if wait {
				// the device's last session leaves while another
				// gateway's coverage lags: it ends at the leave, as a
				// session that ran out there, for the reap to judge
				// behind that gateway (its tombstone names the offline a
				// leave, record.leftAt)
				r.sessions[0] = session{id: wr.Session, deadline: obs, gw: b.Gateway, epoch: b.Epoch}
				w.touch(e, b.Gateway, wr.Session)
				return nil
			}
		}
		r.sessions = append(r.sessions[:i], r.sessions[i+1:]...)
		w.touch(e, b.Gateway, wr.Session)
		if len(r.sessions) == 0 {
			return w.transition(wr.Device, e, false, gateway.ReasonLeave, b.Gateway, wr.Session, 0)
		}
	}
	return nil
}

// restoreLeave applies a leave a restore re-sends (gateway.Batch.Restore):
// one the store accepted before it lost or replaced its state. Where
// the record is online (the state kept the session, which ends by its
// own deadline, or another one) or offline since the leave was observed
// (its offline is there), it changes nothing. Where the record is gone,
// or offline since before the leave (an older state's record of an
// earlier visit), it writes the leave's offline with a ver above the
// lost ones; while another gateway's coverage lags (the device may have
// moved there), the record comes back online without an event, its
// session ending at the leave, for the reap to judge behind that
// gateway (lua/apply.lua).
func (w *writer) restoreLeave(wr *gateway.Write, b *gateway.Batch, e *entry, obs int64, bridged bool) error {
	r := &e.rec
	if e.exists && (r.online || r.since >= obs) {
		return nil
	}
	r.entomb(wr.Session, obs, w.now-tombKeep.Milliseconds())
	w.touch(e, b.Gateway, wr.Session)
	wait, err := w.awaited(b.Gateway, obs)
	if err != nil {
		return err
	}
	if !bridged && !wait {
		return w.transition(wr.Device, e, false, gateway.ReasonLeave, b.Gateway, wr.Session, 0)
	}
	r.online, r.ver, r.since, e.exists = true, nextVer(r.ver, w.now, w.floor()), w.now, true
	if bridged {
		w.leaving(wr.Device, wr.Session)
	} else {
		r.sessions = append(r.sessions[:0], session{id: wr.Session, deadline: obs, gw: b.Gateway, epoch: b.Epoch})
	}
	return nil
}

// touch records gw and sess as the device's last writer.
func (w *writer) touch(e *entry, gw string, sess gateway.SessionID) {
	e.rec.gw, e.rec.session = gw, sess
	e.dirty = true
}
