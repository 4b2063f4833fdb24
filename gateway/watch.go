package gateway

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"
)

// ErrResyncRequired: a position can no longer be served (the shard's log
// was trimmed past it, or the store's incarnation changed); the consumer
// takes a new snapshot. Stores return a *ResyncError that wraps it.
var ErrResyncRequired = errors.New("resync required")

// Resync reasons.
const (
	// ResyncTrimmed: events after the position were trimmed from the log.
	ResyncTrimmed = "trimmed"
	// ResyncIncarnation: the position belongs to another incarnation of
	// the shard's state (lost, restarted or failed over); its log
	// positions mean nothing here.
	ResyncIncarnation = "incarnation"
)

// ResyncError says which shard's position cannot be served, and why.
type ResyncError struct {
	Shard  int
	Reason string // ResyncTrimmed or ResyncIncarnation
}

func (e *ResyncError) Error() string {
	return fmt.Sprintf("shard %d: %s: %s", e.Shard, ErrResyncRequired, e.Reason)
}

func (e *ResyncError) Unwrap() error { return ErrResyncRequired }

// ErrBusy: the store serves no more concurrent waits (WaitEvents) now:
// every connection its readers may hold is taken. Nothing was read; the
// caller answers 503 and the consumer retries later.
var ErrBusy = errors.New("store busy: too many waiting readers")

// ErrNotHolder: a publisher cursor write by an owner that does not hold
// the shard's publisher lock; nothing was written.
var ErrNotHolder = errors.New("publisher lock not held")

// Position is a place in one shard's event log of one incarnation of the
// store: ID is the last event consumed ("0" before the first one). A
// position of another incarnation is never served.
type Position struct {
	// Incarnation is an opaque token (no ',' '@' or whitespace), never
	// empty in a position a store returned.
	Incarnation string `json:"incarnation"`
	ID          string `json:"id"`
}

func (p Position) String() string { return p.Incarnation + "@" + p.ID }

// Cursor is one position per shard, indexed by shard: where a consumer
// stands in the whole store.
type Cursor []Position

// String encodes the cursor as "v1:<inc>@<id>,<inc>@<id>,...", one per
// shard; ParseCursor reads it back.
func (c Cursor) String() string {
	parts := make([]string, len(c))
	for i, p := range c {
		parts[i] = p.String()
	}
	return "v1:" + strings.Join(parts, ",")
}

// ParseCursor reads a Cursor.String of a store of shards shards. A
// position may have an empty incarnation ("@<id>"): it is then served by
// ID alone (ReadEvents), as `events tail --follow` does with the
// positions of /v1/events.
func ParseCursor(s string, shards int) (Cursor, error) {
	body, ok := strings.CutPrefix(s, "v1:")
	if !ok {
		return nil, fmt.Errorf("cursor %.40q: want v1:<incarnation>@<id>,...", s)
	}
	parts := strings.Split(body, ",")
	if len(parts) != shards {
		return nil, fmt.Errorf("cursor has %d positions, the store has %d shards", len(parts), shards)
	}
	c := make(Cursor, shards)
	for i, p := range parts {
		inc, id, ok := strings.Cut(p, "@")
		if !ok || !validLogID(id) || strings.ContainsAny(inc, " \t\n") {
			return nil, fmt.Errorf("cursor position %d %.60q: want <incarnation>@<ms>-<seq>", i, p)
		}
		c[i] = Position{Incarnation: inc, ID: id}
	}
	return c, nil
}

// validLogID reports whether id is "0" or "<ms>-<seq>" in decimal.
func validLogID(id string) bool {
	if id == "0" {
		return true
	}
	ms, seq, ok := strings.Cut(id, "-")
	return ok && decimal(ms) && decimal(seq)
}

func decimal(s string) bool {
	if s == "" || len(s) > 20 {
		return false
	}
	for _, r := range s {
		if r < '0' || r > '9' {
			return false
		}
	}
	return true
}

// CompareLogIDs orders two valid log IDs ("0" is before every other).
func CompareLogIDs(a, b string) int {
	am, as := splitLogID(a)
	bm, bs := splitLogID(b)
	switch {
	case am != bm:
		return cmpU(am, bm)
	default:
		return cmpU(as, bs)
	}
}

func splitLogID(id string) (ms, seq uint64) {
	m, s, _ := strings.Cut(id, "-")
	for _, r := range m {
		ms = ms*10 + uint64(r-'0')
	}
	for _, r := range s {
		seq = seq*10 + uint64(r-'0')
	}
	return ms, seq
}

func cmpU(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// SnapshotPage is one page of a shard's devices read at one instant,
// with the shard's log position at that instant.
type SnapshotPage struct {
	Devices []DeviceInfo
	// At is the shard's position when the page was read: every event up
	// to At is reflected in Devices, none after it.
	At Position
	// Next is "" after the shard's last page.
	Next string
}

// EventLog is the consumers' side of the Store contract: a snapshot of a
// shard at a position and the events after a position (the watch API,
// the upstream publisher through PublisherLog).
//
// Merging a snapshot with the events after a cursor: take a cursor first
// (SnapshotShard with limit 0 on every shard), then the snapshot pages
// (each read at a position no earlier than the cursor), then the events
// after the cursor, applying an event only when its Ver is greater than
// the Ver the consumer holds for its device. Device records are never
// deleted, so every device that existed at the cursor is in the snapshot;
// a device created later has all its events after the cursor. The result
// equals the store's state after the last event read.
type EventLog interface {
	// Shards is the shard count the store was opened with.
	Shards() int
	// SnapshotShard reads up to limit devices of shard (in the store's
	// order, from page "" onwards) and the shard's current position in
	// one atomic step. limit 0 reads only the position (a cheap cursor).
	// A device present for the whole paging is returned exactly once;
	// one created meanwhile may or may not be.
	SnapshotShard(ctx context.Context, shard int, page string, limit int) (SnapshotPage, error)
	// ReadEvents returns up to limit events of shard after position
	// after, in log order. When there are none it waits up to block for
	// one (0: return at once), returning an empty slice when none came
	// or ctx ended (ctx's error is returned only when it ended before
	// anything could be read). It fails with a *ResyncError when after
	// is of another incarnation or events after it were trimmed; a
	// position ahead of the log (never written by this incarnation) is
	// served as is, and one with an empty Incarnation is served in
	// whatever incarnation the shard is in (by ID alone). The Redis store reads on connections of its own, so
	// that waiting readers never hold the devices' write path.
	ReadEvents(ctx context.Context, shard int, after Position, limit int, block time.Duration) ([]Event, error)
	// WaitEvents waits up to block (0: not at all) until a shard has an
	// event after its position in after (one per shard, indexed by
	// shard), and returns those shards in ascending order: none when
	// block passed or ctx ended first (ctx's error is not returned). It
	// only says where to read: the caller reads each shard named with
	// ReadEvents, which checks the position. A position of another
	// incarnation may go unnoticed until an event comes, so a caller
	// whose wait named no shard checks its positions with ReadEvents
	// before waiting again. A shard whose events after the position were
	// trimmed is named. One wait covers every shard, so that an idle
	// consumer holds as few store connections as the store allows (the
	// Redis store: one for a standalone server, one per shard in a
	// Cluster); a store that cannot hold another wait fails at once with
	// ErrBusy, with block 0 too (a caller asks so before it commits to
	// waiting; a wait of block 0 takes no place of the others).
	WaitEvents(ctx context.Context, after []Position, block time.Duration) ([]int, error)
}

// PublisherLog is the upstream publisher's side of the Store contract:
// the event log, and the lock and saved position of each shard's one
// publisher.
type PublisherLog interface {
	EventLog
	// AcquirePublisher takes or extends the publisher lease of shard for
	// owner (expiring after ttl on the store clock) and returns the
	// shard's saved publisher position (zero Position when none was
	// saved). ok is false, and the position zero, when another owner
	// holds an unexpired lease.
	AcquirePublisher(ctx context.Context, shard int, owner string, ttl time.Duration) (pos Position, ok bool, err error)
	// SavePublisher records pos as the publisher position of shard if
	// owner still holds the lease (even expired, as long as no one else
	// took it); otherwise it writes nothing and returns ErrNotHolder.
	SavePublisher(ctx context.Context, shard int, owner string, pos Position) error
	// ReleasePublisher gives up owner's lease of shard, keeping the saved
	// position (no-op if owner does not hold it).
	ReleasePublisher(ctx context.Context, shard int, owner string) error
}

// Envelope is the one JSON form of a presence event shared by the watch
// API, the snapshot and the MQTT publisher (docs/events.md). A snapshot
// entry is an envelope of the device's current state with reason
// "snapshot" and at = when that state began. A gateway event's envelope
// has no device, reason or session, and has contact.
type Envelope struct {
	Device   DeviceID  `json:"device,omitempty"`
	State    State     `json:"state"`
	Ver      uint64    `json:"ver"`
	At       time.Time `json:"at"`
	Reason   Reason    `json:"reason,omitempty"`
	Gateway  string    `json:"gateway"`
	Session  SessionID `json:"session,omitempty"`
	Deadline time.Time `json:"deadline,omitzero"`
	Contact  time.Time `json:"contact,omitzero"`
	// Cursor is set on the watch API only: the position after this event.
	Cursor string `json:"cursor,omitempty"`
}

// ReasonSnapshot marks an envelope read from a snapshot, not an event.
const ReasonSnapshot Reason = "snapshot"

// EnvelopeOf is e's envelope.
func EnvelopeOf(e Event) Envelope {
	return Envelope{Device: e.Device, State: e.State, Ver: e.Ver, At: e.At.UTC(), Reason: e.Reason,
		Gateway: e.Gateway, Session: e.Session, Deadline: utcOrZero(e.Deadline), Contact: utcOrZero(e.Contact)}
}

// SnapshotEnvelope is the envelope of a device's current state.
func SnapshotEnvelope(d DeviceInfo) Envelope {
	state := Offline
	if d.State == Online {
		state = Online
	}
	return Envelope{Device: d.Device, State: state, Ver: d.Ver, At: utcOrZero(d.Since), Reason: ReasonSnapshot,
		Gateway: d.Gateway, Session: d.Session}
}

func utcOrZero(t time.Time) time.Time {
	if t.IsZero() {
		return t
	}
	return t.UTC()
}
