package embedded

import (
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
	err := s.db.Update(func(tx *bolt.Tx) error {
		for i := range batches {
			sb := &batches[i]
			if out[i].Err != nil {
				continue
			}
			if err := fence(tx, sb.Batch.Gateway, sb.Batch.Epoch); err != nil {
				if !errors.Is(err, gateway.ErrFenced) {
					return err
				}
				// "writer": the caller's logger names its own gateway
				s.log.Warn("batch fenced", "writer", sb.Batch.Gateway, "epoch", sb.Batch.Epoch, "shard", sb.Shard)
				out[i].Err = fmt.Errorf("%s: %w", op, err)
				continue
			}
			w, err := s.begin(tx, sb.Shard)
			if err != nil {
				return err
			}
			for j := range sb.Batch.Writes {
				if err := w.apply(&sb.Batch, &sb.Batch.Writes[j]); err != nil {
					return err
				}
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
			out[i].Result = gateway.ApplyResult{Events: events[i]}
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

// Reap handles at most limit due entries (deadline ≤ now) of shard in one
// bolt transaction: it drops their expired sessions and, for a device
// left with none, writes its offline event and removes its entry. Next is
// the earliest deadline left in the shard; More says whether it is due.
// A limit ≤ 0 handles nothing but still reports More and Next.
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
		var due [][]byte
		c := w.sh.exp.Cursor()
		for k, _ := c.First(); k != nil && len(due) < limit; k, _ = c.Next() {
			ms, _, ok := parseExpKey(k)
			if ok && ms > w.now {
				break
			}
			due = append(due, append([]byte(nil), k...))
		}
		for _, k := range due {
			trimmed, err := w.reap(k)
			if err != nil {
				return err
			}
			if trimmed {
				res.Trimmed++
			}
		}
		if err := w.commit(); err != nil {
			return err
		}
		res.Offline = w.events
		res.Now = msTime(w.now)
		if k, _ := w.sh.exp.Cursor().First(); k != nil {
			ms, _, _ := parseExpKey(k)
			res.Next = msTime(ms)
			res.More = ms <= w.now
		}
		return nil
	})
	if err != nil {
		return gateway.ReapResult{}, fmt.Errorf("%s: %w", op, err)
	}
	return res, nil
}

// writer is one write transaction on one shard: device records are read
// once, changed in memory and written back with their deadline index
// entries by commit; events are appended as they happen.
type writer struct {
	s       *Store
	sh      shard
	now     int64
	devices map[gateway.DeviceID]*entry
	order   []gateway.DeviceID
	tail    tail
	added   int
	events  []gateway.Event
}

// entry is a device record loaded by a writer.
type entry struct {
	rec      record
	exists   bool
	dirty    bool
	deadline int64 // the index entry at load time, 0 for none
}

func (s *Store) begin(tx *bolt.Tx, n int) (*writer, error) {
	sh, err := openShard(tx, n)
	if err != nil {
		return nil, err
	}
	t, err := decodeTail(sh.root.Get(keyTail))
	if err != nil {
		return nil, fmt.Errorf("shard %d tail: %w", n, err)
	}
	return &writer{s: s, sh: sh, now: s.nowMs(), devices: map[gateway.DeviceID]*entry{}, tail: t}, nil
}

func (w *writer) load(d gateway.DeviceID) (*entry, error) {
	if e, ok := w.devices[d]; ok {
		return e, nil
	}
	r, ok, err := w.sh.record(d)
	if err != nil {
		return nil, err
	}
	e := &entry{rec: r, exists: ok, deadline: r.deadline()}
	w.devices[d] = e
	w.order = append(w.order, d)
	return e, nil
}

// apply applies one write (gateway.Store semantics, in order).
func (w *writer) apply(b *gateway.Batch, wr *gateway.Write) error {
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
	// has passed by now (an outage delayed it): no offline, no online.
	var late gateway.SessionID
	if wr.Kind != gateway.Leave && d > w.now {
		// (a restore may be any late: see lua/apply.lua)
		if i := r.find(wr.Session); i >= 0 && r.sessions[i].deadline <= w.now && (b.Restore || obs <= r.sessions[i].deadline) {
			late = wr.Session
		}
	}
	if _, err := w.dropExpired(wr.Device, e, late); err != nil {
		return err
	}
	switch wr.Kind {
	case gateway.Connect, gateway.Renew:
		if d <= w.now {
			return nil
		}
		// One rule in both stores (lua/apply.lua): evidence at least as
		// new as its session's takes the session (deadline, gateway,
		// epoch), older evidence changes nothing of it, and the device's
		// last writer is the write of its newest evidence.
		first := len(r.sessions) == 0
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
			r.online, r.ver, r.since = true, uint64(w.now), w.now
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
		r.sessions = append(r.sessions[:i], r.sessions[i+1:]...)
		w.touch(e, b.Gateway, wr.Session)
		if len(r.sessions) == 0 {
			return w.transition(wr.Device, e, false, gateway.ReasonLeave, b.Gateway, wr.Session, 0)
		}
	}
	return nil
}

// touch records gw and sess as the device's last writer.
func (w *writer) touch(e *entry, gw string, sess gateway.SessionID) {
	e.rec.gw, e.rec.session = gw, sess
	e.dirty = true
}

// dropExpired drops the sessions whose deadline is ≤ now, except keep
// (a session late but valid evidence is about to extend; "" for none);
// when that ends an online device's last session it writes the offline
// event (reason expired) at the old deadline. It reports whether a
// session was left.
func (w *writer) dropExpired(d gateway.DeviceID, e *entry, keep gateway.SessionID) (bool, error) {
	r := &e.rec
	if len(r.sessions) == 0 {
		return false, nil
	}
	last := r.sessions[0]
	for _, x := range r.sessions {
		if x.deadline > last.deadline {
			last = x
		}
	}
	kept := r.sessions[:0]
	for _, x := range r.sessions {
		if x.deadline > w.now || (keep != "" && x.id == keep) {
			kept = append(kept, x)
		}
	}
	if len(kept) == len(r.sessions) {
		return true, nil
	}
	clear(r.sessions[len(kept):])
	r.sessions = kept
	e.dirty = true
	if len(kept) == 0 && r.online {
		return false, w.transition(d, e, false, gateway.ReasonExpired, last.gw, last.id, last.deadline)
	}
	return len(kept) > 0, nil
}

// nextVer is the ver of a device's next transition at now: the store
// time in ms for its first (so that a record lost with the file starts
// above every ver it handed out, as in the Redis store), else one more.
func nextVer(ver uint64, now int64) uint64 {
	if ver == 0 {
		return uint64(now)
	}
	return ver + 1
}

// transition moves the device to online or offline and appends the event.
func (w *writer) transition(d gateway.DeviceID, e *entry, online bool, reason gateway.Reason, gw string, sess gateway.SessionID, deadline int64) error {
	r := &e.rec
	r.online = online
	r.ver = nextVer(r.ver, w.now)
	r.since = w.now
	e.exists, e.dirty = true, true
	ev := gateway.Event{
		Shard:    w.sh.n,
		Device:   d,
		State:    gateway.Offline,
		Ver:      r.ver,
		At:       time.UnixMilli(w.now),
		Reason:   reason,
		Gateway:  gw,
		Session:  sess,
		Deadline: msTime(deadline),
	}
	if online {
		ev.State = gateway.Online
	}
	id := w.tail.last.next(w.now)
	ev.ID = id.String()
	if err := w.sh.ev.Put(id.key(), encodeEvent(&ev)); err != nil {
		return fmt.Errorf("append event: %w", err)
	}
	w.tail.last = id
	w.tail.count++
	w.added++
	w.events = append(w.events, ev)
	return nil
}

// reap handles the due index entry k; it reports whether the device kept
// a live session (trimmed, no event).
func (w *writer) reap(k []byte) (bool, error) {
	ms, d, ok := parseExpKey(k)
	if !ok {
		w.s.log.Warn("dropping malformed deadline index key", "shard", w.sh.n, "key", fmt.Sprintf("%x", k))
		return false, w.sh.exp.Delete(k)
	}
	e, err := w.load(d)
	if err != nil {
		return false, err
	}
	if !e.exists || e.deadline != ms {
		// Not the record's entry: the index is repaired, never trusted.
		w.s.log.Warn("dropping stale deadline index entry", "shard", w.sh.n, "device", d, "deadline", ms)
		return false, w.sh.exp.Delete(k)
	}
	return w.dropExpired(d, e, "")
}

// commit writes the changed records, moves their deadline index entries
// and the shard's event log tail, and trims the log.
func (w *writer) commit() error {
	for _, d := range w.order {
		e := w.devices[d]
		if !e.dirty || !e.exists {
			continue
		}
		if err := w.sh.dev.Put([]byte(d), encodeRecord(&e.rec)); err != nil {
			return fmt.Errorf("device %s: %w", d, err)
		}
		if nd := e.rec.deadline(); nd != e.deadline {
			if e.deadline != 0 {
				if err := w.sh.exp.Delete(expKey(e.deadline, d)); err != nil {
					return fmt.Errorf("device %s: index: %w", d, err)
				}
			}
			if nd != 0 {
				if err := w.sh.exp.Put(expKey(nd, d), nil); err != nil {
					return fmt.Errorf("device %s: index: %w", d, err)
				}
			}
			e.deadline = nd
		}
	}
	if w.added == 0 {
		return nil
	}
	if err := w.trim(); err != nil {
		return fmt.Errorf("trim events: %w", err)
	}
	w.sh.root.Tx().OnCommit(w.s.wake.signal)
	return w.sh.root.Put(keyTail, w.tail.encode())
}

// trim removes the oldest events beyond the cap: at most a bounded number
// per transaction, so a cap lowered between runs is reached over several
// writes rather than in one long transaction.
func (w *writer) trim() error {
	budget := w.added + 1024
	c := w.sh.ev.Cursor()
	var last []byte
	for k, _ := c.First(); k != nil && w.tail.count > w.s.maxLen && budget > 0; k, _ = c.First() {
		last = append(last[:0], k...)
		if err := c.Delete(); err != nil {
			return err
		}
		w.tail.count--
		budget--
	}
	if last != nil {
		// the newest trimmed ID: readers after an older one have a gap
		return w.sh.root.Put(keyTrimmed, last)
	}
	return nil
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

// AcquireShard takes or extends the runner lease of shard for owner until
// now + ttl on the store clock; it reports false when another owner
// holds an unexpired lease.
func (s *Store) AcquireShard(ctx context.Context, shard int, owner string, ttl time.Duration) (bool, error) {
	const op = "embedded: acquire shard"
	if err := s.checkShard(ctx, shard); err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	if owner == "" || ttl <= 0 {
		return false, fmt.Errorf("%s: owner %q, ttl %v: want an owner and a positive ttl", op, owner, ttl)
	}
	var ok bool
	err := s.db.Update(func(tx *bolt.Tx) error {
		sh, err := openShard(tx, shard)
		if err != nil {
			return err
		}
		ok, err = s.takeLock(sh, keyLock, owner, ttl)
		return err
	})
	if err != nil {
		return false, fmt.Errorf("%s: %w", op, err)
	}
	return ok, nil
}

// takeLock takes or extends the lease under key of sh for owner, for ttl
// on the store clock; false when another owner holds it unexpired.
func (s *Store) takeLock(sh shard, key []byte, owner string, ttl time.Duration) (bool, error) {
	now := time.UnixMilli(s.nowMs())
	if holder, until, held := readLock(sh.root.Get(key)); held && holder != owner && until.After(now) {
		return false, nil
	}
	return true, sh.root.Put(key, append(u64(uint64(now.Add(ttl).UnixMilli())), owner...))
}

// ReleaseShard gives up owner's lease of shard (no-op if not held).
func (s *Store) ReleaseShard(ctx context.Context, shard int, owner string) error {
	return s.releaseLock(ctx, "embedded: release shard", shard, keyLock, owner)
}

// releaseLock deletes the lease under key of shard if owner holds it.
func (s *Store) releaseLock(ctx context.Context, op string, shard int, key []byte, owner string) error {
	if err := s.checkShard(ctx, shard); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	err := s.db.Update(func(tx *bolt.Tx) error {
		sh, err := openShard(tx, shard)
		if err != nil {
			return err
		}
		if holder, _, held := readLock(sh.root.Get(key)); held && holder == owner {
			return sh.root.Delete(key)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	return nil
}

func readLock(v []byte) (owner string, until time.Time, ok bool) {
	if len(v) < 8 {
		return "", time.Time{}, false
	}
	exp, _ := decodeU64(v[:8])
	return string(v[8:]), time.UnixMilli(int64(exp)), true
}
