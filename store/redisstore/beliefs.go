package redisstore

import (
	"cmp"
	"encoding/binary"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/fleetgate/fleetgate/gateway"
)

// A belief is used for ten minutes after the store confirmed it (the
// apply script's BELIEF_TTL); then the device's next renewal reads its
// record again. The scripts keep invalidations for an hour (lua/reap.lua),
// far longer, so a belief young enough to be used has never missed one.
// Both ages are judged by the scripts on the store clock: a belief
// carries the store time of the reply that confirmed it, and a gateway
// whose own clock stood still (a suspended VM) cannot use one the store
// has outlived.

// beliefKey names the beliefs of one gateway process about one shard.
type beliefKey struct {
	shard   int
	gateway string
	epoch   uint64
}

// beliefs is what one gateway process knows, from the replies to its own
// apply calls, about the records of one shard: the devices whose record is
// steady for it (online, one session, written last by this process). A
// renewal of that session is sent as believed and the script moves the
// device's deadline without reading its record (lua/record.lua, "Beliefs").
//
// mu is held for a whole apply call: the replies must be applied in the
// order the calls ran. A gateway process (gateway, epoch) must write
// through one Store: the scripts report a process's own changes only to
// the caller, so a second Store with the same gateway and epoch would keep
// beliefs the first one made stale. (Each gateway process opens one; its
// epoch is its own, internal/identity.)
type beliefs struct {
	mu     sync.Mutex
	inc    string // the incarnation of the shard's state they were learned in
	steady map[gateway.DeviceID]belief
	// seen is the incarnation of the last successful call, kept across
	// forget (the calls of an outage fail): a reply of another one means
	// the shard's state was lost or replaced (ApplyResult.Reset).
	seen string
	// unreported is a reset seen by a call that then failed (its
	// replicas did not acknowledge it): the next successful call
	// reports it.
	unreported bool
}

type belief struct {
	session gateway.SessionID
	at      int64 // the store time (ms) of the reply that last confirmed it
}

// beliefSet holds the beliefs of every (shard, gateway, epoch) the store
// has applied batches for.
type beliefSet struct {
	mu  sync.Mutex
	all map[beliefKey]*beliefs
}

// get returns the beliefs of k, creating them; the caller locks them.
func (bs *beliefSet) get(k beliefKey) *beliefs {
	bs.mu.Lock()
	defer bs.mu.Unlock()
	if bs.all == nil {
		bs.all = make(map[beliefKey]*beliefs)
	}
	b := bs.all[k]
	if b == nil {
		b = &beliefs{steady: make(map[gateway.DeviceID]belief)}
		bs.all[k] = b
	}
	return b
}

// lockAll locks the beliefs of the batches, each once and in key order so
// that concurrent callers cannot deadlock, and returns them per batch and
// the unlock function. Batches that share a key (one shard twice in a
// call) get nil, are applied without beliefs, and the key's beliefs are
// dropped at unlock: their replies could be learned out of order.
func (bs *beliefSet) lockAll(batches []gateway.ShardBatch) ([]*beliefs, func()) {
	per := make([]*beliefs, len(batches))
	first := make(map[beliefKey]int, len(batches))
	var keys []beliefKey
	var repeated []*beliefs
	for i, sb := range batches {
		k := beliefKey{sb.Shard, sb.Batch.Gateway, sb.Batch.Epoch}
		j, seen := first[k]
		switch {
		case !seen:
			first[k] = i
			keys = append(keys, k)
			per[i] = bs.get(k)
		case per[j] != nil:
			repeated = append(repeated, per[j])
			per[j] = nil
		}
	}
	slices.SortFunc(keys, func(a, b beliefKey) int {
		return cmp.Or(cmp.Compare(a.shard, b.shard), cmp.Compare(a.gateway, b.gateway), cmp.Compare(a.epoch, b.epoch))
	})
	locked := make([]*beliefs, len(keys))
	for i, k := range keys {
		locked[i] = bs.get(k)
		locked[i].mu.Lock()
	}
	return per, func() {
		for _, b := range repeated {
			b.forget()
		}
		for _, b := range locked {
			b.mu.Unlock()
		}
	}
}

// believed marks the writes of a batch the script may take as believed
// renewals: unlapsed renewals of the session a fresh belief names, under
// the batch's lease, of a device none of whose other writes in the batch
// is anything else (a renewal with a lease of its own takes the general
// path of the script, which reads each write's lease). order
// has a byte per write, '1' for a believed one and '0' for the others; it
// is nil, and n 0, when none is. oldest is the store time the oldest
// belief used was confirmed at. b may be nil.
func (b *beliefs) believed(batch gateway.Batch) (order []byte, n int, oldest int64) {
	if b == nil || len(b.steady) == 0 {
		return nil, 0, 0
	}
	order = make([]byte, len(batch.Writes))
	var mixed map[gateway.DeviceID]bool
	for i, w := range batch.Writes {
		order[i] = '0'
		bl, found := b.steady[w.Device]
		switch {
		case !found:
		case w.Kind == gateway.Renew && bl.session == w.Session && w.LeaseOr(batch.Lease) == batch.Lease &&
			w.Age < batch.Lease &&
			strings.IndexByte(string(w.Device), '\n') < 0:
			order[i] = '1'
			n++
			// (a write demoted below may count here too: oldest is then
			// older than it needs to be, never younger)
			if oldest == 0 || bl.at < oldest {
				oldest = bl.at
			}
		default:
			if mixed == nil {
				mixed = make(map[gateway.DeviceID]bool)
			}
			mixed[w.Device] = true
		}
	}
	if mixed != nil {
		for i, w := range batch.Writes {
			if order[i] == '1' && mixed[w.Device] {
				order[i] = '0'
				n--
			}
		}
	}
	if n == 0 {
		return nil, 0, 0
	}
	return order, n, oldest
}

// learn applies an apply call's reply: the incarnation and the status
// pairs (device, session or "" to forget). A new incarnation voids every
// earlier belief. The beliefs keep the batch's own strings (those the
// session table holds), not the reply's copies.
func (b *beliefs) learn(inc string, status []any, writes []gateway.Write, now int64) (reset bool) {
	reset = b.unreported || b.seen != "" && b.seen != inc
	b.seen, b.unreported = inc, false
	if b.inc != inc {
		clear(b.steady)
		b.inc = inc
	}
	if len(status) == 0 {
		return reset
	}
	own := make(map[gateway.DeviceID]gateway.Write, len(writes))
	for _, w := range writes {
		own[w.Device] = w
	}
	for i := 0; i+1 < len(status); i += 2 {
		dev, sid := gateway.DeviceID(str(status[i])), str(status[i+1])
		// joinSessions separates sessions with "\n": one holding it is
		// never believed (device input never does, gateway.ParseSessionID)
		if sid == "" || strings.Contains(sid, "\n") {
			delete(b.steady, dev)
			continue
		}
		bl := belief{session: gateway.SessionID(sid), at: now}
		if w, ok := own[dev]; ok {
			dev = w.Device
			if w.Session == bl.session {
				bl.session = w.Session
			}
		}
		b.steady[dev] = bl
	}
	return reset
}

// forget drops every belief: after a call whose outcome is unknown (an
// error), or a fenced one.
func (b *beliefs) forget() {
	clear(b.steady)
	b.inc = ""
}

// joinSessions and joinDevices are the apply script's lists of the
// believed renewals' sessions and devices (the writes order marks '1'),
// "\n"-separated: no belief names a session holding one (learn), and
// believed passes no device holding one (device input never does,
// gateway.ParseDeviceID and ParseSessionID).
func joinSessions(writes []gateway.Write, order []byte, n int) string {
	return joinMarked(writes, order, n, func(w gateway.Write) string { return string(w.Session) })
}

func joinDevices(writes []gateway.Write, order []byte, n int) string {
	return joinMarked(writes, order, n, func(w gateway.Write) string { return string(w.Device) })
}

func joinMarked(writes []gateway.Write, order []byte, n int, field func(gateway.Write) string) string {
	var sb strings.Builder
	for i, w := range writes {
		if order[i] != '1' {
			continue
		}
		f := field(w)
		if sb.Len() == 0 {
			sb.Grow(n * (len(f) + 1))
		} else {
			sb.WriteByte('\n')
		}
		sb.WriteString(f)
	}
	return sb.String()
}

// packAges is the apply script's list of the believed renewals' ages: 4
// bytes big-endian each, in ms (believed ones are younger than the lease).
func packAges(writes []gateway.Write, order []byte, n int) string {
	b := make([]byte, 0, 4*n)
	for i, w := range writes {
		if order[i] == '1' {
			b = binary.BigEndian.AppendUint32(b, uint32(min(max(0, w.Age.Milliseconds()), math.MaxUint32)))
		}
	}
	return string(b)
}
