package mqtt

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/mochi-mqtt/server/v2/packets"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/crypto/bcrypt"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/gatewaytest"
)

// The attacks of docs/security.md against the MQTT front end, each with what the
// legitimate device experiences during it.

// Attack: with allow_anonymous and a devices file, a CONNECT as the
// listed device alpha without a password was accepted and took alpha's
// connection over. Now it is refused, and alpha stays connected.
func TestAnonymousCannotImpersonateListedDevice(t *testing.T) {
	rec := &recorder{}
	creds := newCreds(t, map[gateway.DeviceID]string{"alpha": "alpha-pw"})
	s := startServer(t, rec, Options{Credentials: creds, AllowAnonymous: true})
	alpha := mustConnectV5(t, s, "alpha", "alpha-pw")
	for _, v := range []byte{4, 5} {
		r := dialRaw(t, tcpAddr(s))
		want := packets.ErrNotAuthorized.Code
		if v == 4 {
			want = packets.Err3NotAuthorized.Code
		}
		if code := r.connack(connectPacket(t, v, "alpha", "", 30)); code != want {
			t.Fatalf("anonymous v%d CONNECT as alpha: %#x, want %#x", v, code, want)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := alpha.Publish(ctx, &paho.Publish{Topic: "devices/alpha/t", QoS: 1}); err != nil {
		t.Fatalf("alpha after the attempts: %v", err)
	}
	select {
	case d := <-alpha.disconnected:
		t.Fatalf("alpha was disconnected: %+v", d)
	default:
	}
	for _, ev := range rec.Evidence() {
		if ev.Device != "alpha" || ev.Session != rec.SessionOf("alpha") {
			t.Fatalf("evidence of another session: %+v", ev)
		}
	}
	// An unlisted device is still admitted anonymously.
	mustConnectV5(t, s, "stranger", "")
}

// discardUplink accepts every write of a session table.
type discardUplink struct{}

func (discardUplink) Enqueue(context.Context, gateway.Evidence) error { return nil }

// Attack: one device's credentials open session after session (each
// MQTT connection is one), growing its central record without bound.
// Beyond limits.max_sessions_per_device the CONNECT gets "quota exceeded"
// and is counted.
func TestSessionsPerDeviceQuotaExceeded(t *testing.T) {
	table := gateway.NewTable(discardUplink{}, gateway.TableOptions{MaxSessionsPerDevice: 3})
	creds := newCreds(t, map[gateway.DeviceID]string{"alpha": "alpha-pw", "beta": "beta-pw"})
	s := startServer(t, table, Options{Credentials: creds, Registerer: prometheus.NewRegistry()})
	for i := range 3 { // each takes the previous one over: three sessions
		mustConnectV5(t, s, "alpha", "alpha-pw")
		if n := len(table.Sessions("alpha")); n != i+1 {
			t.Fatalf("alpha has %d sessions, want %d", n, i+1)
		}
	}
	if code := connackCode(t, s, &paho.Connect{ClientID: "alpha", CleanStart: true, Password: []byte("alpha-pw"), PasswordFlag: true}); code != packets.ErrQuotaExceeded.Code {
		t.Fatalf("fourth session: CONNACK %#x, want quota exceeded", code)
	}
	r := dialRaw(t, tcpAddr(s))
	if code := r.connack(connectPacket(t, 4, "alpha", "alpha-pw", 30)); code != packets.Err3ServerUnavailable.Code {
		t.Fatalf("fourth session, 3.1.1: CONNACK %#x", code)
	}
	if n := value(t, s.metrics.refused[reasonSessionLimit]); n != 2 {
		t.Fatalf("refused session_limit = %v, want 2", n)
	}
	if table.SessionLimitRefusals() != 2 {
		t.Fatalf("table refusals %d", table.SessionLimitRefusals())
	}
	mustConnectV5(t, s, "beta", "beta-pw") // another device is not affected
}

// Attack: after a device was removed from the devices file and the file
// reloaded, its open connection could still publish and its subscription
// still delivered. A reload now disconnects the connections of removed
// devices, of devices whose password changed, and anonymous ones whose
// device became listed; the others stay.
func TestReloadRevokesConnections(t *testing.T) {
	creds := newCreds(t, map[gateway.DeviceID]string{"alpha": "a", "beta": "b", "gamma": "c"})
	s := startServer(t, &recorder{}, Options{Credentials: creds, AllowAnonymous: true, Registerer: prometheus.NewRegistry()})
	alpha := mustConnectV5(t, s, "alpha", "a")
	beta := mustConnectV5(t, s, "beta", "b")
	gamma := mustConnectV5(t, s, "gamma", "c")
	anon := mustConnectV5(t, s, "delta", "")
	alpha3, code, err := connectV3(t, tcpAddr(s), nil, "alpha", "a", 30*time.Second)
	if err != nil || code != 0 {
		t.Fatalf("3.1.1 alpha: %#x %v", code, err)
	}
	_ = alpha // taken over by alpha3
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := gamma.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "devices/gamma/#"}}}); err != nil {
		t.Fatal(err)
	}

	next := bcryptCreds{"gamma": creds["gamma"]}
	next["beta"] = newCreds(t, map[gateway.DeviceID]string{"beta": "b2"})["beta"]
	next["delta"] = newCreds(t, map[gateway.DeviceID]string{"delta": "d"})["delta"]
	s.SetCredentials(next)

	for name, c := range map[string]*v5{"beta": beta, "delta": anon} {
		select {
		case d := <-c.disconnected:
			if d.ReasonCode != packets.ErrNotAuthorized.Code {
				t.Errorf("%s: DISCONNECT %#x, want not authorized", name, d.ReasonCode)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("%s still connected after the reload", name)
		}
	}
	eventually(t, 5*time.Second, "3.1.1 alpha disconnected", func() bool { return !alpha3.IsConnectionOpen() })
	if n := value(t, s.metrics.refused[reasonRevoked]); n != 3 {
		t.Fatalf("revoked = %v, want 3", n)
	}
	// gamma, unchanged, keeps publishing to itself and receiving.
	if _, err := gamma.Publish(ctx, &paho.Publish{Topic: "devices/gamma/t", QoS: 1, Payload: []byte("x")}); err != nil {
		t.Fatalf("gamma after the reload: %v", err)
	}
	select {
	case <-gamma.received:
	case <-time.After(5 * time.Second):
		t.Fatal("gamma's subscription does not deliver after the reload")
	}
	if code := connackCode(t, s, &paho.Connect{ClientID: "alpha", CleanStart: true, Password: []byte("a"), PasswordFlag: true}); code != packets.ErrNotAuthorized.Code {
		t.Fatalf("removed alpha reconnects: %#x", code)
	}
	// nil is refused (as by the CoAP server): the reloaded credentials
	// stay, and revoke nothing more
	s.SetCredentials(nil)
	if _, err := gamma.Publish(ctx, &paho.Publish{Topic: "devices/gamma/t", QoS: 1, Payload: []byte("y")}); err != nil {
		t.Fatalf("gamma after SetCredentials(nil): %v", err)
	}
	if n := value(t, s.metrics.refused[reasonRevoked]); n != 3 {
		t.Fatalf("revoked = %v after SetCredentials(nil), want 3", n)
	}
	if code := connackCode(t, s, &paho.Connect{ClientID: "beta", CleanStart: true, Password: []byte("b2"), PasswordFlag: true}); code != 0 {
		t.Fatalf("beta with its reloaded password after SetCredentials(nil): %#x", code)
	}
}

// Attack: two source addresses sending 20 CONNECTs/s each, with random
// IDs and passwords, kept the real device refused with "server busy":
// unknown IDs got a full bcrypt check each, more than the CPU can do. Now
// (auth's guard) unknown IDs share a small budget of comparisons and the
// others only wait, so the real device, with a password at the default
// bcrypt cost, connects within 1 s every time during the flood.
func TestPasswordFloodDoesNotLockOut(t *testing.T) {
	s, bound := alphaServer(t)
	addr := tcpAddr(s)

	ctx, stop := context.WithTimeout(context.Background(), 3*(time.Second+bound)+time.Second)
	defer stop()
	var flood sync.WaitGroup
	for _, src := range []string{"127.0.0.2", "127.0.0.3"} {
		flood.Go(func() {
			connectFlood(ctx, addr, src, time.Second/20, func() []byte { // random IDs and passwords
				return connectPacket(t, 5, fmt.Sprintf("x%08x", rand.Uint32()), fmt.Sprintf("p%08x", rand.Uint32()), 30)
			})
		})
	}
	for i := range 3 {
		select {
		case <-time.After(time.Second):
		case <-ctx.Done():
			t.Fatal("flood over before the device tried")
		}
		start := time.Now()
		code := connackCode(t, s, &paho.Connect{ClientID: "alpha", KeepAlive: 30, CleanStart: true, Password: []byte("alpha-pw"), PasswordFlag: true})
		if took := time.Since(start); code != 0 || took > bound {
			t.Fatalf("alpha's connect %d during the flood: CONNACK %#x after %v, want 0 within %v", i, code, took, bound)
		}
		t.Logf("alpha's connect %d during the flood: %v", i, time.Since(start))
	}
	stop()
	flood.Wait()
}

// Attack: one CONNECT as alpha with a wrong password every 300 ms from
// 127.0.0.2. The backoff was per device and refused the right password
// too, so alpha (its password not cached, as after a restart) stayed out
// from anywhere: once the backoff reached 8 s, alpha retrying every
// 500 ms got in only in the moment between the end of a backoff and the
// attacker's next try (measured: after 7.8 s and 14 tries in one run,
// not within 20 s in another). Now the backoff is per source address and
// device: alpha connecting from 127.0.0.1 gets in at its first try during
// the attack.
func TestWrongPasswordsElsewhereDoNotLockOut(t *testing.T) {
	s, bound := alphaServer(t)
	addr := tcpAddr(s)

	ctx, stop := context.WithTimeout(context.Background(), 30*time.Second)
	defer stop()
	var attack sync.WaitGroup
	attack.Go(func() {
		connectFlood(ctx, addr, "127.0.0.2", 300*time.Millisecond, func() []byte { return connectPacket(t, 5, "alpha", "wrong", 30) })
	})
	select { // the attack has doubled the device's backoff to 8 s
	case <-time.After(9 * time.Second):
	case <-ctx.Done():
	}
	start := time.Now()
	tries := 0
	for code := byte(0xff); code != 0; tries++ {
		if time.Since(start) > 20*time.Second {
			t.Fatalf("alpha still refused (CONNACK %#x) after %d tries in %v during the attack", code, tries, time.Since(start))
		}
		if tries > 0 {
			time.Sleep(500 * time.Millisecond) // as a device retries
		}
		code = connackCode(t, s, &paho.Connect{ClientID: "alpha", KeepAlive: 30, CleanStart: true, Password: []byte("alpha-pw"), PasswordFlag: true})
	}
	took := time.Since(start)
	t.Logf("alpha got in after %v, %d tries, during one wrong password every 300 ms from 127.0.0.2", took, tries)
	if tries != 1 || took > bound {
		t.Fatalf("alpha got in after %d tries in %v, want at the first within %v", tries, took, bound)
	}
	stop()
	attack.Wait()
}

// alphaServer serves the devices file of one device, alpha, whose
// password "alpha-pw" has the default bcrypt cost (3 less under the race
// detector), and returns the bound of a connect of alpha: 1 s, or on a
// slower machine (the race detector makes bcrypt ten times slower) three
// bare comparisons timed here.
func alphaServer(t *testing.T) (*Server, time.Duration) {
	t.Helper()
	cost := auth.DefaultCost
	if raceEnabled {
		cost -= 3
	}
	hash, err := auth.HashPassword([]byte("alpha-pw"), cost)
	if err != nil {
		t.Fatal(err)
	}
	devices, err := auth.Parse("devices.yaml", fmt.Appendf(nil, "devices:\n  - id: alpha\n    password_bcrypt: %q\n", hash))
	if err != nil {
		t.Fatal(err)
	}
	s := startServer(t, &recorder{}, Options{Credentials: devices, Registerer: prometheus.NewRegistry()})
	start := time.Now()
	_ = bcrypt.CompareHashAndPassword([]byte(hash), []byte("alpha-pw"))
	bound := max(time.Second, 3*time.Since(start))
	if raceEnabled {
		bound *= 2
	}
	return s, bound
}

// connectFlood sends a CONNECT every interval from source address src to
// addr, each made by connect, until ctx ends; it does not wait for the
// answers, as an attacker would not.
func connectFlood(ctx context.Context, addr, src string, every time.Duration, connect func() []byte) {
	tick := time.NewTicker(every)
	defer tick.Stop()
	var conns []net.Conn
	defer func() {
		for _, c := range conns {
			_ = c.Close()
		}
	}()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: time.Second}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		c, err := d.DialContext(ctx, "tcp", addr)
		if err != nil {
			continue
		}
		conns = append(conns, c)
		_, _ = c.Write(connect())
	}
}

// silentConns opens n TCP connections from src to addr that never send
// CONNECT; they close with the test.
func silentConns(t *testing.T, addr, src string, n int) []net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: 5 * time.Second}
	var out []net.Conn
	for range n {
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial from %s: %v", src, err)
		}
		t.Cleanup(func() { _ = c.Close() })
		out = append(out, c)
	}
	return out
}

// closedSoon reports whether the server closes c within d.
func closedSoon(c net.Conn, d time.Duration) bool {
	_ = c.SetReadDeadline(time.Now().Add(d))
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// Attack: connections that never send CONNECT each held a goroutine and
// buffers for the 10 s connect timeout, without bound. Now one address
// holds at most maxPendingPerAddr of them, one network (/24, /64)
// maxPendingPerPrefix and all together maxPending; beyond, a new
// connection is closed at accept and counted.
func TestPendingConnectionsBounded(t *testing.T) {
	s := newServer(t, &recorder{}, Options{Credentials: testCreds(t), ConnectsPerSecond: 10000, Registerer: prometheus.NewRegistry()})
	s.pend = newPendingConns(4, 6, 10)
	gatewaytest.Serve(t, s)
	addr := tcpAddr(s)

	held := silentConns(t, addr, "127.0.0.2", 4)
	if extra := silentConns(t, addr, "127.0.0.2", 1)[0]; !closedSoon(extra, 2*time.Second) {
		t.Fatal("a fifth silent connection from one address was kept")
	}
	silentConns(t, addr, "127.0.0.3", 2) // six in 127.0.0.0/24
	if extra := silentConns(t, addr, "127.0.0.4", 1)[0]; !closedSoon(extra, 2*time.Second) {
		t.Fatal("a seventh silent connection from one /24 was kept")
	}
	silentConns(t, addr, "127.0.1.2", 4) // ten in all
	if extra := silentConns(t, addr, "127.0.2.2", 1)[0]; !closedSoon(extra, 2*time.Second) {
		t.Fatal("an eleventh silent connection was kept")
	}
	if closedSoon(held[0], 100*time.Millisecond) {
		t.Fatal("a connection within the bounds was closed")
	}
	if n := value(t, s.metrics.refused[reasonPending]); n != 3 {
		t.Fatalf("refused pending = %v, want 3", n)
	}
	// A connection that sends CONNECT no longer counts: after one of
	// 127.0.0.2's sends it, another may wait.
	if code := (&raw{Conn: held[0], t: t}).connack(connectPacket(t, 5, "dev-1", "secret-1", 30)); code != 0 {
		t.Fatalf("connack %#x", code)
	}
	if c := silentConns(t, addr, "127.0.0.2", 1)[0]; closedSoon(c, 200*time.Millisecond) {
		t.Fatal("the place freed by a CONNECT was not given")
	}
}

// Attack: 128 addresses, each at its bound of 32 silent connections,
// filled all 4,096 places for connections without CONNECT, and every
// other client was closed at accept. Now the addresses of one network
// (here 16 addresses of one /24, 512 connections) hold at most
// maxPendingPerPrefix places together, and a device of another network
// connects.
func TestPendingConnectionsPerNetwork(t *testing.T) {
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), ConnectsPerSecond: 10000, Registerer: prometheus.NewRegistry()})
	addr := tcpAddr(s)
	attempts := 0
	for a := range 16 {
		attempts += len(silentConns(t, addr, fmt.Sprintf("127.0.3.%d", a+1), maxPendingPerAddr))
	}
	refused := float64(attempts - maxPendingPerPrefix)
	eventually(t, 10*time.Second, "the connections beyond the /24's bound refused", func() bool {
		return value(t, s.metrics.refused[reasonPending]) >= refused
	})
	s.pend.mu.Lock()
	held := s.pend.n
	s.pend.mu.Unlock()
	if n := value(t, s.metrics.refused[reasonPending]); held != maxPendingPerPrefix || n != refused {
		t.Fatalf("one /24 holds %d connections without CONNECT (%v refused), want %d", held, n, maxPendingPerPrefix)
	}
	mustConnectV5(t, s, "dev-1", "secret-1")
}

// During a flood of silent connections from 20 addresses of 20 networks,
// each at its bound, a real device connects within 1 s.
func TestSilentConnectionFlood(t *testing.T) {
	s := startServer(t, &recorder{}, Options{Credentials: testCreds(t), ConnectsPerSecond: 10000, Registerer: prometheus.NewRegistry()})
	addr := tcpAddr(s)
	for a := range 20 {
		src := fmt.Sprintf("127.0.%d.1", a+10)
		silentConns(t, addr, src, maxPendingPerAddr)
		if extra := silentConns(t, addr, src, 1)[0]; !closedSoon(extra, 2*time.Second) {
			t.Fatalf("%s: a silent connection beyond %d was kept", src, maxPendingPerAddr)
		}
	}
	start := time.Now()
	mustConnectV5(t, s, "dev-1", "secret-1")
	if took := time.Since(start); took > time.Second {
		t.Fatalf("real device connected after %v during the flood, want within 1 s", took)
	}
}
