package embedded

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/statefile"
	bolt "go.etcd.io/bbolt"
)

// On-disk format (schema 1). All integers named "u64" are 8-byte
// big-endian; "uv" is an unsigned varint (encoding/binary); "str" is a uv
// length followed by that many bytes. Times are milliseconds since the
// Unix epoch on the store clock.
//
// Top-level buckets, all prefixed "store." so that they share the
// gateway's bbolt file with its epoch and outbox:
//
//	store.meta           "shards" → u64, "schema" → u64
//	store.epochs         gateway ID → u64 newest epoch seen (fencing)
//	store.shard.<n>      one per shard n, holding the keys and nested
//	                     buckets below
//
// In store.shard.<n>:
//
//	"tail"  u64 ms, u64 seq of the last event ID; u64 events in the log
//	"lock"  u64 lease expiry ms, then the owner's bytes (runner lock)
//	"verfloor"  u64 the highest ver of a device forgotten in the shard
//	        (absent: 0); a device seen anew starts above it (forget.go)
//	"cover.<gateway>"  u64 ms the gateway's coverage on this shard
//	        (gateway.Batch.Covers: the latest any of its batches reported,
//	        0 for none), u64 ms its last batch (its contact)
//	"counts"  u64 online records, u64 offline records (Store.Counts;
//	        from state file format 4)
//	"sessions.<gateway>"  u64 the shard's live sessions of the gateway
//	        (from state file format 6; index.go)
//	dev/    device ID → device record
//	exp/    u64 deadline ms ‖ device ID → empty (deadline index: a cursor
//	        walk from the first key finds the due entries in order)
//	chg/    byte state ‖ u64 since ‖ device ID → empty (every record by
//	        its last change; from state file format 6; index.go)
//	ev/     u64 ms ‖ u64 seq → event (the event ID is "<ms>-<seq>")
//
// Device record:
//
//	byte format (2), byte state (0 offline, 1 online), uv ver, uv since,
//	str last gateway, str last session, uv session count, then per
//	session: str session ID, uv deadline, str gateway, uv epoch; then
//	uv tombstone count, then per leave tombstone: str session ID, uv the
//	time its leave was observed. Format 1 is the same without the
//	tombstones (read as none).
//
// The device's deadline is the max over its sessions; it is in exp/ iff
// it has a session, and it has a session iff it is online.
//
// Event:
//
//	byte format (1), str device, byte state (0 offline, 1 online,
//	2 removed: written from state file format 5 on), uv ver, uv at,
//	byte reason (1 connect, 2 renew, 3 leave, 4 expired, 5 replay,
//	6 gateway_lost: written from state file format 3 on; 7 forget:
//	from format 5 on),
//	str gateway, str session, uv deadline (0 unless reason expired)
//
// Gateway event (shard 0 only, from state file format 4):
//
//	byte format (2), str gateway, byte state (0 lost, 1 back), uv ver,
//	uv at, uv contact
//
// Migrations are the embedded store's changes of the state file format
// (internal/statefile): format 3 lets its events carry reason
// gateway_lost, which a release that reads up to format 2 cannot decode,
// so that such a release refuses the file rather than fail on the event;
// format 4 counts each shard's records by state ("counts"), which a
// release that reads up to format 3 would not move, and lets shard 0's
// log hold gateway events, which it cannot decode; format 5 lets the
// events be removed events of forgotten devices; format 6 indexes each
// shard's records by last change and counts its sessions per gateway
// (index.go), which a release that reads up to format 5 would not move.
var Migrations = []statefile.Migration{
	{To: 3, What: "embedded store events may carry reason gateway_lost", Run: func(*bolt.Tx) error { return nil }},
	// an older release would change records without moving the counts
	{To: 4, What: "embedded store shards count their records by state; shard 0's log may hold gateway events", Run: countShards},
	{To: 5, What: "embedded store events may be removed events of forgotten devices", Run: func(*bolt.Tx) error { return nil }},
	// an older release would change records without moving the indexes
	{To: 6, What: "embedded store shards index their records by last change and count their sessions per gateway", Run: indexShards},
}

const (
	schema       = 1
	recordFormat = 2
	eventFormat  = 1
	// gatewayEventFormat marks a gateway event (from state file format 4)
	gatewayEventFormat = 2
)

var (
	bucketMeta   = []byte("store.meta")
	bucketEpochs = []byte("store.epochs")
	bucketDev    = []byte("dev")
	bucketExp    = []byte("exp")
	bucketEv     = []byte("ev")
	keyShards    = []byte("shards")
	keySchema    = []byte("schema")
	keyTail      = []byte("tail")
	keyLock      = []byte("lock")
	keyCover     = "cover."
	keyVerFloor  = []byte("verfloor")
)

func shardBucket(n int) []byte { return fmt.Appendf(nil, "store.shard.%d", n) }

// errCorrupt marks a record that does not decode; it is wrapped with the
// key that held it.
var errCorrupt = errors.New("corrupt record")

// session is one live session as a device record holds it.
type session struct {
	id       gateway.SessionID
	deadline int64
	gw       string
	epoch    uint64
}

// record is a device record: it outlives the device's sessions so that
// ver keeps counting.
type record struct {
	online   bool
	ver      uint64
	since    int64
	gw       string
	session  gateway.SessionID
	sessions []session
	tombs    []tomb
}

// tomb is a leave tombstone: session id left, its leave observed at ms.
type tomb struct {
	id gateway.SessionID
	at int64
}

// deadline is the max over the live sessions, 0 when there are none.
func (r *record) deadline() int64 {
	var d int64
	for _, s := range r.sessions {
		d = max(d, s.deadline)
	}
	return d
}

func (r *record) find(id gateway.SessionID) int {
	for i, s := range r.sessions {
		if s.id == id {
			return i
		}
	}
	return -1
}

func appendStr(b []byte, s string) []byte {
	b = binary.AppendUvarint(b, uint64(len(s)))
	return append(b, s...)
}

func appendBool(b []byte, v bool) []byte {
	if v {
		return append(b, 1)
	}
	return append(b, 0)
}

func encodeRecord(r *record) []byte {
	b := make([]byte, 0, 32+len(r.gw)+len(r.session)+len(r.sessions)*48)
	b = append(b, recordFormat)
	b = appendBool(b, r.online)
	b = binary.AppendUvarint(b, r.ver)
	b = binary.AppendUvarint(b, uint64(r.since))
	b = appendStr(b, r.gw)
	b = appendStr(b, string(r.session))
	b = binary.AppendUvarint(b, uint64(len(r.sessions)))
	for _, s := range r.sessions {
		b = appendStr(b, string(s.id))
		b = binary.AppendUvarint(b, uint64(s.deadline))
		b = appendStr(b, s.gw)
		b = binary.AppendUvarint(b, s.epoch)
	}
	b = binary.AppendUvarint(b, uint64(len(r.tombs)))
	for _, t := range r.tombs {
		b = appendStr(b, string(t.id))
		b = binary.AppendUvarint(b, uint64(t.at))
	}
	return b
}

// decoder reads the fields of one value; the first error sticks.
type decoder struct {
	b   []byte
	err error
}

func (d *decoder) fail() {
	if d.err == nil {
		d.err = errCorrupt
	}
	d.b = nil
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.fail()
		return 0
	}
	c := d.b[0]
	d.b = d.b[1:]
	return c
}

func (d *decoder) bool() bool {
	switch d.byte() {
	case 0:
		return false
	case 1:
		return true
	}
	d.fail()
	return false
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.fail()
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) int() int64 {
	v := d.uvarint()
	if v > 1<<62 {
		d.fail()
		return 0
	}
	return int64(v)
}

func (d *decoder) str() string {
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

func (d *decoder) done() error {
	if d.err == nil && len(d.b) != 0 {
		d.err = errCorrupt
	}
	return d.err
}

// recordOnline reads the state of an encoded record without decoding the
// rest.
func recordOnline(b []byte) (bool, error) {
	if len(b) < 2 || (b[0] != 1 && b[0] != recordFormat) || b[1] > 1 {
		return false, errCorrupt
	}
	return b[1] == 1, nil
}

func decodeRecord(b []byte) (record, error) {
	d := decoder{b: b}
	format := d.byte()
	if format != 1 && format != recordFormat {
		d.fail()
	}
	r := record{
		online:  d.bool(),
		ver:     d.uvarint(),
		since:   d.int(),
		gw:      d.str(),
		session: gateway.SessionID(d.str()),
	}
	n := d.uvarint()
	if n > uint64(len(d.b)) {
		d.fail()
		n = 0
	}
	if n > 0 {
		r.sessions = make([]session, 0, n)
	}
	for range n {
		r.sessions = append(r.sessions, session{
			id:       gateway.SessionID(d.str()),
			deadline: d.int(),
			gw:       d.str(),
			epoch:    d.uvarint(),
		})
	}
	if format >= 2 {
		n := d.uvarint()
		if n > uint64(len(d.b)) {
			d.fail()
			n = 0
		}
		for range n {
			r.tombs = append(r.tombs, tomb{id: gateway.SessionID(d.str()), at: d.int()})
		}
	}
	return r, d.done()
}

var reasons = [...]gateway.Reason{
	1: gateway.ReasonConnect,
	2: gateway.ReasonRenew,
	3: gateway.ReasonLeave,
	4: gateway.ReasonExpired,
	5: gateway.ReasonReplay,
	6: gateway.ReasonGatewayLost,
	7: gateway.ReasonForget,
}

// states are the event states by their code; removed (2) is written
// from state file format 5 on.
var states = [...]gateway.State{gateway.Offline, gateway.Online, gateway.Removed}

func stateCode(st gateway.State) byte {
	for i, x := range states {
		if x == st {
			return byte(i)
		}
	}
	panic(fmt.Sprintf("embedded: unknown state %q", st))
}

func reasonCode(r gateway.Reason) byte {
	for i, x := range reasons {
		if i > 0 && x == r {
			return byte(i)
		}
	}
	panic(fmt.Sprintf("embedded: unknown reason %q", r))
}

// encodeEvent encodes e but its ID and Shard, which are where it is
// stored.
func encodeEvent(e *gateway.Event) []byte {
	if e.IsGateway() {
		b := make([]byte, 0, 32+len(e.Gateway))
		b = append(b, gatewayEventFormat)
		b = appendStr(b, e.Gateway)
		b = appendBool(b, e.State == gateway.Back)
		b = binary.AppendUvarint(b, e.Ver)
		b = binary.AppendUvarint(b, uint64(e.At.UnixMilli()))
		return binary.AppendUvarint(b, uint64(e.Contact.UnixMilli()))
	}
	b := make([]byte, 0, 24+len(e.Device)+len(e.Gateway)+len(e.Session))
	b = append(b, eventFormat)
	b = appendStr(b, string(e.Device))
	b = append(b, stateCode(e.State))
	b = binary.AppendUvarint(b, e.Ver)
	b = binary.AppendUvarint(b, uint64(e.At.UnixMilli()))
	b = append(b, reasonCode(e.Reason))
	b = appendStr(b, e.Gateway)
	b = appendStr(b, string(e.Session))
	var dl int64
	if !e.Deadline.IsZero() {
		dl = e.Deadline.UnixMilli()
	}
	return binary.AppendUvarint(b, uint64(dl))
}

func decodeEvent(shard int, key, b []byte) (gateway.Event, error) {
	id, ok := parseEventKey(key)
	if !ok {
		return gateway.Event{}, errCorrupt
	}
	d := decoder{b: b}
	switch d.byte() {
	case eventFormat:
	case gatewayEventFormat:
		e := gateway.Event{ID: id.String(), Shard: shard, Gateway: d.str(), State: gateway.Lost}
		if d.bool() {
			e.State = gateway.Back
		}
		e.Ver = d.uvarint()
		e.At = time.UnixMilli(d.int())
		e.Contact = time.UnixMilli(d.int())
		if e.Gateway == "" {
			d.fail()
		}
		return e, d.done()
	default:
		d.fail()
	}
	e := gateway.Event{ID: id.String(), Shard: shard, Device: gateway.DeviceID(d.str())}
	if e.Device == "" {
		d.fail() // a device's event names its device (else it would read as a gateway event)
	}
	if c := d.byte(); int(c) < len(states) {
		e.State = states[c]
	} else {
		d.fail()
	}
	e.Ver = d.uvarint()
	e.At = msTime(d.int())
	if c := d.byte(); c > 0 && int(c) < len(reasons) {
		e.Reason = reasons[c]
	} else {
		d.fail()
	}
	e.Gateway = d.str()
	e.Session = gateway.SessionID(d.str())
	if dl := d.int(); dl != 0 {
		e.Deadline = msTime(dl)
	}
	return e, d.done()
}

// eventID is a position in a shard's event log, ordered as (ms, seq).
type eventID struct{ ms, seq uint64 }

func (id eventID) String() string { return fmt.Sprintf("%d-%d", id.ms, id.seq) }

func (id eventID) key() []byte {
	k := make([]byte, 16)
	binary.BigEndian.PutUint64(k, id.ms)
	binary.BigEndian.PutUint64(k[8:], id.seq)
	return k
}

// parseEventID parses "<ms>-<seq>" or "<ms>" (seq 0).
func parseEventID(s string) (eventID, error) {
	ms, seq, hasSeq := strings.Cut(s, "-")
	var id eventID
	var err error
	if id.ms, err = strconv.ParseUint(ms, 10, 64); err != nil {
		return eventID{}, fmt.Errorf("event id %q: %w", s, err)
	}
	if hasSeq {
		if id.seq, err = strconv.ParseUint(seq, 10, 64); err != nil {
			return eventID{}, fmt.Errorf("event id %q: %w", s, err)
		}
	}
	return id, nil
}

func parseEventKey(k []byte) (eventID, bool) {
	if len(k) != 16 {
		return eventID{}, false
	}
	return eventID{binary.BigEndian.Uint64(k), binary.BigEndian.Uint64(k[8:])}, true
}

// next is the ID of an event appended at nowMs after id: the clock's ms
// when it has moved past id, else id's ms with the next seq, so IDs
// strictly increase even when the clock stalls or goes backwards.
func (id eventID) next(nowMs int64) eventID {
	if nowMs > 0 && uint64(nowMs) > id.ms {
		return eventID{ms: uint64(nowMs)}
	}
	if id.seq == ^uint64(0) {
		return eventID{ms: id.ms + 1}
	}
	return eventID{ms: id.ms, seq: id.seq + 1}
}

// tail is the shard's "tail" value: the last event ID and the log length.
type tail struct {
	last  eventID
	count uint64
}

func decodeTail(b []byte) (tail, error) {
	if b == nil {
		return tail{}, nil
	}
	if len(b) != 24 {
		return tail{}, errCorrupt
	}
	return tail{
		last:  eventID{binary.BigEndian.Uint64(b), binary.BigEndian.Uint64(b[8:])},
		count: binary.BigEndian.Uint64(b[16:]),
	}, nil
}

func (t tail) encode() []byte {
	b := make([]byte, 24)
	binary.BigEndian.PutUint64(b, t.last.ms)
	binary.BigEndian.PutUint64(b[8:], t.last.seq)
	binary.BigEndian.PutUint64(b[16:], t.count)
	return b
}

// expKey is the deadline index key of device d due at ms.
func expKey(ms int64, d gateway.DeviceID) []byte {
	k := make([]byte, 8, 8+len(d))
	binary.BigEndian.PutUint64(k, uint64(ms))
	return append(k, d...)
}

func parseExpKey(k []byte) (int64, gateway.DeviceID, bool) {
	if len(k) <= 8 {
		return 0, "", false
	}
	return int64(binary.BigEndian.Uint64(k)), gateway.DeviceID(k[8:]), true
}

func u64(v uint64) []byte { return binary.BigEndian.AppendUint64(nil, v) }

func decodeU64(b []byte) (uint64, error) {
	if len(b) != 8 {
		return 0, errCorrupt
	}
	return binary.BigEndian.Uint64(b), nil
}

// msTime is the time of ms; 0 is the zero time.
func msTime(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms)
}

// maxTombs bounds the leave tombstones of a record, and tombKeep is how
// long one is kept (lua/record.lua MAX_TOMBS, TOMB_KEEP).
const (
	maxTombs = 8
	tombKeep = 24 * time.Hour
)

// tombed reports whether evidence of session id observed at obs comes
// before that session's leave, at now. A tombstone later than now (the
// clock went back) is not held against anything.
func (r *record) tombed(id gateway.SessionID, obs, now int64) bool {
	for _, t := range r.tombs {
		if t.id == id && obs < t.at && t.at <= now {
			return true
		}
	}
	return false
}

// leftAt reports whether session x ended with its leave: a tombstone of
// its id observed at or after its deadline (a last session that left
// while another gateway's coverage lagged is kept until the reap with the
// leave's time as its deadline, apply.go); its offline is a leave.
func (r *record) leftAt(x session) bool {
	for _, t := range r.tombs {
		if t.id == x.id && t.at >= x.deadline {
			return true
		}
	}
	return false
}

// entomb records that session id left, observed at at, and forgets the
// tombstones observed at or before horizon (now - tombKeep) and the
// oldest beyond maxTombs.
func (r *record) entomb(id gateway.SessionID, at, horizon int64) {
	kept := r.tombs[:0]
	for _, t := range r.tombs {
		switch {
		case t.id == id:
			at = max(at, t.at)
		case t.at > horizon:
			kept = append(kept, t)
		}
	}
	kept = append(kept, tomb{id: id, at: at})
	if n := len(kept) - maxTombs; n > 0 {
		kept = kept[n:]
	}
	r.tombs = kept
}

// encode is a liveness's value: u64 cover, u64 contact.
func (l liveness) encode() []byte {
	return binary.BigEndian.AppendUint64(u64(uint64(l.cover)), uint64(l.contact))
}

// decodeLiveness reads a liveness value; nil is none.
func decodeLiveness(b []byte) (liveness, error) {
	switch len(b) {
	case 0:
		return liveness{}, nil
	case 16:
		return liveness{cover: int64(binary.BigEndian.Uint64(b)), contact: int64(binary.BigEndian.Uint64(b[8:]))}, nil
	}
	return liveness{}, fmt.Errorf("%w: liveness of %d bytes", errCorrupt, len(b))
}
