package gateway

import (
	"fmt"
	"time"
)

// Kind is the kind of a piece of evidence.
type Kind uint8

const (
	// Connect opens a session (or renews it if it is already live).
	Connect Kind = iota + 1
	// Renew is fresh evidence for a session; it creates the session if the
	// store does not hold it live.
	Renew
	// Leave is a clean goodbye: it ends that one session.
	Leave
)

func (k Kind) String() string {
	switch k {
	case Connect:
		return "connect"
	case Renew:
		return "renew"
	case Leave:
		return "leave"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Evidence is what a protocol front end hands the gateway: something the
// device did at ObservedAt (the gateway's monotonic clock).
type Evidence struct {
	Device     DeviceID
	Session    SessionID
	Kind       Kind
	ObservedAt time.Time
	// Protocol names the front end ("coap", "mqtt", an adapter name); it is
	// used for metrics only.
	Protocol string
	// Lease is the lease this evidence holds the session for: 0 for the
	// configured presence.lease, or what the front end granted (a CoAP
	// device's longer lease within presence.max_lease, an MQTT
	// connection's lease from before a reload). The session table and the
	// uplink fill in 0 with the lease in force when the evidence is
	// observed, and it then travels with the evidence to the store.
	Lease time.Duration
	// Anonymous says the device was admitted without credentials
	// (auth.allow_anonymous): its first session counts against the
	// session table's MaxAnonymousDevices.
	Anonymous bool
}

// State is a device's presence state.
type State string

const (
	Online  State = "online"
	Suspect State = "suspect"
	Offline State = "offline"
	// Lost and Back are the states of a gateway event (Event.IsGateway):
	// the store has not heard the gateway for presence.lease, or hears it
	// again after that.
	Lost State = "lost"
	Back State = "back"
	// Removed is the state of a device's last event: the device was
	// forgotten (Store Forget); consumers drop what they hold of it.
	Removed State = "removed"
)

// DeriveState returns the presence state at now for a device whose
// central deadline is deadline (zero when it has no live session):
// offline once the deadline has passed, suspect when no evidence newer
// than suspectAfter is known (the last evidence is deadline − lease),
// online otherwise.
func DeriveState(now, deadline time.Time, lease, suspectAfter time.Duration) State {
	if deadline.IsZero() || !deadline.After(now) {
		return Offline
	}
	if now.Sub(deadline.Add(-lease)) >= suspectAfter {
		return Suspect
	}
	return Online
}

// Reason says why an event was written.
type Reason string

const (
	ReasonConnect Reason = "connect"
	ReasonRenew   Reason = "renew"
	ReasonLeave   Reason = "leave"
	ReasonExpired Reason = "expired"
	ReasonReplay  Reason = "replay"
	// ReasonGatewayLost: the device's lease ran out while the gateway
	// that last wrote it was not heard (silent or still replaying its
	// outbox), and stayed so for the gateway grace.
	ReasonGatewayLost Reason = "gateway_lost"
	// ReasonForget: the device was forgotten (Store Forget); the event's
	// state is Removed.
	ReasonForget Reason = "forget"
)

// Event is one presence transition as written to a shard's event log
// (docs/design.md §3.4). The events of a device alternate online/offline starting
// with online, Ver +1 each; (Device, Ver) is the consumer's idempotency key.
//
// A gateway event (IsGateway: no Device) is a transition of a gateway,
// written to shard 0's log: State Lost or Back, Gateway the gateway,
// Contact its last call; its events alternate lost/back starting with
// lost, and (Gateway, Ver) is their idempotency key.
//
// A forgotten device's last event is Removed (reason forget, Ver +1); if
// it comes back, its events start again with online, at a Ver above
// every one it had.
type Event struct {
	// ID is the position in the shard's log ("<ms>-<seq>", as a Redis
	// stream ID); Events(after=ID) resumes after it.
	ID      string    `json:"id"`
	Shard   int       `json:"shard"`
	Device  DeviceID  `json:"device"`
	State   State     `json:"state"` // Online, Offline or Removed
	Ver     uint64    `json:"ver"`
	At      time.Time `json:"at"` // store clock, millisecond precision
	Reason  Reason    `json:"reason"`
	Gateway string    `json:"gw"`
	Session SessionID `json:"session"`
	// Deadline is the lease end that ran out; set for ReasonExpired and
	// ReasonGatewayLost only.
	Deadline time.Time `json:"deadline,omitzero"`
	// Contact is the gateway's last call (store clock), on gateway
	// events only.
	Contact time.Time `json:"contact,omitzero"`
}

// IsGateway says whether e is a gateway event rather than a device's.
func (e Event) IsGateway() bool { return e.Device == "" }

// Write is one session write of a batch. Age is now − observed_at on the
// sending gateway's monotonic clock, computed just before the batch is
// sent; the store turns it into a deadline with its own clock
// (deadline = store_now − Age + lease), so skew between gateway and
// store never moves a deadline.
type Write struct {
	Device  DeviceID
	Session SessionID
	Kind    Kind
	Age     time.Duration
	// Lease is the lease in force when the evidence was observed (it
	// travels with the evidence through the queue and the outbox, so a
	// reload changes nothing already observed); 0 means Batch.Lease.
	Lease time.Duration
	// Coalesced says that this connect or renew stands for several
	// observations of its session, of which the sender kept only the
	// newest (its sending was held up, and its queue merged them): as for
	// Batch.Replay, the store allows it up to the gateway grace after its
	// session's deadline, since what bridged the delay may be gone. The
	// other writes of the batch keep the plain rule.
	Coalesced bool
}

// LeaseOr is the write's lease: its own, else the batch's lease def.
func (w Write) LeaseOr(def time.Duration) time.Duration {
	if w.Lease > 0 {
		return w.Lease
	}
	return def
}

// Batch is the unit of Store.Apply: writes for devices of one shard, from
// one gateway process.
type Batch struct {
	Gateway string
	Epoch   uint64
	// Lease is the lease of every write that carries none (Write.Lease).
	Lease time.Duration
	// Replay marks writes replayed from the outbox: an online event they
	// cause carries ReasonReplay.
	Replay bool
	// Behind says that the gateway's outbox still holds writes of the
	// batch's shard: until it has caught up there, the store's runner
	// holds (does not reap) the devices of the shard it wrote last
	// (gateway grace).
	Behind bool
	// Restore marks renewals that re-send this gateway's live sessions of
	// a shard after the store lost or replaced its state there
	// (ApplyResult.Reset): a renewal that finds no record creates it
	// online without an event (consumers saw the device online before the
	// loss; its next event has a ver above every lost one), and so does
	// one that finds the record offline since before the store's state
	// began (an older state's record of an earlier visit); one that finds
	// its session expired extends it without an event, however late (the
	// renewals that bridged the gap were acknowledged by the lost state);
	// otherwise it is a renewal. A renewal whose deadline has already
	// passed re-sends a session that ran out before the loss, whose
	// offline may never have been written: where it finds no record it
	// creates it online without an event, its session ending at the
	// call, so that the reap writes the offline (reason expired) once the
	// gateway's coverage reaches it, and so where it finds the record
	// offline since before the state began; where the record is online,
	// or offline since, it changes nothing. A leave re-sends a leave the store accepted before the
	// loss: where it finds no record, or one offline since before the
	// leave was observed (an older state's record of an earlier visit),
	// it writes the leave's offline (or, while another gateway's coverage
	// lags, brings the record back online without an event, its session
	// ending at the leave, for the reap); where it finds the record
	// online or offline since the leave it changes nothing.
	Restore bool
	// Covers says that CoverAge is set: every evidence the gateway
	// observed for the batch's shard up to CoverAge before the call was
	// made is in this batch or in a call the store applied before it.
	// The store keeps the latest such moment per gateway and shard on its
	// own clock, the gateway's coverage, and expires a session only once
	// the coverage of its gateway has reached the session's deadline
	// (Store; invariant 11). A batch without it leaves the coverage as it
	// is.
	Covers   bool
	CoverAge time.Duration
	Writes   []Write
	// AgesAt is when Write.Age and CoverAge were computed; zero: as the
	// call is made. The store counts them from then on its own clock
	// (AgedTo), so that the time a starved gateway spent between
	// computing them and making the call dates nothing later than it
	// was: a coverage that claimed that time would let a reap judge
	// evidence still in the gateway.
	AgesAt time.Time
}

// AgedTo returns b with its ages counted from now instead of from
// AgesAt: each Write.Age and CoverAge grown by the time since AgesAt (a
// store calls it with its clock's time as it makes the call). Writes is
// copied, not changed in place.
func (b Batch) AgedTo(now time.Time) Batch {
	if b.AgesAt.IsZero() {
		return b
	}
	lag := now.Sub(b.AgesAt)
	b.AgesAt = time.Time{}
	if lag <= 0 {
		return b
	}
	ws := make([]Write, len(b.Writes))
	for i, w := range b.Writes {
		w.Age += lag
		ws[i] = w
	}
	b.Writes = ws
	if b.Covers {
		b.CoverAge += lag
	}
	return b
}

// ApplyResult reports what a batch changed.
type ApplyResult struct {
	// Events are the transitions the batch wrote, in log order.
	Events []Event
	// Reset says that the shard's state is not the one this gateway
	// process wrote to before (a restart without persistence, FLUSHALL, a
	// failover to a replica): records may be gone or older, so the caller
	// re-sends the live sessions it holds for the shard (Batch.Restore).
	Reset bool
	// Incarnation names the shard's state the call met: the same until
	// that state is lost or replaced, then another. A gateway keeps the
	// one its restore covered across its restarts (the uplink's session
	// ledger), so that its next process restores after a loss that the
	// store reported (Reset) to a process that ended before restoring.
	Incarnation string
}

// ReapResult reports one bounded reap call on one shard.
type ReapResult struct {
	// Offline are the offline events written (reason expired), one per
	// device whose last live session had run out; each device's entry was
	// removed in the same atomic step.
	Offline []Event
	// Trimmed counts devices that had expired sessions dropped but kept a
	// live one (their deadline moved forward, no event).
	Trimmed int
	// Held counts due devices not reaped because the gateway that wrote
	// them last was not heard: their deadline moved by the gateway grace
	// (Redis store only; see store/redisstore).
	Held int
	// More is true when due entries remain (the call hit its limit).
	More bool
	// Gap is true when the call found that the shard had gone unreaped
	// for longer than the store's reap gap (the store, every runner or
	// the host stopped) and ended that gap: it judged no gateway and held
	// due devices whose gateway's coverage had not reached them (see
	// the stores' ReapGap option).
	Gap bool
	// Next is the earliest deadline still in the shard (zero if empty).
	Next time.Time
	// Now is the store time the call ran at, so that the caller can
	// time its next call against Next without asking the store's clock.
	Now time.Time
}

// SessionInfo is one live session of a device as the store holds it.
type SessionInfo struct {
	ID       SessionID `json:"id"`
	Deadline time.Time `json:"deadline"`
	Gateway  string    `json:"gw"`
	Epoch    uint64    `json:"epoch"`
}

// DeviceInfo is the store's view of one device.
type DeviceInfo struct {
	Device DeviceID `json:"device"`
	// State is Online or Offline (Suspect is derived by the caller with
	// DeriveState, which needs the lease and suspect_after).
	State    State         `json:"store_state"`
	Deadline time.Time     `json:"deadline,omitzero"` // zero when offline
	Sessions []SessionInfo `json:"sessions"`
	Ver      uint64        `json:"ver"`
	Since    time.Time     `json:"since"`   // when the current state began (store clock)
	Gateway  string        `json:"gw"`      // last writer
	Session  SessionID     `json:"session"` // last session written
}

// ListQuery selects devices for Store.List (list.go: the orders and
// their cursors).
//
// The store does not know the protocol of a session (Evidence.Protocol
// is for metrics only, and never reaches it): a device's protocol is
// read from the form of its last session's ID (docs/design.md §1), so
// the admin API filters by protocol the pages it reads, as it filters
// by the derived state suspect; neither is a field here.
type ListQuery struct {
	// State filters by Online or Offline; empty means both.
	State State
	// Prefix keeps the devices whose ID starts with it; empty keeps
	// every device. Only OrderID takes a prefix (ErrBadQuery otherwise).
	Prefix string
	// Order is OrderID (the default, for "") or OrderChanged.
	Order ListOrder
	// Cursor is "" to start, else the Next of the previous page of the
	// same query.
	Cursor string
	// Limit bounds the page (the store may return fewer; ≤ 0 means 100).
	Limit int
}

// ListPage is one page of Store.List; Next is "" after the last page.
type ListPage struct {
	Devices []DeviceInfo
	Next    string
}
