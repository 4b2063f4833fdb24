package sim

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"
)

// Device addresses are distinct, in 127.0.0.0/8, never 127.0.0.1, and
// neighbours are in different /24 networks.
func TestSourceAddr(t *testing.T) {
	seen := map[string]bool{}
	for i := range 200_000 {
		a := sourceAddr(i)
		if a[0] != 127 || a.Equal(net.IPv4(127, 0, 0, 1)) || a[3] == 0 || a[3] == 255 || seen[a.String()] {
			t.Fatalf("device %d: %v", i, a)
		}
		seen[a.String()] = true
		if i > 0 && string(a[:3]) == string(sourceAddr(i - 1)[:3]) {
			t.Fatalf("devices %d and %d share a /24: %v", i-1, i, a)
		}
	}
}

// Datagrams queued on one socket leave from each device's own address
// (a plain socket sees them so) and the answers, sent to those
// addresses, come back to the socket with the address they were sent to.
func TestUDPPortSourcesAndAnswers(t *testing.T) {
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	_ = srv.SetReadBuffer(4 << 20) // all n at once
	u, err := listenLoopbackUDP(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	const n = 300
	var mu sync.Mutex
	back := map[string]string{} // payload → the address it came back to
	done := make(chan struct{})
	go func() {
		defer close(done)
		u.read(func(b []byte, to net.IP) {
			mu.Lock()
			back[string(b)] = to.String()
			mu.Unlock()
		})
	}()
	dst := srv.LocalAddr().(*net.UDPAddr)
	for i := range n {
		u.queue(fmt.Appendf(nil, "%d", i), sourceAddr(i), dst)
	}
	if failed, err := u.flush(); failed != 0 {
		t.Fatalf("%d not sent: %v", failed, err)
	}
	buf := make([]byte, 64)
	_ = srv.SetReadDeadline(time.Now().Add(5 * time.Second))
	for range n {
		m, from, err := srv.ReadFromUDP(buf)
		if err != nil {
			t.Fatal(err)
		}
		var i int
		if _, err := fmt.Sscanf(string(buf[:m]), "%d", &i); err != nil {
			t.Fatal(err)
		}
		if !from.IP.Equal(sourceAddr(i)) || from.Port != u.port {
			t.Fatalf("datagram %d came from %v, want %v:%d", i, from, sourceAddr(i), u.port)
		}
		if _, err := srv.WriteToUDP(buf[:m], from); err != nil {
			t.Fatal(err)
		}
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		got := len(back)
		mu.Unlock()
		if got == n {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	u.close()
	<-done
	if len(back) != n {
		t.Fatalf("%d of %d answers came back", len(back), n)
	}
	for i := range n {
		if to := back[fmt.Sprint(i)]; to != sourceAddr(i).String() {
			t.Fatalf("answer %d came to %s, want %v", i, to, sourceAddr(i))
		}
	}
}
