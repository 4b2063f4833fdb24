package uplink

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// The session ledger: the sessions this process holds, kept in a file of
// the state directory so that the next process of this gateway, after a
// crash (kill -9, a power cut that kept the disk), can still restore them
// when the store has lost its state (docs/design.md §2 "Restore after a
// loss"). The session table lives in memory: without the ledger, a device
// that stopped shortly before its gateway crashed is known to the store
// alone, and a store that then loses its state (a restart from an older
// snapshot, FLUSHALL) forgets that the device was online; no offline is
// ever written for it.
//
// The file (LedgerFile) is a header and a sequence of records, one per
// session, a later record of a session replacing an earlier one. It is
// written off the write path: the sessions whose connect the store
// accepted are appended every flush interval (no fsync: a process crash
// keeps what the kernel has), and the whole set (the table's restorable
// sessions and the inherited ones still kept) is rewritten every
// ledgerPeriod and when the uplink stops, into a temporary file that is
// fsynced and renamed over it. A reader stops at the first record that is
// short or fails its checksum (an append torn by a crash). It is not in
// the bbolt state file: rewriting 100,000 sessions there took 216 ms and
// 84 MB of allocations each time; encoded into one buffer (made as
// large as the last one) and written as a file, 40–64 ms (the table's
// walk included) and 4 MB (BenchmarkLedgerRewrite100k).

// LedgerFile is the ledger's file name in the state directory.
const LedgerFile = "fleetgate.sessions"

// ledgerPeriod is how often the ledger is rewritten: a quarter lease, so
// that a session's recorded deadline trails its real one by little.
func ledgerPeriod(lease time.Duration) time.Duration { return max(lease/4, time.Second) }

// maxLedgerAdds bounds the accepted connects waiting for the next append;
// beyond it they are left to the next rewrite (counted).
const maxLedgerAdds = 1 << 16

// The file: the header "fleetgate sessions\n" and the format byte, then
// records (format 1), each a type (1 byte), the payload's length (u16),
// the payload, and a CRC-32C (Castagnoli) of the three (4). Type 'S', a
// session: its key (device 0x00 session), then last seen, deadline,
// recorded at (Unix nanoseconds, 8 each) and stale by (nanoseconds, 8).
// Type 'I', a shard's incarnation this gateway had restored its sessions
// on (gateway.ApplyResult.Incarnation): the shard (u16) and the name.
// Integers big endian.
const (
	ledgerMagic      = "fleetgate sessions\n"
	ledgerFormat     = 1
	ledgerSession    = 'S'
	ledgerIncarnated = 'I'
	ledgerValueLen   = 32
	ledgerMaxPayload = 4 * 1024
)

var crcTable = crc32.MakeTable(crc32.Castagnoli)

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

// appendFramed appends a record of type typ whose payload put appends.
func appendFramed(b []byte, typ byte, put func([]byte) []byte) []byte {
	start := len(b)
	b = append(b, typ, 0, 0)
	b = put(b)
	binary.BigEndian.PutUint16(b[start+1:], uint16(len(b)-start-3))
	return binary.BigEndian.AppendUint32(b, crc32.Checksum(b[start:], crcTable))
}

// appendRecord appends the record of session k to b.
func appendRecord(b []byte, k key, r ledgerRecord) []byte {
	return appendFramed(b, ledgerSession, func(b []byte) []byte {
		b = append(b, k.device...)
		b = append(b, 0)
		b = append(b, k.session...)
		b = binary.BigEndian.AppendUint64(b, uint64(r.LastSeen.UnixNano()))
		b = binary.BigEndian.AppendUint64(b, uint64(r.Deadline.UnixNano()))
		b = binary.BigEndian.AppendUint64(b, uint64(r.RecordedAt.UnixNano()))
		return binary.BigEndian.AppendUint64(b, uint64(r.StaleBy))
	})
}

// appendIncarnation appends the record of shard's incarnation to b.
func appendIncarnation(b []byte, shard int, inc string) []byte {
	return appendFramed(b, ledgerIncarnated, func(b []byte) []byte {
		return append(binary.BigEndian.AppendUint16(b, uint16(shard)), inc...)
	})
}

var errBadLedger = errors.New("uplink: bad session ledger")

// ledgerContent is what a ledger file holds: its sessions, a later record
// of a session replacing an earlier one, in the order first recorded, and
// the incarnation of each shard it names.
type ledgerContent struct {
	order        []key
	sessions     map[key]ledgerRecord
	incarnations map[int]string
}

// readLedger reads a ledger file from r. It stops at the end, or at the
// first record that is short or damaged (torn: that and what follows is
// reported, not an error); a file without the header is an error.
func readLedger(r io.Reader) (c ledgerContent, torn bool, err error) {
	c = ledgerContent{sessions: map[key]ledgerRecord{}, incarnations: map[int]string{}}
	br := bufio.NewReader(r)
	head := make([]byte, len(ledgerMagic)+1)
	if _, err := io.ReadFull(br, head); err != nil || string(head[:len(ledgerMagic)]) != ledgerMagic || head[len(ledgerMagic)] != ledgerFormat {
		return c, false, fmt.Errorf("%w: no header of format %d", errBadLedger, ledgerFormat)
	}
	buf := make([]byte, 0, 3+ledgerMaxPayload+4)
	for {
		buf = buf[:3]
		if _, err := io.ReadFull(br, buf); err == io.EOF {
			return c, false, nil
		} else if err != nil {
			return c, true, nil
		}
		n := int(binary.BigEndian.Uint16(buf[1:]))
		if n > ledgerMaxPayload {
			return c, true, nil
		}
		buf = buf[:3+n+4]
		if _, err := io.ReadFull(br, buf[3:]); err != nil {
			return c, true, nil
		}
		if crc32.Checksum(buf[:3+n], crcTable) != binary.BigEndian.Uint32(buf[3+n:]) {
			return c, true, nil
		}
		if !c.add(buf[0], buf[3:3+n]) {
			return c, true, nil
		}
	}
}

// add takes one record whose checksum held; false if it makes no sense.
func (c *ledgerContent) add(typ byte, p []byte) bool {
	switch typ {
	case ledgerSession:
		if len(p) < ledgerValueLen+2 {
			return false
		}
		dev, sess, ok := bytes.Cut(p[:len(p)-ledgerValueLen], []byte{0})
		v := p[len(p)-ledgerValueLen:]
		at := func(i int) time.Time { return time.Unix(0, int64(binary.BigEndian.Uint64(v[i:]))) }
		rec := ledgerRecord{LastSeen: at(0), Deadline: at(8), RecordedAt: at(16), StaleBy: time.Duration(binary.BigEndian.Uint64(v[24:]))}
		if !ok || len(dev) == 0 || rec.Deadline.Before(rec.LastSeen) || rec.StaleBy < 0 {
			return false
		}
		k := key{gateway.DeviceID(dev), gateway.SessionID(sess)}
		if _, seen := c.sessions[k]; !seen {
			c.order = append(c.order, k)
		}
		c.sessions[k] = rec
	case ledgerIncarnated:
		if len(p) < 3 {
			return false
		}
		c.incarnations[int(binary.BigEndian.Uint16(p))] = string(p[2:])
	default:
		return false
	}
	return true
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

// Ledger is the session ledger of one state directory (OpenLedger).
type Ledger struct {
	path string
	// incs are the incarnations the previous process had restored its
	// sessions on, by shard (Incarnations).
	incs map[int]string
	// last is the newest record the previous process wrote (Last).
	last time.Time

	mu   sync.Mutex
	held []heldSession
	adds []heldSession
	// lost counts accepted connects not added (over maxLedgerAdds).
	lost int
	// size is the length of the last rewrite: the next one's buffer is
	// made an eighth larger at once (a table that grew a little does not
	// make append copy it). The buffer itself is not kept between
	// rewrites: at 20,000 sessions it is 1.4 MB (68 B a session) that the
	// collector would count live, and give as much again of headroom.
	size int
}

// OpenLedger reads the sessions a previous process of this gateway
// recorded in path, at opened: they are restored with this process's own
// after a loss, until keepLapsed after their latest possible deadline
// (heldDeadline). It then writes the file afresh with them, so that it
// exists and is whole before anything is appended. A missing file holds
// none; damaged reports a file whose header or tail could not be read
// (its records from there on are lost); err is an error of reading or
// writing the file.
func OpenLedger(path string, opened time.Time, keepLapsed time.Duration) (l *Ledger, damaged bool, err error) {
	l = &Ledger{path: path}
	f, err := os.Open(path)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return nil, false, fmt.Errorf("uplink: open ledger: %w", err)
	default:
		c, torn, rerr := readLedger(f)
		f.Close()
		for _, k := range c.order {
			r := c.sessions[k]
			if r.RecordedAt.After(l.last) {
				l.last = r.RecordedAt
			}
			dl := heldDeadline(r, opened)
			l.held = append(l.held, heldSession{
				view: gateway.SessionView{Device: k.device, Session: k.session, LastSeen: r.LastSeen, LastSent: r.LastSeen, Deadline: dl},
				keep: dl.Add(keepLapsed),
				rec:  r,
			})
		}
		l.incs = c.incarnations
		damaged = torn || rerr != nil
	}
	if err := l.rewrite(opened, 0, nil, l.incs); err != nil {
		return nil, damaged, err
	}
	return l, damaged, nil
}

// Incarnations are, by shard, the incarnations of the store's state on
// which the previous process had restored its sessions (or found nothing
// to restore). A shard that names another at this process's first call
// has lost or replaced its state since: the restore is due, though the
// store reported the change (gateway.ApplyResult.Reset) to that process,
// if to any.
func (l *Ledger) Incarnations() map[int]string { return maps.Clone(l.incs) }

// Last is when the previous process last wrote a record of its
// sessions (it rewrites them every quarter lease, and at shutdown): about
// when it last ran. Zero when the ledger held none.
func (l *Ledger) Last() time.Time { return l.last }

// Inherited is the number of sessions held from the ledger and the
// outbox's replays.
func (l *Ledger) Inherited() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.held)
}

// add records sessions whose connect the store accepted (their records
// made) for the next append, and keeps held as held (not in the table).
func (l *Ledger) add(adds, held []heldSession) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.held = append(l.held, held...)
	if n := maxLedgerAdds - len(l.adds); n < len(adds) {
		l.lost += len(adds) - max(n, 0)
		adds = adds[:max(n, 0)]
	}
	l.adds = append(l.adds, adds...)
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

// writeAdds appends the sessions added since the last write to the file
// (made by a rewrite first, if need be). It returns how many it wrote,
// and how many were not added (over the bound) since the last call.
func (l *Ledger) writeAdds() (int, int, error) {
	l.mu.Lock()
	adds, lost := l.adds, l.lost
	l.adds, l.lost = nil, 0
	l.mu.Unlock()
	if len(adds) == 0 {
		return 0, lost, nil
	}
	var b []byte
	for _, h := range adds {
		b = appendRecord(b, key{h.view.Device, h.view.Session}, h.rec)
	}
	f, err := os.OpenFile(l.path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return 0, lost, fmt.Errorf("uplink: ledger: %w (until the next rewrite)", err)
	}
	_, err = f.Write(b)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return 0, lost, fmt.Errorf("uplink: ledger: %w", err)
	}
	return len(adds), lost, nil
}

// rewrite replaces the ledger with the incarnations incs, the held
// sessions kept at now, as they were recorded, and the sessions each yields of which a write was
// accepted or handed to the uplink (SessionView.LastSent: the table's
// restorable ones), recorded at now; the adds pending are in it already
// (a connect accepted is in the table or held). The records are encoded
// into one buffer (no file I/O while each runs: it may hold the table's
// locks), then written to a temporary file, fsynced and renamed over the
// ledger.
func (l *Ledger) rewrite(now time.Time, staleBy time.Duration, each func(fn func(gateway.SessionView) bool), incs map[int]string) error {
	l.mu.Lock()
	l.adds, l.lost = nil, 0
	l.held = slices.DeleteFunc(l.held, func(h heldSession) bool { return !h.keep.After(now) })
	b := append(make([]byte, 0, l.size+l.size/8), ledgerMagic...)
	b = append(b, ledgerFormat)
	for _, shard := range slices.Sorted(maps.Keys(incs)) {
		b = appendIncarnation(b, shard, incs[shard])
	}
	// held first: of a session both held and in the table, the table's
	// record comes later and wins
	for _, h := range l.held {
		b = appendRecord(b, key{h.view.Device, h.view.Session}, h.rec)
	}
	l.mu.Unlock()
	if each != nil {
		each(func(v gateway.SessionView) bool {
			if !v.LastSent.IsZero() {
				b = appendRecord(b, key{v.Device, v.Session}, ledgerRecord{LastSeen: v.LastSeen, Deadline: v.Deadline, RecordedAt: now, StaleBy: staleBy})
			}
			return true
		})
	}
	l.size = len(b)
	tmp := l.path + ".tmp"
	err := writeSynced(tmp, b)
	if err == nil {
		err = os.Rename(tmp, l.path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return fmt.Errorf("uplink: ledger: %w", err)
	}
	return nil
}

// writeSynced writes b into a new file at path and fsyncs it.
func writeSynced(path string, b []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// ledgerConnects adds the connects of tws, which the store accepted, to
// the ledger. Those of a replay observed before this process started
// (its predecessor's, from the outbox) are held too: no table of this
// process holds them. This process's own sessions are its table's, which
// forgets the ones that left: held, they would outlive their goodbye.
func (u *Uplink) ledgerConnects(t timing, replayed bool, tws []timedWrite, now time.Time) {
	if u.ledger == nil {
		return
	}
	var adds, held []heldSession
	period := ledgerPeriod(t.lease)
	for _, tw := range tws {
		if tw.w.Kind != gateway.Connect {
			continue
		}
		dl := tw.at.Add(cmp.Or(tw.w.Lease, t.lease))
		h := heldSession{
			view: gateway.SessionView{Device: tw.w.Device, Session: tw.w.Session, LastSeen: tw.at, LastSent: tw.at, Deadline: dl},
			keep: dl.Add(period + u.keepLapsed(t)),
			rec:  ledgerRecord{LastSeen: tw.at, Deadline: dl, RecordedAt: now, StaleBy: period},
		}
		adds = append(adds, h)
		if replayed && tw.at.Before(u.started) {
			held = append(held, h)
		}
	}
	if len(adds) > 0 {
		u.ledger.add(adds, held)
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
// uplink stops) with the table's sessions a restore re-sends.
func (u *Uplink) rewriteLedger(now time.Time) error {
	if u.ledger == nil {
		return nil
	}
	return u.ledger.rewrite(now, ledgerPeriod(u.timing().lease), u.sessions, u.restoredIncarnations())
}

// noteIncarnations records the incarnation each applied batch met
// (shards[i], results[i]) and says which shards' state changed since the
// previous process restored on them: met at this process's first call
// there, another than the ledger names. It also marks restored the
// shards no restore is due on. Called with sendMu held.
func (u *Uplink) noteIncarnations(shards []int, incs []string) (changed []int) {
	u.incMu.Lock()
	defer u.incMu.Unlock()
	for i, s := range shards {
		inc := incs[i]
		if inc == "" {
			continue
		}
		if u.incs[s] == "" && u.restoredIncs[s] != "" && u.restoredIncs[s] != inc {
			changed = append(changed, s)
		}
		u.incs[s] = inc
	}
	return changed
}

// markRestored records, for each shard no restore is due on, that this
// gateway's sessions stand on its current incarnation. Called with
// sendMu held.
func (u *Uplink) markRestored(shards []int) {
	u.incMu.Lock()
	defer u.incMu.Unlock()
	for _, s := range shards {
		if !u.restoreDue[s] && u.incs[s] != "" {
			u.restoredIncs[s] = u.incs[s]
		}
	}
}

// restoredIncarnations is a copy of the incarnations restored on, by
// shard, for the ledger.
func (u *Uplink) restoredIncarnations() map[int]string {
	u.incMu.Lock()
	defer u.incMu.Unlock()
	m := make(map[int]string, len(u.restoredIncs))
	for s, inc := range u.restoredIncs {
		if inc != "" {
			m[s] = inc
		}
	}
	return m
}
