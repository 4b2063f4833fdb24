package coap

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// libcoapClients are libcoap's coap-client builds with DTLS (Debian's
// libcoap3-bin; make deps installs it).
func libcoapClients(t *testing.T) []string {
	t.Helper()
	var found []string
	for _, name := range []string{"coap-client-openssl", "coap-client-gnutls"} {
		if p, err := exec.LookPath(name); err == nil {
			found = append(found, p)
		}
	}
	if len(found) == 0 {
		t.Fatal("coap-client with DTLS missing: run 'make deps' (apt-get install -y libcoap3-bin)")
	}
	return found
}

// An external DTLS client (libcoap over OpenSSL and over GnuTLS) passes
// the gate's stateless cookie exchange and gets its heartbeat answered,
// during a flood of ClientHellos that never return the cookie.
func TestDTLSLibcoapClient(t *testing.T) {
	rec := &recorder{}
	s := startDTLS(t, rec, Options{})
	hello := pionClientHello(t)
	ctx, stop := context.WithCancel(context.Background())
	flooded := make(chan int, 1)
	go func() { flooded <- helloFlood(ctx, s.DTLSAddr().(*net.UDPAddr), hello, 10, 20*time.Millisecond) }()
	defer func() {
		stop()
		t.Logf("%d ClientHellos of the flood", <-flooded)
	}()
	time.Sleep(500 * time.Millisecond) // the flood is under way
	for _, client := range libcoapClients(t) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		start := time.Now()
		out, err := exec.CommandContext(ctx, client, "-v", "6", "-m", "post", "-B", "5",
			"-k", string(testDevices["id-1"].key), "-u", "id-1",
			"coaps://"+s.DTLSAddr().String()+"/hb").CombinedOutput()
		cancel()
		took := time.Since(start)
		if err != nil || !strings.Contains(string(out), "2.04") {
			t.Fatalf("%s: %v after %v\n%s", client, err, took, out)
		}
		t.Logf("%s: 2.04 after %v", client, took)
	}
}

// libcoap runs coap-client with args (-v 6 shows the PDUs) and returns
// what it printed.
func libcoap(t *testing.T, client string, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, client, append([]string{"-v", "6", "-B", "5"}, args...)...).CombinedOutput()
	if err != nil {
		t.Fatalf("%s %v: %v\n%s", client, args, err, out)
	}
	return string(out)
}

// libcoap's coap-client (over OpenSSL and GnuTLS) posts data as a CON
// (QoS 1), a NON (QoS 0) and over DTLS-PSK, and receives a command on the
// answer to a padded heartbeat, the Size2 marker on a small one, and
// acknowledges it with a=<id>.
func TestLibcoapDataAndCommands(t *testing.T) {
	rec := &recorder{}
	s, k, cmds := startData(t, rec, Options{AllowAnonymous: true, DTLS: "127.0.0.1:0"})
	udp, dtls := "coap://"+s.Addr().String(), "coaps://"+s.DTLSAddr().String()
	pad := "&pad=" + strings.Repeat("x", 64)
	for i, client := range libcoapClients(t) {
		dev := fmt.Sprintf("lib-%d", i)
		if out := libcoap(t, client, "-m", "post", "-t", "50", "-e", `{"t":21.5}`, udp+"/d/telemetry/temp?d="+dev); !strings.Contains(out, "t:ACK c:2.04") {
			t.Fatalf("%s CON POST /d:\n%s", client, out)
		}
		if out := libcoap(t, client, "-N", "-m", "post", "-t", "0", "-e", "booted", udp+"/d/log?d="+dev); !strings.Contains(out, "t:NON c:2.04") {
			t.Fatalf("%s NON POST /d:\n%s", client, out)
		}
		if out := libcoap(t, client, "-m", "post", "-e", "secret", "-u", "id-1", "-k", string(testDevices["id-1"].key), dtls+"/d/sealed"); !strings.Contains(out, "t:ACK c:2.04") {
			t.Fatalf("%s DTLS POST /d:\n%s", client, out)
		}
		msgs := k.Take()
		want := []string{
			dev + ` telemetry/temp application/json 1 {"t":21.5}`,
			dev + " log text/plain;charset=utf-8 0 booted",
			"dev-1 sealed  1 secret",
		}
		var got []string
		for _, m := range msgs {
			got = append(got, fmt.Sprintf("%s %s %s %d %s", m.Device, m.Topic, m.ContentType, m.QoS, m.Payload))
		}
		if strings.Join(got, "\n") != strings.Join(want, "\n") {
			t.Fatalf("%s published\n%s\nwant\n%s", client, strings.Join(got, "\n"), strings.Join(want, "\n"))
		}

		c := cmds.Add(gateway.Message{Device: gateway.DeviceID(dev), Topic: "cmd/led/set", Payload: []byte(`{"r":255}`),
			ContentType: "application/json"}, time.Now().Add(time.Hour))
		location := fmt.Sprintf("Location-Path:cmd, Location-Path:led, Location-Path:set, Content-Format:application/json, Max-Age:30, Location-Query:c=%d ] :: '{\"r\":255}'", c.ID)
		if out := libcoap(t, client, "-m", "post", udp+"/hb?d="+dev); !strings.Contains(out, "c:2.04") || !strings.Contains(out, "Size2:") {
			t.Fatalf("%s small heartbeat with a command waiting, want its Size2 marker:\n%s", client, out)
		}
		for range 2 { // sent again until acknowledged
			if out := libcoap(t, client, "-m", "post", udp+"/hb?d="+dev+pad); !strings.Contains(out, location) {
				t.Fatalf("%s padded heartbeat, want\n%s\nin:\n%s", client, location, out)
			}
		}
		out := libcoap(t, client, "-m", "post", fmt.Sprintf("%s/hb?d=%s&a=%d%s", udp, dev, c.ID, pad))
		if !strings.Contains(out, "c:2.04") || strings.Contains(out, "Location-Query") || len(cmds.Held(gateway.DeviceID(dev))) != 0 {
			t.Fatalf("%s acknowledged: pending %+v\n%s", client, cmds.Held(gateway.DeviceID(dev)), out)
		}
		t.Logf("%s: data up (CON, NON, DTLS), a command down and acknowledged", client)
	}
}
