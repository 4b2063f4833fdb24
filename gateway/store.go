package gateway

import (
	"context"
	"errors"
	"time"
)

// Errors of the Store contract. Implementations wrap them ("op: %w") so
// that errors.Is works.
var (
	// ErrNotFound: the device has never been seen by the store.
	ErrNotFound = errors.New("not found")
	// ErrFenced: the batch's epoch is older than the newest epoch the
	// store has seen for that gateway; nothing of it was applied.
	ErrFenced = errors.New("fenced: stale gateway epoch")
	// ErrShardMismatch: the store was laid out with another shard count
	// or schema (P:meta); the process must not start.
	ErrShardMismatch = errors.New("shard count or schema mismatch")
	// ErrBadShard: a shard index outside [0, Shards()).
	ErrBadShard = errors.New("shard out of range")
	// ErrWrongShard: a write's device does not hash to the batch's shard.
	ErrWrongShard = errors.New("device not in shard")
	// ErrUnavailable: the store could not be reached; the caller may retry
	// (the uplink moves the batch to its outbox). Any error that is not
	// one of the others above should be treated the same way.
	ErrUnavailable = errors.New("store unavailable")
	// ErrOverloaded: the gateway refuses evidence to protect itself (a
	// session cap or a full uplink queue); front ends answer "try later".
	ErrOverloaded = errors.New("overloaded")
	// ErrUnauthorized: a device's credentials were refused (unknown device
	// or wrong secret; deliberately not saying which).
	ErrUnauthorized = errors.New("not authorized")
)

// Store is the central presence store: the Redis store and the embedded
// bbolt store implement it with the same semantics, checked by
// store/storetest.
//
// Semantics of Apply, per write, in order, atomically for the whole batch:
//
//   - The batch is refused whole (ErrFenced) if Epoch is older than the
//     newest epoch seen for Gateway; otherwise that epoch is recorded.
//   - First the device's sessions whose deadline is ≤ now are dropped,
//     except the session a connect or renew is about to extend when its
//     evidence was observed at or before that session's deadline
//     (now − Age ≤ deadline: late but valid, say delayed by an outage; it
//     extends the session and writes no event). If dropping leaves none
//     and the device was online, an offline event is written (reason
//     expired, Deadline = the old device deadline, At = now), exactly as
//     the runner would have.
//   - Lease is the write's own lease, or Batch.Lease when it carries
//     none (Write.LeaseOr); a write with a negative lease is refused.
//   - Connect and Renew compute d = now − Age + Lease. If d ≤ now the
//     evidence has lapsed and is ignored (never resurrected). Otherwise the
//     session's deadline becomes max(old, d), created if absent; if it is
//     the device's first live session an online event is written (reason
//     connect, renew, or replay when Batch.Replay).
//   - Leave removes the session unless the session holds newer evidence
//     (its deadline > now − Age + Lease); if it was the last live session an
//     offline event (reason leave) is written and the device's entry leaves
//     the deadline index.
//   - The device's deadline is the max over its live sessions.
//
// With a gateway grace, a session expires (in a reap, or dropped by a
// write) only once its gateway could have renewed it after its deadline
// and did not: the store keeps, per gateway and shard, the coverage the
// gateway's applied calls reported (Batch.Covers), and a session whose
// deadline the coverage of its gateway has not reached waits. A reap
// holds such a device instead of reaping it: it looks again soon while
// the gateway is heard (a call within the allowed silence, since the
// last store outage the caller saw), or at the end of the grace when it
// is not. Evidence observed before the held deadline keeps it (no
// event), and so does replayed or coalesced evidence (Batch.Replay,
// Write.Coalesced: per write, so a plain write of the same batch keeps
// the plain rule) observed at most the grace after a session's
// deadline, held or not: an outbox or a held-up queue keeps only a
// session's newest evidence, so what bridged an outage may be gone.
// At the end of the grace a held device is reaped with its true
// deadline, reason gateway_lost if its gateway's coverage has still not
// reached it. A gateway that reports no coverage (an older release) is
// judged by its last call instead: it counts as having covered a
// deadline when it was heard within the silence, is not behind, and was
// heard since the last outage.
//
// So replaying a batch is harmless: a duplicate connect or renew extends
// nothing, a duplicate leave finds no session. A device's record (state,
// ver, since) outlives its sessions so that Ver keeps counting, until
// the device is forgotten (Forgetter).
//
// Each consumer takes the slice of the contract it uses: the uplink a
// Writer, the runner a Reaper, the admin API a Reader and a Forgetter,
// the upstream publisher a PublisherLog.
type Store interface {
	Writer
	Reaper
	Reader
	PublisherLog
	Forgetter
	// Close releases the store's resources, including a connection the
	// store dialled itself.
	Close() error
}

// Writer is the write side of the Store contract, what the uplink
// needs: batches of evidence, per shard.
type Writer interface {
	// Shards is the shard count the store was opened with.
	Shards() int
	// Apply applies a batch whose devices all hash to shard.
	Apply(ctx context.Context, shard int, b Batch) (ApplyResult, error)
	// ApplyShards applies the batches of several shards in one round trip
	// (the Redis store pipelines the shards' script calls; a Cluster
	// client sends one pipeline per node, in parallel; the embedded store
	// uses one transaction). Each batch keeps the semantics and the
	// atomicity of Apply; batches of different shards are independent, so
	// one can fail (fenced, misrouted, or its node unreachable) while the
	// others are applied. The result has one entry per batch, in order.
	// The uplink writes through it alone: flushes, the epoch announcement
	// and outbox replays.
	ApplyShards(ctx context.Context, batches []ShardBatch) []ShardResult
	// Probe reports, per shard, whether the part of the store that holds
	// it answers (nil) or not, in one round trip (one per Cluster node,
	// in parallel), by reading it: it writes nothing, records no epoch
	// and no liveness, so the first write after an outage is still the
	// caller's own (the uplink probes the shards it found down before it
	// replays their outbox entries). The result has one entry per shard.
	Probe(ctx context.Context, shards []int) []error
	// Now is the store's clock.
	Now(ctx context.Context) (time.Time, error)
}

// Reaper is the expiry runner's side of the Store contract: the shard
// leases that share the shards among runners, and the reap.
type Reaper interface {
	// Shards is the shard count the store was opened with.
	Shards() int
	// Reap handles at most limit due entries (deadline ≤ now) of shard:
	// drops their expired sessions and, for a device left with none,
	// writes its offline event and removes its entry in one atomic step.
	// ReapResult.Now is the store time the call ran at. On shard 0 it
	// first writes the gateway events due (Event.IsGateway: a gateway not
	// heard for presence.lease is lost, one heard again after that is
	// back) to the shard's log, when the store was opened with a
	// GatewayLost; ReapResult does not report them.
	Reap(ctx context.Context, shard int, limit int) (ReapResult, error)
	// AcquireShard takes or extends the runner lease of shard for owner;
	// it reports false when another owner holds an unexpired lease.
	AcquireShard(ctx context.Context, shard int, owner string, ttl time.Duration) (bool, error)
	// ReleaseShard gives up owner's lease of shard (no-op if not held).
	ReleaseShard(ctx context.Context, shard int, owner string) error
	// RunnerLeases reports, per shard, whether some runner holds an
	// unexpired lease of it (on the store's clock): a shard no runner
	// holds gets no offline events.
	RunnerLeases(ctx context.Context) ([]bool, error)
}

// Reader is the query side of the Store contract, what the admin API
// serves: devices, the event log by page, and the consumers' side of the
// log (snapshot and watch).
type Reader interface {
	EventLog
	// Device reads one device; ErrNotFound if the store never saw it.
	Device(ctx context.Context, id DeviceID) (DeviceInfo, error)
	// List pages through devices in q's order (ListQuery, list.go),
	// filtered by state and by ID prefix. Each store keeps the index the
	// order needs, moved in the same atomic step as the records (by
	// ID: written when a record is made or forgotten; by last change: at
	// each transition, never by a renewal), so a page reads about limit
	// index entries per shard and the devices it returns, never the
	// fleet. A page holds only devices no shard can have missed, so it
	// may be short of the limit (a shard whose budget of records ran out
	// on a state filter in ID order) while Next is not "". A device
	// changed between two pages may be missed or returned twice (by
	// last change it moves to the front). Errors of q wrap ErrBadQuery.
	List(ctx context.Context, q ListQuery) (ListPage, error)
	// Events reads up to limit events of shard after position after
	// ("" or "0" for the start of the log).
	Events(ctx context.Context, shard int, after string, limit int) ([]Event, error)
	// Now is the store's clock.
	Now(ctx context.Context) (time.Time, error)
	// Counts is the fleet's devices by stored state, summed over the
	// shards. Each shard keeps its count of online records, moved in the
	// same atomic step as every transition (apply, reap), so a call costs
	// one read per shard, not a scan. A shard written before the count
	// existed is counted once, by its first Counts, in one atomic pass
	// over its records; the count is kept from then on. Suspect is not
	// a stored state: Online includes suspect devices and devices whose
	// lease ran out that no reap has ended yet. Suspect counts, among
	// the online, those whose deadline is after the store's now and at
	// most window after it (SuspectWindow: the devices DeriveState
	// calls suspect), from the deadline index (Redis: ZCOUNT, per
	// shard; the embedded store walks that span of its index).
	Counts(ctx context.Context, window time.Duration) (Counts, error)
	// Gateways lists every gateway the store has heard, by ID, merged
	// over the shards: its newest epoch, its last call (the store
	// clock), whether its outbox still held writes at that call, and
	// whether the store reports it lost (Redis: shard 0's reap, after
	// presence.lease without a call, until it calls again; the embedded
	// store is written by its own gateway only, which it never reports
	// lost), and the live sessions the store holds of it (each shard
	// keeps its count per gateway, moved by the writes that add, move
	// or drop a session, never by a renewal). A gateway is never
	// forgotten.
	Gateways(ctx context.Context) ([]GatewayInfo, error)
}

// GatewayInfo is what the store knows of one gateway (Reader.Gateways).
type GatewayInfo struct {
	ID string `json:"id"`
	// Epoch is the newest epoch the store has seen of it (its process).
	Epoch uint64 `json:"epoch"`
	// Contact is its last call on any shard; zero when no shard kept one.
	Contact time.Time `json:"contact"`
	// Behind: its outbox still held writes at that call.
	Behind bool `json:"behind"`
	// Lost: the store reported it lost and has not heard it since.
	Lost bool `json:"lost"`
	// Sessions is the live sessions the store holds whose gateway is
	// this one (a session renewed through another gateway moves there);
	// those that ran out count until a reap or a write drops them.
	Sessions int64 `json:"sessions"`
}

// Counts is the fleet's devices by stored state (Reader.Counts).
type Counts struct {
	Online  int64 `json:"online"`
	Offline int64 `json:"offline"`
	// Suspect is how many of Online are suspect (their deadline within
	// the window of the call): a part of Online, not beside it.
	Suspect int64 `json:"suspect"`
}

// Forgetter is the retirement side of the Store contract: a device the
// fleet no longer has leaves the store (fleetgate devices forget, DELETE
// /v1/devices/{id}).
type Forgetter interface {
	// Forget removes device from the store in one atomic step of its
	// shard: its record, its sessions, its deadline index entry, its
	// leave tombstones and any hold of it (record.lua "Held devices"),
	// and writes its last event: state Removed, reason ReasonForget, Ver
	// one above its last, At the store's now, Gateway by (who forgot it),
	// Session its last session; that event is returned. A device the
	// store does not hold returns ErrNotFound and writes nothing, so a
	// second Forget is harmless. No offline event is written for a
	// device forgotten online: Removed stands for it.
	//
	// The store keeps, per shard, the highest Ver it handed to a
	// forgotten device (a ver floor): a device that sends again after it
	// was forgotten, through any gateway, even a renewal already in
	// flight, comes back as a new device, online with a Ver above the
	// floor, so that (Device, Ver) never repeats. The floor is all that
	// is left of it.
	Forget(ctx context.Context, device DeviceID, by string) (Event, error)
}

// ShardBatch is one shard's part of an ApplyShards call.
type ShardBatch struct {
	Shard int
	Batch Batch
}

// ShardResult is what one ShardBatch came to: Apply's result or error.
type ShardResult struct {
	Result ApplyResult
	Err    error
}
