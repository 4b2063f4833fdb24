package uplink

import (
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	bolt "go.etcd.io/bbolt"
)

// The session ledger: the sessions this process holds, kept in the
// gateway's state file so that the next process of this gateway, after a
// crash (kill -9, a power cut that kept the disk), can still restore them
// when the store has lost its state (docs/design.md §2 "Restore after a
// loss"). The session table lives in memory: without the ledger, a device
// that stopped shortly before its gateway crashed is known to the store
// alone, and a store that then loses its state (a restart from an older
// snapshot, FLUSHALL) forgets that the device was online; no offline is
// ever written for it.
//
// sessions.held maps a session key (device 0x00 session) to a record
// (ledgerRecord). The ledger is written off the write path: the sessions
// whose connect the store accepted are added every flush interval, and
// the whole set (the table's restorable sessions and the inherited ones
// still kept) is rewritten every LedgerPeriod and when the uplink stops.
var bucketLedger = []byte("sessions.held")

// ledgerPeriod is how often the ledger is rewritten: a quarter lease, so
// that a session's recorded deadline trails its real one by little.
func ledgerPeriod(lease time.Duration) time.Duration { return max(lease/4, time.Second) }

// maxLedgerAdds bounds the accepted connects waiting for the next ledger
// write; beyond it they are left to the next rewrite (counted).
const maxLedgerAdds = 1 << 16

// A ledger record (format 1) is: version (1 byte), last seen (8), deadline
// (8), recorded at (8), stale by (8): Unix nanoseconds, big endian, but
// the last, a duration in nanoseconds.
const (
	ledgerFormat    = 1
	ledgerRecordLen = 33
)

// ledgerRecord is one session of the ledger.
type ledgerRecord struct {
	// LastSeen and Deadline are the session's newest evidence the writer
	// knew of and its deadline.
	LastSeen, Deadline time.Time
	// RecordedAt is when the record was written, and StaleBy how much
	// later the next one was due: evidence after RecordedAt+StaleBy
	// would be in a newer record.
	RecordedAt time.Time
	StaleBy    time.Duration
}

func (r ledgerRecord) encode() []byte {
	b := make([]byte, ledgerRecordLen)
	b[0] = ledgerFormat
	binary.BigEndian.PutUint64(b[1:], uint64(r.LastSeen.UnixNano()))
	binary.BigEndian.PutUint64(b[9:], uint64(r.Deadline.UnixNano()))
	binary.BigEndian.PutUint64(b[17:], uint64(r.RecordedAt.UnixNano()))
	binary.BigEndian.PutUint64(b[25:], uint64(r.StaleBy))
	return b
}

var errBadLedgerRecord = errors.New("uplink: bad ledger record")

func decodeLedgerRecord(b []byte) (ledgerRecord, error) {
	if len(b) != ledgerRecordLen || b[0] != ledgerFormat {
		return ledgerRecord{}, fmt.Errorf("%w: %d bytes, format %d", errBadLedgerRecord, len(b), firstByte(b))
	}
	at := func(i int) time.Time { return time.Unix(0, int64(binary.BigEndian.Uint64(b[i:]))) }
	r := ledgerRecord{LastSeen: at(1), Deadline: at(9), RecordedAt: at(17), StaleBy: time.Duration(binary.BigEndian.Uint64(b[25:]))}
	if r.Deadline.Before(r.LastSeen) || r.StaleBy < 0 {
		return ledgerRecord{}, fmt.Errorf("%w: deadline before evidence or negative staleness", errBadLedgerRecord)
	}
	return r, nil
}

func firstByte(b []byte) int {
	if len(b) == 0 {
		return -1
	}
	return int(b[0])
}

// heldDeadline is the latest deadline a session of a dead process's
// ledger can have had: its recorded one, or, when it was live at the
// record, its lease after the last moment evidence could have come
// without a newer record (the next record's time, or the successor's
// start, opened, whichever came first). A restore that assumes it reports
// the device offline no sooner than it could have been.
func heldDeadline(r ledgerRecord, opened time.Time) time.Time {
	if !r.Deadline.After(r.RecordedAt) {
		return r.Deadline
	}
	last := r.RecordedAt.Add(r.StaleBy)
	if opened.Before(last) {
		last = opened
	}
	if dl := last.Add(r.Deadline.Sub(r.LastSeen)); dl.After(r.Deadline) {
		return dl
	}
	return r.Deadline
}

// heldSession is a session this process holds without having it in its
// table: inherited from the ledger of its predecessor, or replayed from
// the outbox. keep is when it is dropped: KeepLapsed after its latest
// possible deadline.
type heldSession struct {
	view gateway.SessionView
	keep time.Time
	// rec is its record, written again as it is by each rewrite (the
	// session is not renewed here: its estimate stays its first).
	rec ledgerRecord
}

// Ledger is the session ledger of one state file (OpenLedger).
type Ledger struct {
	db *bolt.DB

	mu   sync.Mutex
	held []heldSession
	adds []heldSession
	// lost counts accepted connects not added (over maxLedgerAdds).
	lost int
}

// OpenLedger creates the ledger's bucket in db if needed and reads the
// sessions a previous process of this gateway recorded, at opened: they
// are restored with this process's own after a loss, until keepLapsed
// after their latest possible deadline (heldDeadline). A record that
// cannot be read is skipped and counted in the error-free result. The
// ledger does not own db.
func OpenLedger(db *bolt.DB, opened time.Time, keepLapsed time.Duration) (*Ledger, int, error) {
	l := &Ledger{db: db}
	bad := 0
	err := db.Update(func(tx *bolt.Tx) error {
		b, err := tx.CreateBucketIfNotExists(bucketLedger)
		if err != nil {
			return err
		}
		return b.ForEach(func(k, v []byte) error {
			dev, sess, ok := bytes.Cut(k, []byte{0})
			r, err := decodeLedgerRecord(v)
			if !ok || err != nil {
				bad++
				return nil
			}
			dl := heldDeadline(r, opened)
			l.held = append(l.held, heldSession{
				view: gateway.SessionView{Device: gateway.DeviceID(dev), Session: gateway.SessionID(sess),
					LastSeen: r.LastSeen, LastSent: r.LastSeen, Deadline: dl},
				keep: dl.Add(keepLapsed),
				rec:  r,
			})
			return nil
		})
	})
	if err != nil {
		return nil, 0, fmt.Errorf("uplink: open ledger: %w", err)
	}
	return l, bad, nil
}

// Inherited is the number of sessions held from the ledger and the
// outbox's replays.
func (l *Ledger) Inherited() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// add records sessions whose connect the store accepted (their records
// made), for the next write; hold also keeps them as held (replayed ones:
// not in the table).
func (l *Ledger) add(ss []heldSession, hold bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if hold {
		l.held = append(l.held, ss...)
	}
	if n := maxLedgerAdds - len(l.adds); n < len(ss) {
		l.lost += len(ss) - max(n, 0)
		ss = ss[:max(n, 0)]
	}
	l.adds = append(l.adds, ss...)
}

// heldAt returns the held sessions kept at now, dropping the others.
func (l *Ledger) heldAt(now time.Time) []gateway.SessionView {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = slices.DeleteFunc(l.held, func(h heldSession) bool { return !h.keep.After(now) })
	out := make([]gateway.SessionView, len(l.held))
	for i, h := range l.held {
		out[i] = h.view
	}
	return out
}

// writeAdds puts the sessions added since the last write in one
// transaction. It returns how many it wrote, and how many were not added
// (over the bound) since the last call.
func (l *Ledger) writeAdds() (int, int, error) {
	l.mu.Lock()
	adds, lost := l.adds, l.lost
	l.adds, l.lost = nil, 0
	l.mu.Unlock()
	if len(adds) == 0 {
		return 0, lost, nil
	}
	err := l.db.Update(func(tx *bolt.Tx) error {
		b := tx.Bucket(bucketLedger)
		for _, h := range adds {
			if err := b.Put(sessionKey(key{h.view.Device, h.view.Session}), h.rec.encode()); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return 0, lost, fmt.Errorf("uplink: ledger: %w", err)
	}
	return len(adds), lost, nil
}

// rewrite replaces the ledger, in one transaction, with views (the
// table's sessions a restore re-sends), recorded at now, and
// the held sessions kept at now, as they were recorded; the adds pending
// are in it already (a connect accepted is in the table or held).
func (l *Ledger) rewrite(now time.Time, staleBy time.Duration, views []gateway.SessionView) error {
	l.mu.Lock()
	l.adds, l.lost = nil, 0
	l.held = slices.DeleteFunc(l.held, func(h heldSession) bool { return !h.keep.After(now) })
	held := slices.Clone(l.held)
	l.mu.Unlock()
	type kv struct{ k, v []byte }
	kvs := make([]kv, 0, len(views)+len(held))
	for _, h := range held {
		kvs = append(kvs, kv{sessionKey(key{h.view.Device, h.view.Session}), h.rec.encode()})
	}
	for _, v := range views {
		r := ledgerRecord{LastSeen: v.LastSeen, Deadline: v.Deadline, RecordedAt: now, StaleBy: staleBy}
		kvs = append(kvs, kv{sessionKey(key{v.Device, v.Session}), r.encode()})
	}
	// in key order (bbolt fills its pages in sequence); of a session both
	// held and in the table, the table's
	slices.SortStableFunc(kvs, func(a, b kv) int { return bytes.Compare(a.k, b.k) })
	err := l.db.Update(func(tx *bolt.Tx) error {
		if err := tx.DeleteBucket(bucketLedger); err != nil && !errors.Is(err, bolt.ErrBucketNotFound) {
			return err
		}
		b, err := tx.CreateBucket(bucketLedger)
		if err != nil {
			return err
		}
		b.FillPercent = 1
		for _, e := range kvs {
			if err := b.Put(e.k, e.v); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("uplink: ledger: %w", err)
	}
	return nil
}

// ledgerConnects adds the connects of tws, which the store accepted, to
// the ledger; replayed ones (from the outbox: perhaps of a previous
// process, not in the table) are held too.
func (u *Uplink) ledgerConnects(t timing, replayed bool, tws []timedWrite, now time.Time) {
	if u.ledger == nil {
		return
	}
	var ss []heldSession
	period := ledgerPeriod(t.lease)
	for _, tw := range tws {
		if tw.w.Kind != gateway.Connect {
			continue
		}
		dl := tw.at.Add(cmp.Or(tw.w.Lease, t.lease))
		ss = append(ss, heldSession{
			view: gateway.SessionView{Device: tw.w.Device, Session: tw.w.Session, LastSeen: tw.at, LastSent: tw.at, Deadline: dl},
			keep: dl.Add(period + u.keepLapsed(t)),
			rec:  ledgerRecord{LastSeen: tw.at, Deadline: dl, RecordedAt: now, StaleBy: period},
		})
	}
	if len(ss) > 0 {
		u.ledger.add(ss, replayed)
	}
}

// keepLapsed is how long after its deadline a held session is restored:
// as long as the table keeps a lapsed one (2 × (lease + grace)).
func (u *Uplink) keepLapsed(t timing) time.Duration { return 2 * (t.lease + u.grace) }

// ledgerLoop writes the ledger until ctx ends: the connects accepted
// every flush interval, the whole set every ledgerPeriod.
func (u *Uplink) ledgerLoop(ctx context.Context) {
	if u.ledger == nil {
		return
	}
	next := u.clock.Now()
	for {
		t := u.timing()
		tm := u.clock.NewTimer(t.interval)
		select {
		case <-ctx.Done():
			tm.Stop()
			return
		case <-tm.C():
		}
		now := u.clock.Now()
		if !now.Before(next) {
			if err := u.rewriteLedger(now); err != nil {
				u.m.ledgerErrors.Inc()
				u.log.Warn("session ledger not written; a restore after a crash and a store loss may miss sessions", "err", err)
			}
			next = now.Add(ledgerPeriod(t.lease))
			continue
		}
		_, lost, err := u.ledger.writeAdds()
		if lost > 0 {
			u.m.ledgerErrors.Inc()
			u.log.Warn("session ledger: connects left to the next rewrite", "sessions", lost)
		}
		if err != nil {
			u.m.ledgerErrors.Inc()
			u.log.Warn("session ledger not written; a restore after a crash and a store loss may miss sessions", "err", err)
		}
	}
}

// rewriteLedger writes the whole ledger at now (ledgerLoop, and when the
// uplink stops): the table's sessions a restore re-sends (a write of
// them accepted, or handed to the uplink: SessionView.LastSent).
func (u *Uplink) rewriteLedger(now time.Time) error {
	if u.ledger == nil || u.sessions == nil {
		return nil
	}
	var views []gateway.SessionView
	u.sessions(func(v gateway.SessionView) bool {
		if !v.LastSent.IsZero() {
			views = append(views, v)
		}
		return true
	})
	return u.ledger.rewrite(now, ledgerPeriod(u.timing().lease), views)
}
