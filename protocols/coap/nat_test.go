package coap

import (
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

// code sends a CON heartbeat of device on c and returns the answer's code.
func code(t *testing.T, c *net.UDPConn, mid uint16, device string) codes.Code {
	t.Helper()
	b, ok := exchange(t, c, datagram(t, message.Confirmable, codes.POST, mid, "/hb", "d="+device), 5*time.Second)
	if !ok {
		t.Fatalf("%s: no answer", device)
	}
	return decode(t, b).Code()
}

// limited sends a CON heartbeat of device on c that is beyond a rate
// limit, and fails the test if it is answered.
func limited(t *testing.T, c *net.UDPConn, mid uint16, device string) {
	t.Helper()
	if b, ok := exchange(t, c, datagram(t, message.Confirmable, codes.POST, mid, "/hb", "d="+device), 300*time.Millisecond); ok {
		t.Fatalf("%s beyond the rate: answered %v, want no answer", device, decode(t, b).Code())
	}
}

// The limits count per source endpoint (address and port) and per device,
// and a source address (all its ports) gets ratelimit.AddressFactor times
// the rate.
func TestRateLimitPerEndpointDeviceAndAddress(t *testing.T) {
	clock := clocktest.New(start)
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true, RequestsPerSecond: 2, Clock: clock})
	a, b := rawConn(t, s), rawConn(t, s)
	for i := range 2 {
		if got := code(t, a, uint16(i), fmt.Sprintf("a-%d", i)); got != codes.Changed {
			t.Fatalf("endpoint a, request %d: %v", i, got)
		}
	}
	limited(t, a, 2, "a-2")
	// Another port of the same address is another endpoint.
	if got := code(t, b, 3, "b-0"); got != codes.Changed {
		t.Fatalf("endpoint b while a is limited: %v, want 2.04", got)
	}
	// One device through several endpoints is limited as one.
	for i := range 2 {
		if got := code(t, rawConn(t, s), uint16(10+i), "roamer"); got != codes.Changed {
			t.Fatalf("device roamer, request %d from a new endpoint: %v", i, got)
		}
	}
	limited(t, rawConn(t, s), 12, "roamer")
	// The address: 2 × ratelimit.AddressFactor datagrams a second over
	// all its ports. 6 were taken above (a's refused one did not count,
	// roamer's refused one did); one endpoint per datagram spends the rest.
	for i := range 2*ratelimit.AddressFactor - 6 {
		if got := code(t, rawConn(t, s), uint16(100+i), fmt.Sprintf("n-%d", i)); got != codes.Changed {
			t.Fatalf("datagram %d of the address: %v", i, got)
		}
	}
	limited(t, rawConn(t, s), 9999, "n-last")
	clock.Advance(time.Second)
	if got := code(t, rawConn(t, s), 9998, "n-next"); got != codes.Changed {
		t.Fatalf("a second later: %v, want 2.04", got)
	}
}

// Load: 2,000 devices behind one address (each on its own source port, as
// behind a NAT) at a 1 s heartbeat, with the default limits, are all
// answered 2.04, while a flooder on another port of the same address gets
// no answer beyond its own rate.
func TestManyDevicesBehindOneAddress(t *testing.T) {
	const (
		devices = 2000
		rounds  = 3
		flood   = 2000 // datagrams a second from the flooder
	)
	reg := prometheus.NewRegistry()
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true, RequestsPerSecond: DefaultRequestsPerSecond, Registerer: reg})
	type tally struct{ changed, limited, other atomic.Int64 }
	var devs, flooder tally
	var readers sync.WaitGroup
	listen := func(c *net.UDPConn, into *tally) {
		readers.Add(1)
		go func() {
			defer readers.Done()
			buf := make([]byte, 512)
			for {
				n, err := c.Read(buf)
				if err != nil {
					return // closed at the end of the test
				}
				m := pool.NewMessage(context.Background())
				if _, err := m.UnmarshalWithDecoder(coder.DefaultCoder, buf[:n]); err != nil {
					into.other.Add(1)
					continue
				}
				switch m.Code() {
				case codes.Changed:
					into.changed.Add(1)
				case codes.TooManyRequests:
					into.limited.Add(1)
				default:
					into.other.Add(1)
				}
			}
		}()
	}
	conns := make([]*net.UDPConn, devices)
	beats := make([][]byte, devices)
	for i := range conns {
		c, err := net.DialUDP("udp", nil, s.Addr().(*net.UDPAddr))
		if err != nil {
			t.Fatalf("socket %d: %v", i, err)
		}
		conns[i] = c
		beats[i] = datagram(t, message.Confirmable, codes.POST, uint16(i), "/hb", fmt.Sprintf("d=nat-%d", i))
		listen(c, &devs)
	}
	fc, err := net.DialUDP("udp", nil, s.Addr().(*net.UDPAddr))
	if err != nil {
		t.Fatal(err)
	}
	listen(fc, &flooder)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
		fc.Close()
		readers.Wait()
	})

	stop := make(chan struct{})
	var flooded atomic.Int64
	var flooding sync.WaitGroup
	flooding.Add(1)
	go func() {
		defer flooding.Done()
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for mid := 0; ; {
			select {
			case <-stop:
				return
			case <-tick.C:
			}
			for range flood / 100 {
				mid++
				if _, err := fc.Write(datagram(t, message.Confirmable, codes.POST, uint16(mid), "/hb", "d=flooder")); err == nil {
					flooded.Add(1)
				}
			}
		}
	}()
	// Each round spreads the devices' heartbeats over one second.
	begin := time.Now()
	for r := range rounds {
		for i, c := range conns {
			if due := begin.Add(time.Duration(r)*time.Second + time.Duration(i)*time.Second/devices); time.Until(due) > 0 {
				time.Sleep(time.Until(due))
			}
			if _, err := c.Write(beats[i]); err != nil {
				t.Fatalf("device %d: %v", i, err)
			}
		}
	}
	close(stop)
	flooding.Wait()
	// the flooder's endpoint earns DefaultRequestsPerSecond a second, on a
	// loaded machine for longer than the rounds' nominal seconds
	floodFor := time.Since(begin)
	eventually(t, 10*time.Second, "every heartbeat answered", func() bool {
		return devs.changed.Load()+devs.limited.Load()+devs.other.Load() >= devices*rounds
	})
	dropped := func() int64 { return int64(gather(t, reg)[`fleetgate_coap_dropped_total{reason="rate_limited"}`]) }
	t.Logf("%d heartbeats of %d devices in %v: %d × 2.04, %d × 4.29; flooder: %d sent, %d × 2.04, %d × 4.29, %d dropped",
		devices*rounds, devices, time.Since(begin).Round(time.Millisecond), devs.changed.Load(), devs.limited.Load(),
		flooded.Load(), flooder.changed.Load(), flooder.limited.Load(), dropped())
	if devs.changed.Load() != devices*rounds || devs.limited.Load() != 0 || devs.other.Load() != 0 {
		t.Fatalf("devices: %d × 2.04, %d × 4.29, %d other; want all %d answered 2.04",
			devs.changed.Load(), devs.limited.Load(), devs.other.Load(), devices*rounds)
	}
	eventually(t, 5*time.Second, "the flooder answered or dropped", func() bool {
		return flooder.changed.Load()+dropped() >= flooded.Load()*9/10
	})
	if allowed := int64(float64(DefaultRequestsPerSecond) * (floodFor.Seconds() + 2)); flooder.limited.Load() != 0 || flooder.other.Load() != 0 || flooder.changed.Load() > allowed {
		t.Fatalf("flooder: %d × 2.04, %d × 4.29, %d other of %d; want no answer beyond %d a second",
			flooder.changed.Load(), flooder.limited.Load(), flooder.other.Load(), flooded.Load(), DefaultRequestsPerSecond)
	}
}
