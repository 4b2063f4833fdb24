package coap

import (
	"context"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"
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
