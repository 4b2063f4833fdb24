package configs_test

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/configs"
)

func sec(n int) configs.Duration { return configs.Duration(time.Duration(n) * time.Second) }

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(*configs.Config)
		want   string // "" for valid
	}{
		{"defaults", func(*configs.Config) {}, ""},
		{"flap rule at its edge is fine", func(c *configs.Config) {
			c.Presence.Lease = sec(81) // 81 - 20 - 1 = 60 = 2 × 30
		}, ""},
		{"flap rule one second short", func(c *configs.Config) { c.Presence.Lease = sec(80) },
			"presence.lease: lease 80s - renew_every 20s - uplink.flush_interval 1s = 59s is less than 2 x heartbeat_interval 30s = 1m, so one late heartbeat would flap a device offline (raise lease to at least 81s or lower heartbeat_interval)"},
		{"flap rule counts the flush interval", func(c *configs.Config) { c.Uplink.FlushInterval = sec(11) },
			"presence.lease: lease 90s - renew_every 20s - uplink.flush_interval 11s = 59s is less than 2 x heartbeat_interval 30s = 1m, so one late heartbeat would flap a device offline (raise lease to at least 91s or lower heartbeat_interval)"},
		{"shards negative", func(c *configs.Config) { c.Presence.Shards = -1 },
			"presence.shards: must be between 1 and 16384, got -1"},
		{"shards too many", func(c *configs.Config) { c.Presence.Shards = 16385 },
			"presence.shards: must be between 1 and 16384, got 16385"},
		{"shards max", func(c *configs.Config) { c.Presence.Shards = 16384 }, ""},
		{"redis with addrs", func(c *configs.Config) {
			c.Store.Backend = configs.BackendRedis
			c.Store.Redis.Addrs = []string{"10.0.0.1:6379", "redis-2.example:6380", "[::1]:6379"}
		}, ""},
		{"wait_replicas on a Cluster", func(c *configs.Config) {
			c.Store.Backend = configs.BackendRedis
			c.Store.Redis.Addrs = []string{"10.0.0.1:6379", "10.0.0.2:6379", "10.0.0.3:6379"}
			c.Store.Redis.WaitReplicas = 1
		}, ""},
		{"wait_replicas out of range", func(c *configs.Config) { c.Store.Redis.WaitReplicas = 17 },
			"store.redis.wait_replicas: must be 0 to 16, got 17"},
		{"redis addr without port", func(c *configs.Config) { c.Store.Redis.Addrs = []string{"10.0.0.1"} },
			`store.redis.addrs[0]: "10.0.0.1" is not host:port: missing port in address`},
		{"redis addr port out of range", func(c *configs.Config) { c.Store.Redis.Addrs = []string{"a:1", "a:70000"} },
			`store.redis.addrs[1]: "a:70000": port "70000" is not a number in 0..65535`},
		{"embedded ignores missing addrs", func(c *configs.Config) { c.Store.Redis.Addrs = nil }, ""},
		{"key prefix empty", func(c *configs.Config) { c.Store.Redis.KeyPrefix = "" },
			`store.redis.key_prefix: must be set and hold no braces or white space, got ""`},
		{"suspect_after equal to lease", func(c *configs.Config) { c.Presence.SuspectAfter = sec(90) },
			"presence.suspect_after: 90s must be less than presence.lease (90s)"},
		{"suspect_after equal to heartbeat", func(c *configs.Config) { c.Presence.SuspectAfter = sec(30) },
			"presence.suspect_after: 30s must be more than presence.heartbeat_interval (30s), or every device turns suspect between two heartbeats"},
		{"heartbeat too long", func(c *configs.Config) {
			c.Presence.HeartbeatInterval = sec(65536)
			c.Presence.Lease = sec(200000)
			c.Presence.SuspectAfter = sec(100000)
		}, "presence.heartbeat_interval: must be between 1s and 18h12m15s (devices are told it in whole seconds), got 18h12m16s"},
		{"canary on the DTLS listener", func(c *configs.Config) {
			c.Canary.Enabled = true
			c.Listen.CoAP.DTLS = "127.0.0.1:5684"
		}, ""},
		{"canary on plain UDP with anonymous devices", func(c *configs.Config) {
			c.Canary.Enabled = true
			c.Auth.AllowAnonymous = true
		}, ""},
		{"canary without a listener it may use", func(c *configs.Config) { c.Canary.Enabled = true },
			"canary.enabled: the canary needs a CoAP listener it can reach: listen.coap.dtls, or listen.coap.udp with auth.allow_anonymous"},
		{"canary live shorter than a heartbeat", func(c *configs.Config) {
			c.Canary.Enabled, c.Auth.AllowAnonymous = true, true
			c.Canary.Live = sec(29)
		}, "canary.live: 29s must be at least presence.heartbeat_interval (30s): the canary heartbeats in its live phase"},
		{"canary live zero while off", func(c *configs.Config) { c.Canary.Live = 0 }, "canary.live: must be > 0, got 0s"},
		{"canary device invalid", func(c *configs.Config) {
			c.Canary.Enabled, c.Auth.AllowAnonymous = true, true
			c.Canary.Device = "can ary"
		}, `canary.device: "can ary": invalid device id: byte 3 (' ') is not one of A-Z a-z 0-9 . _ : -`},
		{"canary device of an adapter", func(c *configs.Config) {
			c.Canary.Enabled, c.Auth.AllowAnonymous = true, true
			c.Gateway.ID = "gw1"
			a := configs.DefaultAdapter("lw")
			a.Devices = []string{"canary-*"}
			c.Plugins.Adapters = []configs.AdapterConfig{a}
		}, `canary.device: "canary-gw1" is one of adapter "lw"'s devices ("canary-*"): the canary must be a device of its own`},
		{"max_lease off", func(c *configs.Config) { c.Presence.MaxLease = 0 }, ""},
		{"max_lease equal to lease", func(c *configs.Config) { c.Presence.MaxLease = sec(90) }, ""},
		{"max_lease a week", func(c *configs.Config) { c.Presence.MaxLease = sec(7 * 86400) }, ""},
		{"max_lease below lease", func(c *configs.Config) { c.Presence.MaxLease = sec(60) },
			"presence.max_lease: must be 0 (no lease longer than presence.lease) or between presence.lease (90s) and 168h, got 1m"},
		{"max_lease beyond a week", func(c *configs.Config) { c.Presence.MaxLease = sec(7*86400 + 1) },
			"presence.max_lease: must be 0 (no lease longer than presence.lease) or between presence.lease (90s) and 168h, got 168h0m1s"},
		{"max_lease negative", func(c *configs.Config) { c.Presence.MaxLease = sec(-1) },
			"presence.max_lease: must be 0 (no lease longer than presence.lease) or between presence.lease (90s) and 168h, got -1s"},
		{"runner batch bounds", func(c *configs.Config) { c.Runner.Batch = 0 },
			"runner.batch: must be between 1 and 10000, got 0"},
		{"runner batch max", func(c *configs.Config) { c.Runner.Batch = 10000 }, ""},
		{"events max_len minimum", func(c *configs.Config) { c.Events.MaxLen = 1000 }, ""},
		{"events max_len below the shard count", func(c *configs.Config) {
			c.Presence.Shards = 2000
			c.Events.MaxLen = 1999
		}, "events.max_len: 1999 is shared by presence.shards 2000 streams and leaves them no room; raise it to at least 2000"},
		{"listeners disabled", func(c *configs.Config) { c.Listen = configs.ListenConfig{} }, ""},
		{"port 0 twice is fine", func(c *configs.Config) {
			c.Listen.MQTT = configs.MQTTListen{TCP: "127.0.0.1:0", TLS: "127.0.0.1:0", CertFile: "c.pem", KeyFile: "k.pem"}
		}, ""},
		{"same port different hosts", func(c *configs.Config) {
			c.Listen.MQTT = configs.MQTTListen{TCP: "127.0.0.1:1883", TLS: "127.0.0.2:1883", CertFile: "c.pem", KeyFile: "k.pem"}
		}, ""},
		{"no way for a device to authenticate", func(c *configs.Config) { c.Auth.DevicesFile = "" },
			"auth.devices_file: must be set when auth.allow_anonymous is off, or no device could connect"},
		{"anonymous devices need no file", func(c *configs.Config) { c.Auth.DevicesFile, c.Auth.AllowAnonymous = "", true }, ""},
		{"dtls without devices file", func(c *configs.Config) {
			c.Auth.DevicesFile, c.Auth.AllowAnonymous, c.Listen.CoAP.DTLS = "", true, ":5684"
		}, "listen.coap.dtls: needs auth.devices_file (the devices' pre-shared keys)"},
		{"tls without certificate", func(c *configs.Config) { c.Listen.MQTT.TLS = ":8883"; c.Listen.MQTT.CertFile = "" },
			"listen.mqtt.tls: needs listen.mqtt.cert_file and listen.mqtt.key_file"},
		{"profiles without the admin api", func(c *configs.Config) { c.Listen.Admin.HTTP, c.Listen.Admin.Pprof = "", true },
			"listen.admin.pprof: needs listen.admin.http (the admin API is off)"},
		{"topic prefix with wildcard", func(c *configs.Config) { c.Auth.TopicPrefix = "dev/+" },
			`auth.topic_prefix: must be a topic without wildcards or a leading or trailing '/', got "dev/+"`},
		{"limits out of range", func(c *configs.Config) {
			c.Limits.MQTTMaxPacketSize, c.Limits.CoAPMaxMessageSize, c.Limits.CoAPRequestsPerSecond = 10, 70000, 0
		}, "limits.mqtt_max_packet_size: must be between 128 and 268435460 bytes, got 10\n" +
			"limits.coap_max_message_size: must be between 64 and 65507 bytes (one UDP datagram), got 70000\n" +
			"limits.coap_requests_per_second: must be >= 1, got 0"},
		{"dtls limits", func(c *configs.Config) {
			c.Limits.DTLSMaxPeers, c.Limits.DTLSIdleTimeout = 0, 0
		}, "limits.dtls_max_peers: must be >= 1, got 0\n" +
			"limits.dtls_idle_timeout: must be > 0, got 0s"},
		{"mqtt state limits", func(c *configs.Config) {
			c.Limits.MQTTMaxInflight, c.Limits.MQTTMaxRetainedPerDevice, c.Limits.MQTTMaxRetainedBytes = 65536, 0, 1000
		}, "limits.mqtt_max_inflight: must be between 1 and 65535, got 65536\n" +
			"limits.mqtt_max_retained_per_device: must be >= 1, got 0\n" +
			"limits.mqtt_max_retained_bytes: must be at least limits.mqtt_max_retained_bytes_per_device (65536), got 1000"},
		{"mqtt retained bytes per device", func(c *configs.Config) { c.Limits.MQTTMaxRetainedBytesPerDevice, c.Limits.MQTTMaxInflight = 0, 0 },
			"limits.mqtt_max_inflight: must be between 1 and 65535, got 0\n" +
				"limits.mqtt_max_retained_bytes_per_device: must be >= 1, got 0"},
		{"anonymous limits", func(c *configs.Config) { c.Limits.AnonymousMaxDevices, c.Limits.AnonymousConnectsPerSecond = 0, -1 },
			"limits.anonymous_max_devices: must be >= 1, got 0\n" +
				"limits.anonymous_connects_per_second: must be >= 1, got -1"},
		{"same port udp and tcp", func(c *configs.Config) { c.Listen.CoAP.UDP = ":1883" }, ""},
		{"admin beyond loopback without a token", func(c *configs.Config) { c.Listen.Admin.HTTP = "0.0.0.0:9180" },
			`listen.admin.http: "0.0.0.0:9180" is reachable beyond this host and the admin API would have no authentication (listen.admin.token_file is empty): set a token_file, bind it to 127.0.0.1, or set listen.admin.insecure: true to serve it to anyone who reaches it`},
		{"admin on every interface without a token", func(c *configs.Config) { c.Listen.Admin.HTTP = ":9180" },
			`listen.admin.http: ":9180" is reachable beyond this host and the admin API would have no authentication (listen.admin.token_file is empty): set a token_file, bind it to 127.0.0.1, or set listen.admin.insecure: true to serve it to anyone who reaches it`},
		{"admin on a host name without a token", func(c *configs.Config) { c.Listen.Admin.HTTP = "gw.example:9180" },
			`listen.admin.http: "gw.example:9180" is reachable beyond this host and the admin API would have no authentication (listen.admin.token_file is empty): set a token_file, bind it to 127.0.0.1, or set listen.admin.insecure: true to serve it to anyone who reaches it`},
		{"admin beyond loopback with a token", func(c *configs.Config) {
			c.Listen.Admin.HTTP, c.Listen.Admin.TokenFile = "[::]:9180", "/etc/fleetgate/admin-token"
		}, ""},
		{"admin beyond loopback, insecure", func(c *configs.Config) {
			c.Listen.Admin.HTTP, c.Listen.Admin.Insecure = "192.0.2.10:9180", true
		}, ""},
		{"admin on loopback names", func(c *configs.Config) { c.Listen.Admin.HTTP = "localhost:9180" }, ""},
		{"admin on IPv6 loopback", func(c *configs.Config) { c.Listen.Admin.HTTP = "[::1]:9180" }, ""},
		{"admin off", func(c *configs.Config) { c.Listen.Admin.HTTP = "" }, ""},
		{"admin on the mqtt port", func(c *configs.Config) { c.Listen.Admin.HTTP = "127.0.0.1:1883" },
			`listen.admin.http: "127.0.0.1:1883" and listen.mqtt.tcp ("127.0.0.1:1883") bind the same tcp port`},
		{"dtls on the udp port", func(c *configs.Config) { c.Listen.CoAP.DTLS = "[::]:5683" },
			`listen.coap.dtls: "[::]:5683" and listen.coap.udp ("127.0.0.1:5683") bind the same udp port`},
		{"gateway id empty", func(c *configs.Config) { c.Gateway.ID = "" },
			`gateway.id: "": gateway id: invalid device id: empty`},
		{"gateway id of a lost marker", func(c *configs.Config) { c.Gateway.ID = "L12" },
			`gateway.id: "L12": gateway id "L12": invalid device id: "L" followed by digits names a lost gateway's marker in the store`},
		{"several problems, all reported", func(c *configs.Config) {
			c.Presence.Shards = 0
			c.Store.Backend = "Redis"
			c.Events.MaxLen = 0
		}, "presence.shards: must be between 1 and 16384, got 0\n" +
			`store.backend: must be embedded or redis, got "Redis"` + "\n" +
			"events.max_len: must be >= 1000, got 0"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := configs.Default()
			tc.change(&c)
			err := c.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("unexpected error:\n%v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("no error, want:\n%s", tc.want)
			case tc.want != "" && err.Error() != tc.want:
				t.Fatalf("error:\n%v\nwant:\n%s", err, tc.want)
			}
		})
	}
}

func TestBounds(t *testing.T) {
	b := configs.Default().Bounds()
	want := configs.Bounds{
		Suspect:                       sec(45),
		EarliestOffline:               sec(70),
		WorstCaseDetection:            sec(94),
		WorstCaseDetectionFailover:    sec(99),
		WorstCaseDetectionLostGateway: sec(151),
		AfterStoreOutage:              sec(64),
		Leave:                         sec(3),
		LeaveHeld:                     sec(7),
		LeaveCut:                      sec(154),
		HeartbeatMargin:               sec(9),
		MaxLease:                      sec(90),
		MaxLeaseHeartbeat:             sec(30),
		WorstCaseDetectionMaxLease:    sec(94),
	}
	if !reflect.DeepEqual(b, want) {
		t.Fatalf("bounds %+v, want %+v", b, want)
	}
	const text = "" +
		"suspect after            45s      presence.suspect_after without evidence\n" +
		"earliest offline         70s      lease - renew_every after the last evidence\n" +
		"worst-case detection     94s      lease + 3 x uplink.flush_interval (the gateway's coverage) + runner.interval after the last evidence, plus backlog processing\n" +
		"  after runner failover  99s      + runner.lock_ttl when a runner dies holding a shard\n" +
		"  of a lost gateway      151s     lease + gateway_grace + runner.interval, for devices of a gateway the store does not hear\n" +
		"  after a store outage   64s      gateway_grace + 3 x uplink.flush_interval + runner.interval after the store answers again, if later\n" +
		"offline after a leave    3s       3 x uplink.flush_interval (the leave grace, then a flush)\n" +
		"  a gateway lagging      7s       + 3 x uplink.flush_interval (its coverage) + runner.interval\n" +
		"  a gateway cut          154s     + lease + gateway_grace + runner.interval (until its horizon ends)\n" +
		"heartbeat margin         9s       lease - renew_every - uplink.flush_interval - 2 x heartbeat_interval\n" +
		"longest device lease     90s      presence.max_lease (a lease asked with l=, of the devices file, of an adapter, learned), lease when 0\n" +
		"  heartbeat asked        30s      its Max-Age: longest device lease - (lease - heartbeat_interval)\n" +
		"  worst-case detection   94s      longest device lease + 3 x uplink.flush_interval + runner.interval after its last evidence\n"
	if got := b.String(); got != text {
		t.Fatalf("String():\n%s\nwant:\n%s", got, text)
	}
	// A device may ask for up to a day.
	c := configs.Default()
	c.Presence.MaxLease = configs.Duration(24 * time.Hour)
	if b := c.Bounds(); b.MaxLease != sec(86400) || b.MaxLeaseHeartbeat != sec(86400-60) || b.WorstCaseDetectionMaxLease != sec(86404) {
		t.Fatalf("bounds with max_lease 24h: %+v", b)
	}
	// Learned leases and an adapter's lease: a worst case per class.
	c.Presence.LearnLease = true
	c.Plugins.Adapters = []configs.AdapterConfig{{Name: "lorawan", Lease: configs.Duration(2 * time.Hour)}, {Name: "udpline"}}
	b = c.Bounds()
	if b.WorstCaseDetectionLearned != sec(86404) || !reflect.DeepEqual(b.Adapters, []configs.ClassBound{{Name: "adapter lorawan", Lease: sec(7200), WorstCaseDetection: sec(7204)}}) {
		t.Fatalf("bounds with learned leases and an adapter's lease: %+v", b)
	}
	for _, line := range []string{
		"learned lease detection  24h0m4s  presence.learn_lease: at most that of the longest device lease (max_lease until a device's period is learned)\n",
		"adapter lorawan          2h0m4s   its lease 2h + 3 x uplink.flush_interval + runner.interval after its last evidence\n",
	} {
		if !strings.Contains(b.String(), line) {
			t.Errorf("String() has no line %q:\n%s", line, b.String())
		}
	}
}

// The uplink probes a down store at least every eighth of the lease
// (bounded to 100 ms..10 s), so that an outage ends for a gateway well
// inside lease + gateway_grace.
func TestUplinkProbeMax(t *testing.T) {
	for _, tc := range []struct{ lease, want time.Duration }{
		{90 * time.Second, 10 * time.Second},
		{40 * time.Second, 5 * time.Second},
		{4 * time.Second, 500 * time.Millisecond},
		{time.Second, 125 * time.Millisecond},
		{500 * time.Millisecond, 100 * time.Millisecond},
	} {
		c := configs.Default()
		c.Presence.Lease = configs.Duration(tc.lease)
		if got := c.UplinkProbeMax(); got != tc.want {
			t.Errorf("lease %v: probe max %v, want %v", tc.lease, got, tc.want)
		}
	}
}
