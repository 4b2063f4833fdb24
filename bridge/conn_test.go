package bridge

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/packets"
)

// slowConn counts the writes that reach the connection and makes each
// take a while, as a loaded system call does.
type slowConn struct {
	net.Conn
	writes atomic.Int64
	delay  time.Duration
}

func (c *slowConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	time.Sleep(c.delay)
	return c.Conn.Write(p)
}

// TestPacketConnCombinesWrites: 32 goroutines write PUBLISH packets the
// way paho does (ControlPacket.WriteTo under the connection's Locker)
// over real TCP; the far end reads every packet whole, in each
// goroutine's order, and the packets took far fewer writes than there
// are packets.
func TestPacketConnCombinesWrites(t *testing.T) {
	const writers, each = 32, 200
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	got := make(chan error, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			got <- err
			return
		}
		defer c.Close()
		next := make(map[string]int)
		for n := 0; n < writers*each; n++ {
			cp, err := packets.ReadPacket(c)
			if err != nil {
				got <- fmt.Errorf("packet %d: %w", n, err)
				return
			}
			p, ok := cp.Content.(*packets.Publish)
			if !ok {
				got <- fmt.Errorf("packet %d: type %d", n, cp.Type)
				return
			}
			if want := fmt.Sprintf("%s/%d", p.Topic, next[p.Topic]); string(p.Payload) != want {
				got <- fmt.Errorf("packet %d: payload %q, want %q", n, p.Payload, want)
				return
			}
			next[p.Topic]++
		}
		got <- nil
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	slow := &slowConn{Conn: raw, delay: 200 * time.Microsecond}
	c := newPacketConn(slow)
	defer c.Close()
	var wg sync.WaitGroup
	for w := range writers {
		wg.Go(func() {
			topic := fmt.Sprintf("w%02d", w)
			for k := range each {
				pub := &packets.Publish{Topic: topic, QoS: 1, PacketID: uint16(k + 1), Payload: []byte(fmt.Sprintf("%s/%d", topic, k)),
					Properties: &packets.Properties{}}
				if _, err := pub.WriteTo(c); err != nil {
					t.Errorf("write: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()
	select {
	case err := <-got:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the reader did not get every packet within 30 s")
	}
	writes := slow.writes.Load()
	t.Logf("%d packets in %d writes", writers*each, writes)
	if writes > writers*each/4 {
		t.Errorf("%d writes for %d packets from %d writers: the packets were not combined", writes, writers*each, writers)
	}
}

// blockedConn's writes wait until released, then fail.
type blockedConn struct {
	net.Conn
	release chan struct{}
}

func (c *blockedConn) Write(p []byte) (int, error) {
	<-c.release
	return 0, net.ErrClosed
}

// TestPacketConnBoundsPending: while a write is stuck (a broker that
// does not read), writers wait once maxPending bytes gathered instead of
// growing the buffer; when the connection fails they all return an
// error.
func TestPacketConnBoundsPending(t *testing.T) {
	a, b := net.Pipe()
	defer b.Close()
	bc := &blockedConn{Conn: a, release: make(chan struct{})}
	c := newPacketConn(bc)
	payload := make([]byte, 1000)
	var written atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 100 {
				pub := &packets.Publish{Topic: "t", Payload: payload, Properties: &packets.Properties{}}
				if _, err := pub.WriteTo(c); err != nil {
					return
				}
				written.Add(1)
			}
		})
	}
	full := func() int {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.pending)
	}
	deadline := time.Now().Add(10 * time.Second)
	for full() < maxPending && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(50 * time.Millisecond) // writers that would pass the bound have had the time to
	pending := full()
	if pending > maxPending+2000 {
		t.Errorf("%d bytes pending while the write is stuck, bound %d", pending, maxPending)
	}
	if n := written.Load(); n >= 800 {
		t.Errorf("all %d packets were taken while the write was stuck", n)
	}
	// the stuck write fails: every writer returns
	close(bc.release)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("writers still waiting 10 s after the connection failed")
	}
}
