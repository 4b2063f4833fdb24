package mqtt

import (
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
)

// anonymousFlood connects anonymous clients with random IDs from source
// address src to addr, workers at a time, for d; each connection reads
// its CONNACK and closes (no DISCONNECT: its session stays until its
// lease). It returns how many were admitted and how many tried.
func anonymousFlood(t *testing.T, addr, src string, workers int, d time.Duration) (admitted, tried int64) {
	var ok, all atomic.Int64
	deadline := time.Now().Add(d)
	dialer := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			buf := make([]byte, 64)
			for time.Now().Before(deadline) {
				c, err := dialer.Dial("tcp", addr)
				if err != nil {
					continue
				}
				all.Add(1)
				_, _ = c.Write(connectPacket(t, 5, fmt.Sprintf("x%016x", rand.Uint64()), "", 30))
				_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := c.Read(buf); err == nil && n >= 4 && buf[0]>>4 == packets.Connack && buf[3] == 0 {
					ok.Add(1)
				}
				_ = c.Close()
			}
		})
	}
	wg.Wait()
	return ok.Load(), all.Load()
}

// Attack: anonymous clients from one address, each with a new client ID.
// Up to 5,000 connects a second were admitted from one address (250
// times the per-device rate), each making a device, a session and a
// store record, and holding a max_clients slot while it stayed. Now
// anonymous CONNECTs are bounded per source network
// (limits.anonymous_connects_per_second, 100 by default, bursts of as
// many: beyond, 0x9F) and the anonymous devices with sessions by
// limits.anonymous_max_devices. A device with a password, from the same
// address, is not affected.
func TestAnonymousConnectsPerNetwork(t *testing.T) {
	table := gateway.NewTable(discardUplink{}, gateway.TableOptions{})
	s := startServer(t, table, Options{Credentials: testCreds(t), AllowAnonymous: true, Registerer: prometheus.NewRegistry()})
	const d = 2 * time.Second
	start := time.Now()
	admitted, tried := anonymousFlood(t, tcpAddr(s), "127.0.0.2", 8, d)
	took := time.Since(start)
	t.Logf("anonymous connects from one address for %v: %d tried, %d admitted (%.0f/s), %d devices with sessions",
		took.Round(time.Millisecond), tried, admitted, float64(admitted)/took.Seconds(), table.Len())
	if limit := int64(DefaultAnonymousConnectsPerSecond) * int64(took/time.Second+2); admitted > limit || int64(table.Len()) > limit {
		t.Fatalf("%d admitted, %d devices made in %v; want at most %d", admitted, table.Len(), took, limit)
	}
	mustConnectV5(t, s, "dev-1", "secret-1") // from 127.0.0.1, 127.0.0.2's network
}

// Beyond limits.anonymous_max_devices anonymous devices with sessions, a
// new anonymous device gets CONNACK "quota exceeded" (3.1.1: 0x03) and
// is counted; the ones there reconnect, devices with a password connect.
func TestAnonymousDevicesBounded(t *testing.T) {
	table := gateway.NewTable(discardUplink{}, gateway.TableOptions{MaxAnonymousDevices: 5})
	s := startServer(t, table, Options{Credentials: testCreds(t), AllowAnonymous: true, Registerer: prometheus.NewRegistry()})
	for i := range 5 {
		mustConnectV5(t, s, fmt.Sprint("anon-", i), "")
	}
	for _, v := range []byte{5, 4} {
		want := packets.ErrQuotaExceeded.Code
		if v == 4 {
			want = packets.Err3ServerUnavailable.Code
		}
		if code := dialRaw(t, tcpAddr(s)).connack(connectPacket(t, v, "anon-5", "", 30)); code != want {
			t.Fatalf("sixth anonymous device, v%d: CONNACK %#x, want %#x", v, code, want)
		}
	}
	mustConnectV5(t, s, "anon-0", "")
	mustConnectV5(t, s, "dev-1", "secret-1")
	if n := value(t, s.metrics.refused[reasonAnonymousLimit]); n != 2 || table.AnonymousLimitRefusals() != 2 {
		t.Fatalf("refused anonymous_limit %v, table %d; want 2", n, table.AnonymousLimitRefusals())
	}
}
