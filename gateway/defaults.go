package gateway

import "time"

// The defaults of the configuration (docs/design.md §6.3), in one place: the configuration's
// defaults and the zero values of the session table and the uplink take
// them from here.
const (
	DefaultLease             = 90 * time.Second
	DefaultHeartbeatInterval = 30 * time.Second
	DefaultRenewEvery        = 20 * time.Second
	DefaultSuspectAfter      = 45 * time.Second
	DefaultShards            = 16
	// DefaultGatewayGrace: how long the runner holds the devices of a
	// gateway it does not hear before it reports them offline
	// (docs/reliability.md explains the choice).
	DefaultGatewayGrace = 60 * time.Second
	DefaultMaxSessions  = 1_000_000
	// The uplink's flush: every DefaultFlushInterval or at DefaultMaxBatch
	// pending writes, whichever comes first.
	DefaultFlushInterval = time.Second
	DefaultMaxBatch      = 1000
	// The expiry runner: a pass per shard at least every
	// DefaultRunnerInterval, at most DefaultRunnerBatch devices a call;
	// its shard lease lasts max(5 x interval, DefaultRunnerLockTTL).
	DefaultRunnerInterval = time.Second
	DefaultRunnerBatch    = 500
	DefaultRunnerLockTTL  = 5 * time.Second
)

// CoverageWait is how long past a device's deadline a store may wait for
// the coverage of a gateway that keeps flushing every flush (gateway.Batch
// Covers): the coverage's margin of one flush interval, up to one more
// until the next flush, and the reap's recheck of one.
func CoverageWait(flush time.Duration) time.Duration { return 3 * flush }
