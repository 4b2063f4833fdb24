package configs

import (
	"errors"
	"fmt"
	"math"
	"net"
	"strconv"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// Limits checked by Validate.
const (
	MaxShards        = 16384 // Redis Cluster hash slots: more shards cannot spread further
	MaxRunnerBatch   = 10000
	MinEventsMaxLen  = 1000
	MinHeartbeat     = time.Second         // CoAP Max-Age and MQTT keep-alive count seconds
	MaxHeartbeat     = 65535 * time.Second // MQTT keep-alive is 16 bits of seconds
	heartbeatsInside = 2                   // a lease must survive one lost heartbeat
	// MaxMaxLease bounds presence.max_lease: a week of sleep is far more
	// than any heartbeat, and a lease that long already hides a dead
	// device for as long.
	MaxMaxLease = 7 * 24 * time.Hour
)

// problems collects validation errors, each prefixed by its key.
type problems []error

func (p *problems) add(key, format string, args ...any) {
	*p = append(*p, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...)))
}

// keyed is a problem that Load places at its key in the file
// (file:line:column), when the file sets the key.
type keyed struct {
	key string
	err error
}

func (k keyed) Error() string { return k.err.Error() }
func (k keyed) Unwrap() error { return k.err }

// addAt is add for a problem Load positions at its key.
func (p *problems) addAt(key, format string, args ...any) {
	*p = append(*p, keyed{key, fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...))})
}

func (p *problems) positive(key string, d Duration) bool {
	if d <= 0 {
		p.add(key, "must be > 0, got %s", d)
		return false
	}
	return true
}

func (p *problems) atLeast(key string, v, low int) {
	if v < low {
		p.add(key, "must be >= %d, got %d", low, v)
	}
}

// Validate checks every value and the rules between them, and returns all
// problems joined, one per line, each starting with the key it is about.
func (c Config) Validate() error {
	var p problems
	if err := gateway.ValidGatewayID(c.Gateway.ID); err != nil {
		p.add("gateway.id", "%q: %v", c.Gateway.ID, err)
	}
	if c.Gateway.StateDir == "" {
		p.add("gateway.state_dir", "must be set")
	}
	c.validatePresence(&p)
	c.validateStore(&p)
	c.validateCanary(&p)
	p.positive("uplink.flush_interval", c.Uplink.FlushInterval)
	p.atLeast("uplink.max_batch", c.Uplink.MaxBatch, 1)
	p.atLeast("uplink.outbox_max_sessions", c.Uplink.OutboxMaxSessions, 1)
	p.positive("runner.interval", c.Runner.Interval)
	if c.Runner.Batch < 1 || c.Runner.Batch > MaxRunnerBatch {
		p.add("runner.batch", "must be between 1 and %d, got %d", MaxRunnerBatch, c.Runner.Batch)
	}
	p.positive("runner.lock_ttl", c.Runner.LockTTL)
	p.atLeast("events.max_len", c.Events.MaxLen, MinEventsMaxLen)
	if c.Events.MaxLen >= MinEventsMaxLen && c.Presence.Shards >= 1 && c.Events.MaxLen < c.Presence.Shards {
		p.add("events.max_len", "%d is shared by presence.shards %d streams and leaves them no room; raise it to at least %d",
			c.Events.MaxLen, c.Presence.Shards, c.Presence.Shards)
	}
	c.validateEventsMQTT(&p)
	c.validateBridge(&p)
	c.validateClients(&p)
	c.validateListen(&p)
	c.validateAuth(&p)
	c.validateLimits(&p)
	c.validateSecurity(&p)
	c.validatePlugins(&p)
	if !oneOf(c.Log.Level, "debug", "info", "warn", "error") {
		p.add("log.level", "must be debug, info, warn or error, got %q", c.Log.Level)
	}
	if !oneOf(c.Log.Format, "text", "json") {
		p.add("log.format", "must be text or json, got %q", c.Log.Format)
	}
	return errors.Join(p...)
}

func (c Config) validatePresence(p *problems) {
	pr := c.Presence
	lease := p.positive("presence.lease", pr.Lease)
	hb := p.positive("presence.heartbeat_interval", pr.HeartbeatInterval)
	renew := p.positive("presence.renew_every", pr.RenewEvery)
	suspect := p.positive("presence.suspect_after", pr.SuspectAfter)
	if pr.Shards < 1 || pr.Shards > MaxShards {
		p.add("presence.shards", "must be between 1 and %d, got %d", MaxShards, pr.Shards)
	}
	p.atLeast("presence.max_sessions", pr.MaxSessions, 1)
	if pr.GatewayGrace < 0 {
		p.add("presence.gateway_grace", "must not be negative, got %s", pr.GatewayGrace)
	}
	if pr.MaxLease != 0 && (pr.MaxLease < pr.Lease || pr.MaxLease.Std() > MaxMaxLease) {
		p.add("presence.max_lease", "must be 0 (no lease longer than presence.lease) or between presence.lease (%s) and %s, got %s",
			pr.Lease, Duration(MaxMaxLease), pr.MaxLease)
	}
	if pr.LearnLease && lease && pr.MaxLease <= pr.Lease {
		p.addAt("presence.learn_lease", "needs presence.max_lease above presence.lease (%s), the longest lease it may learn; got %s", pr.Lease, pr.MaxLease)
	}
	if hb && (pr.HeartbeatInterval.Std() < MinHeartbeat || pr.HeartbeatInterval.Std() > MaxHeartbeat) {
		p.add("presence.heartbeat_interval", "must be between %s and %s (devices are told it in whole seconds), got %s",
			Duration(MinHeartbeat), Duration(MaxHeartbeat), pr.HeartbeatInterval)
		hb = false
	}
	if lease && renew && pr.RenewEvery >= pr.Lease {
		p.add("presence.renew_every", "%s must be less than presence.lease (%s)", pr.RenewEvery, pr.Lease)
	}
	if lease && suspect && pr.SuspectAfter >= pr.Lease {
		p.add("presence.suspect_after", "%s must be less than presence.lease (%s)", pr.SuspectAfter, pr.Lease)
	}
	if hb && suspect && pr.SuspectAfter <= pr.HeartbeatInterval {
		p.add("presence.suspect_after", "%s must be more than presence.heartbeat_interval (%s), or every device turns suspect between two heartbeats",
			pr.SuspectAfter, pr.HeartbeatInterval)
	}
	if lease && hb && renew && c.Uplink.FlushInterval > 0 {
		if m := c.Bounds().HeartbeatMargin; m < 0 {
			need := heartbeatsInside*pr.HeartbeatInterval + pr.RenewEvery + c.Uplink.FlushInterval
			p.add("presence.lease", "lease %s - renew_every %s - uplink.flush_interval %s = %s is less than %d x heartbeat_interval %s = %s, so one late heartbeat would flap a device offline (raise lease to at least %s or lower heartbeat_interval)",
				pr.Lease, pr.RenewEvery, c.Uplink.FlushInterval, pr.Lease-pr.RenewEvery-c.Uplink.FlushInterval,
				heartbeatsInside, pr.HeartbeatInterval, heartbeatsInside*pr.HeartbeatInterval, need)
		}
	}
}

func (c Config) validateStore(p *problems) {
	r := c.Store.Redis
	switch c.Store.Backend {
	case BackendEmbedded:
	case BackendRedis:
		if len(r.Addrs) == 0 {
			p.add("store.redis.addrs", "must list at least one host:port when store.backend is redis")
		}
	default:
		p.add("store.backend", "must be %s or %s, got %q", BackendEmbedded, BackendRedis, c.Store.Backend)
	}
	for i, a := range r.Addrs {
		if err := checkAddr(a); err != nil {
			p.add(fmt.Sprintf("store.redis.addrs[%d]", i), "%v", err)
		}
	}
	if r.WaitReplicas < 0 || r.WaitReplicas > 16 {
		p.add("store.redis.wait_replicas", "must be 0 to 16, got %d", r.WaitReplicas)
	}
	if r.KeyPrefix == "" || strings.ContainsAny(r.KeyPrefix, "{} \t\r\n") {
		p.add("store.redis.key_prefix", "must be set and hold no braces or white space, got %q", r.KeyPrefix)
	}
}

func (c Config) validateAuth(p *problems) {
	l := c.Listen
	devices := l.CoAP.UDP != "" || l.CoAP.DTLS != "" || l.MQTT.TCP != "" || l.MQTT.TLS != ""
	if devices && c.Auth.DevicesFile == "" && !c.Auth.AllowAnonymous {
		p.add("auth.devices_file", "must be set when auth.allow_anonymous is off, or no device could connect")
	}
	if l.CoAP.DTLS != "" && c.Auth.DevicesFile == "" {
		p.add("listen.coap.dtls", "needs auth.devices_file (the devices' pre-shared keys)")
	}
	m := c.Listen.MQTT
	if m.TLS != "" && (m.CertFile == "" || m.KeyFile == "") {
		p.add("listen.mqtt.tls", "needs listen.mqtt.cert_file and listen.mqtt.key_file")
	}
	if a := c.Listen.Admin; a.CredentialsAPI {
		switch {
		case a.HTTP == "":
			p.addAt("listen.admin.credentials_api", "needs listen.admin.http (the admin API is off)")
		case a.TokenFile == "":
			p.addAt("listen.admin.credentials_api", "needs listen.admin.token_file: the credentials API changes which devices may connect, and is never served without a bearer token")
		case c.Auth.DevicesFile == "":
			p.addAt("listen.admin.credentials_api", "needs auth.devices_file (the file it edits)")
		}
	}
	if a := c.Listen.Admin; a.Pprof && a.HTTP == "" {
		p.addAt("listen.admin.pprof", "needs listen.admin.http (the admin API is off)")
	}
	tp := c.Auth.TopicPrefix
	if tp == "" || strings.ContainsAny(tp, "+#\x00") || strings.HasPrefix(tp, "/") || strings.HasSuffix(tp, "/") {
		p.add("auth.topic_prefix", "must be a topic without wildcards or a leading or trailing '/', got %q", tp)
	}
}

// MQTT's largest packet (remaining length 268,435,455 plus the fixed header).
const maxMQTTPacket = 268435460

func (c Config) validateLimits(p *problems) {
	l := c.Limits
	if l.MQTTMaxPacketSize < 128 || l.MQTTMaxPacketSize > maxMQTTPacket {
		p.add("limits.mqtt_max_packet_size", "must be between 128 and %d bytes, got %d", maxMQTTPacket, l.MQTTMaxPacketSize)
	}
	p.atLeast("limits.mqtt_max_clients", l.MQTTMaxClients, 1)
	p.atLeast("limits.mqtt_connects_per_second", l.MQTTConnectsPerSecond, 1)
	p.atLeast("limits.mqtt_max_pending_writes", l.MQTTMaxPendingWrites, 1)
	if l.MQTTMaxInflight < 1 || l.MQTTMaxInflight > math.MaxUint16 {
		p.add("limits.mqtt_max_inflight", "must be between 1 and %d, got %d", math.MaxUint16, l.MQTTMaxInflight)
	}
	p.atLeast("limits.mqtt_max_retained_per_device", l.MQTTMaxRetainedPerDevice, 1)
	p.atLeast("limits.mqtt_max_retained_bytes_per_device", l.MQTTMaxRetainedBytesPerDevice, 1)
	p.atLeast("limits.anonymous_max_devices", l.AnonymousMaxDevices, 1)
	p.atLeast("limits.anonymous_connects_per_second", l.AnonymousConnectsPerSecond, 1)
	if l.MQTTMaxRetainedBytes < l.MQTTMaxRetainedBytesPerDevice {
		p.add("limits.mqtt_max_retained_bytes", "must be at least limits.mqtt_max_retained_bytes_per_device (%d), got %d", l.MQTTMaxRetainedBytesPerDevice, l.MQTTMaxRetainedBytes)
	}
	if l.CoAPMaxMessageSize < 64 || l.CoAPMaxMessageSize > 65507 {
		p.add("limits.coap_max_message_size", "must be between 64 and 65507 bytes (one UDP datagram), got %d", l.CoAPMaxMessageSize)
	}
	p.atLeast("limits.coap_requests_per_second", l.CoAPRequestsPerSecond, 1)
	p.positive("limits.dtls_handshake_timeout", l.DTLSHandshakeTimeout)
	p.atLeast("limits.dtls_max_peers", l.DTLSMaxPeers, 1)
	p.positive("limits.dtls_idle_timeout", l.DTLSIdleTimeout)
	p.atLeast("limits.dtls_max_parked", l.DTLSMaxParked, 0)
}

// listener is one listen address with the transport it binds.
type listener struct {
	key, addr, transport string
}

func (c Config) validateListen(p *problems) {
	ls := []listener{
		{"listen.coap.udp", c.Listen.CoAP.UDP, "udp"},
		{"listen.coap.dtls", c.Listen.CoAP.DTLS, "udp"},
		{"listen.mqtt.tcp", c.Listen.MQTT.TCP, "tcp"},
		{"listen.mqtt.tls", c.Listen.MQTT.TLS, "tcp"},
		{"listen.admin.http", c.Listen.Admin.HTTP, "tcp"},
	}
	for i, l := range ls {
		if l.addr == "" {
			continue
		}
		if err := checkAddr(l.addr); err != nil {
			p.add(l.key, "%v (or empty to disable)", err)
			continue
		}
		for _, prev := range ls[:i] {
			if prev.addr != "" && prev.transport == l.transport && checkAddr(prev.addr) == nil && overlap(prev.addr, l.addr) {
				p.add(l.key, "%q and %s (%q) bind the same %s port", l.addr, prev.key, prev.addr, l.transport)
			}
		}
	}
}

// checkAddr accepts host:port with a numeric port; the host may be empty.
func checkAddr(a string) error {
	_, port, err := net.SplitHostPort(a)
	if err != nil {
		var ae *net.AddrError
		if errors.As(err, &ae) {
			return fmt.Errorf("%q is not host:port: %s", a, ae.Err)
		}
		return fmt.Errorf("%q is not host:port", a)
	}
	if _, err := strconv.ParseUint(port, 10, 16); err != nil {
		return fmt.Errorf("%q: port %q is not a number in 0..65535", a, port)
	}
	return nil
}

// overlap reports whether two valid addresses would bind the same port:
// the same non-zero port on the same host, or on a wildcard host.
func overlap(a, b string) bool {
	ha, pa, _ := net.SplitHostPort(a)
	hb, pb, _ := net.SplitHostPort(b)
	if pa != pb || pa == "0" {
		return false
	}
	return ha == hb || wildcard(ha) || wildcard(hb)
}

func wildcard(host string) bool {
	return host == "" || host == "0.0.0.0" || host == "::"
}

func oneOf(s string, allowed ...string) bool {
	for _, a := range allowed {
		if s == a {
			return true
		}
	}
	return false
}

// Bounds are the presence timings that follow from a configuration,
// measured from a device's last evidence. Writes carry the evidence's
// age, so a late flush does not move a deadline; but a device is
// reported offline only once its gateway's coverage has passed its
// deadline (docs/design.md §7, invariant 11), which takes up to three
// flush intervals: the coverage's margin of one, up to one until the
// next flush, and the reap's recheck of one (CoverageWait).
type Bounds struct {
	// Suspect: a device turns suspect after presence.suspect_after
	// without evidence.
	Suspect Duration `json:"suspect" yaml:"suspect"`
	// EarliestOffline is lease − renew_every: the throttle may have kept
	// the last renewal from the store, so the central deadline can be this
	// close to the last evidence.
	EarliestOffline Duration `json:"earliest_offline" yaml:"earliest_offline"`
	// WorstCaseDetection is lease + 3 × flush_interval + runner.interval:
	// the deadline of the last evidence, the wait for its gateway's
	// coverage, and the runner's longest sleep. Reaping a backlog larger
	// than runner.batch adds its processing time.
	WorstCaseDetection Duration `json:"worst_case_detection" yaml:"worst_case_detection"`
	// WorstCaseDetectionFailover adds runner.lock_ttl: the wait before
	// another runner takes over a shard whose runner died holding it.
	WorstCaseDetectionFailover Duration `json:"worst_case_detection_failover" yaml:"worst_case_detection_failover"`
	// WorstCaseDetectionLostGateway is lease + gateway_grace +
	// runner.interval: the devices of a gateway the store does not hear
	// (a site cut off, a dead gateway) are held for the grace first.
	WorstCaseDetectionLostGateway Duration `json:"worst_case_detection_lost_gateway" yaml:"worst_case_detection_lost_gateway"`
	// AfterStoreOutage is gateway_grace + 3 × flush_interval +
	// runner.interval: while the store is down or slow (a CPU-starved
	// Redis, replies delayed), a device that stops is reported no later
	// than the lost-gateway bound after its last evidence, or this long
	// after the store answers every gateway again, whichever is later:
	// the devices its reaps held while their gateways went unheard wait
	// the grace once they are heard again.
	AfterStoreOutage Duration `json:"after_store_outage" yaml:"after_store_outage"`
	// Leave is 3 × flush_interval: a clean leave waits two flush
	// intervals in the gateway (a device moving to another gateway with a
	// clean goodbye must not flap), then goes out with the next flush.
	Leave Duration `json:"leave" yaml:"leave"`
	// LeaveHeld is Leave + 3 × flush_interval + runner.interval: a leave
	// of a device's last session written while another gateway's coverage
	// lags (the device may have moved there, its connect on the way) is
	// judged by the reap once that gateway has covered it.
	LeaveHeld Duration `json:"leave_held" yaml:"leave_held"`
	// LeaveCut is Leave + lease + gateway_grace + runner.interval: a leave
	// written while another gateway is cut from the store (the device may
	// have moved there, its connect held up by the cut) waits until that
	// gateway's horizon ends.
	LeaveCut Duration `json:"leave_cut" yaml:"leave_cut"`
	// HeartbeatMargin is lease − renew_every − flush_interval −
	// 2 × heartbeat_interval: the slack left after one lost heartbeat.
	// Validate refuses a negative margin (the flap rule).
	HeartbeatMargin Duration `json:"heartbeat_margin" yaml:"heartbeat_margin"`
	// MaxLease is the longest lease a device may ask for: max_lease, or
	// lease when it is 0. MaxLeaseHeartbeat is the Max-Age such a device
	// is answered with (MaxLease − (lease − heartbeat_interval)), and
	// WorstCaseDetectionMaxLease = MaxLease + 3 × flush_interval +
	// runner.interval its worst-case detection.
	MaxLease                   Duration `json:"max_lease" yaml:"max_lease"`
	MaxLeaseHeartbeat          Duration `json:"max_lease_heartbeat" yaml:"max_lease_heartbeat"`
	WorstCaseDetectionMaxLease Duration `json:"worst_case_detection_max_lease" yaml:"worst_case_detection_max_lease"`
	// WorstCaseDetectionLearned is the worst-case detection of a device
	// whose lease is learned (presence.learn_lease): that of the longest
	// device lease, a learned lease being at most max_lease (and
	// max_lease until learned); zero when learning is off.
	WorstCaseDetectionLearned Duration `json:"worst_case_detection_learned,omitempty" yaml:"worst_case_detection_learned,omitempty"`
	// Adapters are the worst-case detections of the adapters with a lease
	// of their own (plugins.adapters[].lease), in the configuration's
	// order.
	Adapters []ClassBound `json:"adapters,omitempty" yaml:"adapters,omitempty"`
}

// ClassBound is the worst-case detection of a class of devices with a
// lease of their own: Lease + 3 × flush_interval + runner.interval after
// their last evidence.
type ClassBound struct {
	Name               string   `json:"name" yaml:"name"`
	Lease              Duration `json:"lease" yaml:"lease"`
	WorstCaseDetection Duration `json:"worst_case_detection" yaml:"worst_case_detection"`
}

// Detection is the worst-case detection of a device whose evidence holds
// it for lease: lease + 3 × flush_interval (the gateway's coverage) +
// runner.interval after its last evidence.
func (c Config) Detection(lease time.Duration) Duration {
	return Duration(lease) + Duration(gateway.CoverageWait(c.Uplink.FlushInterval.Std())) + c.Runner.Interval
}

// Bounds derives the presence timings of c.
func (c Config) Bounds() Bounds {
	pr := c.Presence
	tm := c.Timing()
	wait := Duration(gateway.CoverageWait(c.Uplink.FlushInterval.Std()))
	var learned Duration
	if pr.LearnLease {
		learned = c.Detection(tm.Grant(tm.MaxLease))
	}
	var adapters []ClassBound
	for _, a := range c.Plugins.Adapters {
		if a.Lease > 0 {
			adapters = append(adapters, ClassBound{Name: "adapter " + a.Name, Lease: a.Lease, WorstCaseDetection: c.Detection(a.Lease.Std())})
		}
	}
	return Bounds{
		WorstCaseDetectionLearned:     learned,
		Adapters:                      adapters,
		MaxLease:                      Duration(tm.Grant(tm.MaxLease)),
		MaxLeaseHeartbeat:             Duration(tm.HeartbeatFor(tm.Grant(tm.MaxLease))),
		WorstCaseDetectionMaxLease:    Duration(tm.Grant(tm.MaxLease)) + wait + c.Runner.Interval,
		Suspect:                       pr.SuspectAfter,
		EarliestOffline:               pr.Lease - pr.RenewEvery,
		WorstCaseDetection:            pr.Lease + wait + c.Runner.Interval,
		WorstCaseDetectionFailover:    pr.Lease + wait + c.Runner.Interval + c.Runner.LockTTL,
		WorstCaseDetectionLostGateway: pr.Lease + pr.GatewayGrace + c.Runner.Interval,
		AfterStoreOutage:              pr.GatewayGrace + wait + c.Runner.Interval,
		Leave:                         3 * c.Uplink.FlushInterval,
		LeaveHeld:                     3*c.Uplink.FlushInterval + wait + c.Runner.Interval,
		LeaveCut:                      3*c.Uplink.FlushInterval + pr.Lease + pr.GatewayGrace + c.Runner.Interval,
		HeartbeatMargin:               pr.Lease - pr.RenewEvery - c.Uplink.FlushInterval - heartbeatsInside*pr.HeartbeatInterval,
	}
}

// String lays the bounds out one per line with what each one means, for
// check-config.
func (b Bounds) String() string {
	rows := []struct {
		name string
		d    Duration
		why  string
	}{
		{"suspect after", b.Suspect, "presence.suspect_after without evidence"},
		{"earliest offline", b.EarliestOffline, "lease - renew_every after the last evidence"},
		{"worst-case detection", b.WorstCaseDetection, "lease + 3 x uplink.flush_interval (the gateway's coverage) + runner.interval after the last evidence, plus backlog processing"},
		{"  after runner failover", b.WorstCaseDetectionFailover, "+ runner.lock_ttl when a runner dies holding a shard"},
		{"  of a lost gateway", b.WorstCaseDetectionLostGateway, "lease + gateway_grace + runner.interval, for devices of a gateway the store does not hear"},
		{"  after a store outage", b.AfterStoreOutage, "gateway_grace + 3 x uplink.flush_interval + runner.interval after the store answers again, if later"},
		{"offline after a leave", b.Leave, "3 x uplink.flush_interval (the leave grace, then a flush)"},
		{"  a gateway lagging", b.LeaveHeld, "+ 3 x uplink.flush_interval (its coverage) + runner.interval"},
		{"  a gateway cut", b.LeaveCut, "+ lease + gateway_grace + runner.interval (until its horizon ends)"},
		{"heartbeat margin", b.HeartbeatMargin, "lease - renew_every - uplink.flush_interval - 2 x heartbeat_interval"},
		{"longest device lease", b.MaxLease, "presence.max_lease (a lease asked with l=, of the devices file, of an adapter, learned), lease when 0"},
		{"  heartbeat asked", b.MaxLeaseHeartbeat, "its Max-Age: longest device lease - (lease - heartbeat_interval)"},
		{"  worst-case detection", b.WorstCaseDetectionMaxLease, "longest device lease + 3 x uplink.flush_interval + runner.interval after its last evidence"},
	}
	if b.WorstCaseDetectionLearned > 0 {
		rows = append(rows, struct {
			name string
			d    Duration
			why  string
		}{"learned lease detection", b.WorstCaseDetectionLearned, "presence.learn_lease: at most that of the longest device lease (max_lease until a device's period is learned)"})
	}
	var sb strings.Builder
	for _, r := range rows {
		fmt.Fprintf(&sb, "%-24s %-8s %s\n", r.name, r.d, r.why)
	}
	for _, a := range b.Adapters {
		sb.WriteString(a.String())
	}
	return sb.String()
}

// String is a's line of check-config's bounds.
func (a ClassBound) String() string {
	return fmt.Sprintf("%-24s %-8s %s\n", a.Name, a.WorstCaseDetection, fmt.Sprintf("its lease %s + 3 x uplink.flush_interval + runner.interval after its last evidence", a.Lease))
}

// leaseProblem says what is wrong with a lease a class of devices is
// given (an adapter's): "" for 0 (none) or one within [presence.lease,
// presence.max_lease].
func (c Config) leaseProblem(l Duration) string {
	pr := c.Presence
	switch {
	case l == 0:
		return ""
	case l < 0:
		return fmt.Sprintf("must be 0 (none) or at least presence.lease (%s), got %s", pr.Lease, l)
	case l < pr.Lease:
		return fmt.Sprintf("%s is shorter than presence.lease (%s); a lease of its own only lengthens the lease", l, pr.Lease)
	case pr.MaxLease <= pr.Lease && l > pr.Lease:
		return fmt.Sprintf("%s is longer than presence.lease (%s) and presence.max_lease is %s: none may be longer; raise presence.max_lease to at least %s", l, pr.Lease, pr.MaxLease, l)
	case l > pr.MaxLease:
		return fmt.Sprintf("%s is longer than presence.max_lease (%s); raise presence.max_lease or shorten the lease", l, pr.MaxLease)
	}
	return ""
}

// Timing is the presence timing the front ends answer devices with.
func (c Config) Timing() gateway.Timing {
	pr := c.Presence
	return gateway.Timing{Lease: pr.Lease.Std(), HeartbeatInterval: pr.HeartbeatInterval.Std(), MaxLease: pr.MaxLease.Std()}
}

// GatewayKeepAlive is the longest a gateway leaves a store shard without
// a call (the uplink's keep-alive): a sixth of the lease, between the
// flush interval and 10 s.
func (c Config) GatewayKeepAlive() time.Duration {
	return max(min(c.Presence.Lease.Std()/6, 10*time.Second), c.Uplink.FlushInterval.Std())
}

// UplinkProbeMax is the longest wait between two probes of a store that
// does not answer: an eighth of the lease, between 100 ms and 10 s. An
// outage ends for a gateway only at its next probe, and one longer than
// lease + gateway_grace reports its devices offline: the probe must come
// well inside that.
func (c Config) UplinkProbeMax() time.Duration {
	return min(max(c.Presence.Lease.Std()/8, 100*time.Millisecond), 10*time.Second)
}

// ReapGap is the longest a store shard may go without a reap before the
// store counts the gap as an outage (the store, every runner or the host
// stopped; docs/design.md §6.6): a gateway's silence, or twice a runner
// failover's wait when that is longer, so that a runner's death alone is
// not one.
func (c Config) ReapGap() time.Duration {
	return max(c.GatewaySilence(), 2*(c.Runner.Interval.Std()+c.Runner.LockTTL.Std()))
}

// GatewaySilence is how long the store may not hear a gateway on a shard
// before the runner counts it silent: three keep-alives and a flush.
func (c Config) GatewaySilence() time.Duration {
	return 3*c.GatewayKeepAlive() + c.Uplink.FlushInterval.Std()
}
