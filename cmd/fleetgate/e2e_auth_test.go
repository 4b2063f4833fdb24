package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	piondtls "github.com/pion/dtls/v3"
	dtlsnet "github.com/pion/dtls/v3/pkg/net"
	"github.com/plgd-dev/go-coap/v3/dtls"
	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/options"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// writeDevices writes a devices file: dev-pw with an MQTT password,
// dev-psk with a DTLS key.
func writeDevices(t *testing.T, path, password, pskHex string, extra string) {
	t.Helper()
	hash, err := auth.HashPassword([]byte(password), 4)
	if err != nil {
		t.Fatal(err)
	}
	body := fmt.Sprintf("devices:\n  - id: dev-pw\n    password_bcrypt: %q\n  - id: dev-psk\n    psk: \"hex:%s\"\n%s", hash, pskHex, extra)
	if err := os.WriteFile(path, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
}

// mqttConnack connects as id with password and returns the CONNACK
// reason code (0 accepted). An accepted connection is left open until the
// test ends (then dropped, which is no leave).
func mqttConnack(t *testing.T, addr, id, password string) byte {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { nc.Close() })
	c := paho.NewClient(paho.ClientConfig{Conn: nc, OnClientError: func(error) {}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ack, err := c.Connect(ctx, &paho.Connect{ClientID: id, KeepAlive: 30, CleanStart: true, Password: []byte(password), PasswordFlag: true})
	if ack == nil {
		t.Fatalf("mqtt connect %s: no CONNACK: %v", id, err)
	}
	return ack.ReasonCode
}

// dtlsHeartbeat shakes hands with pion (bounded: a refused handshake
// gets no answer) and then sends POST /hb with go-coap's DTLS client; it
// returns the answer's code, or the handshake's error.
func dtlsHeartbeat(addr, identity string, key []byte) (codes.Code, error) {
	raddr, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return 0, err
	}
	c, err := net.DialUDP("udp", nil, raddr)
	if err != nil {
		return 0, err
	}
	dc, err := piondtls.Client(dtlsnet.PacketConnFromConn(c), c.RemoteAddr(), &piondtls.Config{
		PSK:             func([]byte) ([]byte, error) { return key, nil },
		PSKIdentityHint: []byte(identity),
		CipherSuites:    []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
	})
	if err != nil {
		c.Close()
		return 0, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := dc.HandshakeContext(ctx); err != nil {
		dc.Close()
		c.Close()
		return 0, err
	}
	cc := dtls.Client(dc, options.WithErrors(func(error) {}), options.WithCloseSocket())
	defer cc.Close()
	resp, err := cc.Post(ctx, "/hb", message.TextPlain, nil)
	if err != nil {
		return 0, err
	}
	return resp.Code(), nil
}

// With a devices file and anonymous devices off: MQTT passwords and DTLS
// keys are checked, anonymous CoAP is refused with 4.01, a wrong secret
// never becomes evidence, and SIGHUP reloads the file.
func TestE2EDeviceCredentials(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	rc := srv.Client(t)
	devicesFile := filepath.Join(t.TempDir(), "devices.yaml")
	key := []byte("0123456789abcdef")
	writeDevices(t, devicesFile, "pw-1", fmt.Sprintf("%x", key), "")
	gw := newGateway(t, "gw-auth", srv.Addr, fastTiming)
	gw.useDevicesFile(devicesFile)
	gw.start()

	if code := mqttConnack(t, gw.mqttAddr, "dev-pw", "pw-1"); code != 0 {
		t.Fatalf("right password: CONNACK 0x%x, want accepted", code)
	}
	// (A wrong password puts dev-pw in a short backoff; its verified
	// password above is still accepted from the cache: auth/guard.go.)
	if code := mqttConnack(t, gw.mqttAddr, "dev-pw", "wrong"); code != 0x86 && code != 0x87 {
		t.Fatalf("wrong password: CONNACK 0x%x, want not authorized", code)
	}
	if code := mqttConnack(t, gw.mqttAddr, "dev-psk", "pw-1"); code != 0x86 && code != 0x87 {
		t.Fatalf("another device's password: CONNACK 0x%x, want not authorized", code)
	}
	if code := mqttConnack(t, gw.mqttAddr, "bad id", "pw-1"); code != 0x85 {
		t.Fatalf("invalid client id: CONNACK 0x%x, want 0x85 client identifier not valid", code)
	}
	if code := mqttConnack(t, gw.mqttAddr, "dev-pw", "pw-1"); code != 0 {
		t.Fatalf("right password after a wrong one: CONNACK 0x%x, want accepted", code)
	}

	if _, err := dtlsHeartbeat(gw.dtlsAddr, "dev-psk", []byte("fedcba9876543210")); err == nil {
		t.Fatal("DTLS with a wrong key was answered")
	}
	if _, err := dtlsHeartbeat(gw.dtlsAddr, "nobody", key); err == nil {
		t.Fatal("DTLS with an unknown identity was answered")
	}
	if code, err := dtlsHeartbeat(gw.dtlsAddr, "dev-psk", key); err != nil || code != codes.Changed {
		t.Fatalf("DTLS with the right key: %v %v, want 2.04", code, err)
	}
	cc := dialCoAP(t, gw.coapAddr)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cc.Post(ctx, "/hb", message.TextPlain, nil, message.Option{ID: message.URIQuery, Value: []byte("d=dev-anon")})
	cc.Close()
	if err != nil || resp.Code() != codes.Unauthorized {
		t.Fatalf("anonymous CoAP: %v %v, want 4.01", resp, err)
	}

	waitFor(t, 10*time.Second, "both authenticated devices in the event log", func() bool {
		all := events(t, rc, 4)
		return len(eventsOf(all, "dev-pw")) >= 1 && len(eventsOf(all, "dev-psk")) >= 1
	})
	all := events(t, rc, 4)
	checkAlternates(t, "dev-pw", eventsOf(all, "dev-pw"))
	checkAlternates(t, "dev-psk", eventsOf(all, "dev-psk"))
	if evs := eventsOf(events(t, rc, 4), "nobody"); len(evs) != 0 {
		t.Fatalf("refused device has events %+v", evs)
	}

	// A new device appears after SIGHUP; an invalid file keeps the old set.
	if err := os.WriteFile(devicesFile, []byte("devices: [ { id: 'bad id' } ]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	gw.signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "invalid devices file refused", func() bool { return strings.Contains(gw.logs(), "devices file not reloaded") })
	if code := mqttConnack(t, gw.mqttAddr, "dev-pw", "pw-1"); code != 0 {
		t.Fatalf("after a refused reload: CONNACK 0x%x, want the old set still accepting dev-pw", code)
	}
	hash, err := auth.HashPassword([]byte("pw-new"), 4)
	if err != nil {
		t.Fatal(err)
	}
	writeDevices(t, devicesFile, "pw-1", fmt.Sprintf("%x", key), fmt.Sprintf("  - id: dev-new\n    password_bcrypt: %q\n", hash))
	gw.signal(syscall.SIGHUP)
	waitFor(t, 10*time.Second, "devices file reloaded", func() bool { return strings.Contains(gw.logs(), "devices file reloaded") })
	if code := mqttConnack(t, gw.mqttAddr, "dev-new", "pw-new"); code != 0 {
		t.Fatalf("device added by reload: CONNACK 0x%x, want accepted", code)
	}
}
