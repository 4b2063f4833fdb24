package redistest

import (
	"io"
	"math/rand/v2"
	"net"
	"sync"
	"testing"
	"time"
)

// Proxy is a TCP proxy on loopback between a client (a gateway) and a
// server (Redis), for tests of faults: the test cuts it (every connection
// closed, new ones refused) and restores it, points it at another server
// (a failover behind a stable address), or delays the server's replies
// (a slow link or a slow server, SetDelay).
type Proxy struct {
	ln     net.Listener
	mu     sync.Mutex
	target string
	cut    bool
	conns  map[net.Conn]struct{}
	// delay draws the delay of each chunk of a reply (nil: none).
	delay func() time.Duration
}

// NewProxy listens on a free loopback port and forwards to target until
// the test ends.
func NewProxy(t testing.TB, target string) *Proxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &Proxy{ln: ln, target: target, conns: map[net.Conn]struct{}{}}
	go p.accept()
	t.Cleanup(func() { ln.Close(); p.SetCut(true) })
	return p
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

func (p *Proxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.cut {
			p.mu.Unlock()
			c.Close()
			continue
		}
		up, err := net.DialTimeout("tcp", p.target, time.Second)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns[c], p.conns[up] = struct{}{}, struct{}{}
		p.mu.Unlock()
		go pipe(up, c) // requests
		go p.delayed(up, c)
	}
}

func pipe(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// chunk is a piece of a reply with the time it is due at the client.
type chunk struct {
	b   []byte
	due time.Time
}

// delayed copies src to dst like pipe, each chunk read at t written at
// t plus the delay drawn for it, in order: a chunk is never due before
// the one read before it.
func (p *Proxy) delayed(src, dst net.Conn) {
	line := make(chan chunk, 1024)
	go func() {
		defer close(line)
		var last time.Time
		for {
			b := make([]byte, 32<<10)
			n, err := src.Read(b)
			if n > 0 {
				due := time.Now()
				p.mu.Lock()
				if p.delay != nil {
					due = due.Add(p.delay())
				}
				p.mu.Unlock()
				if due.Before(last) {
					due = last
				}
				last = due
				line <- chunk{b[:n], due}
			}
			if err != nil {
				return
			}
		}
	}()
	for c := range line {
		time.Sleep(time.Until(c.due))
		if _, err := dst.Write(c.b); err != nil {
			break
		}
	}
	dst.Close()
	src.Close()
	for range line {
	}
}

// SetDelay delays every chunk of the server's replies read from now on by
// a uniform random time in [lo, hi] (order kept); zero ends the delay for
// what is read next.
func (p *Proxy) SetDelay(lo, hi time.Duration) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if hi <= 0 {
		p.delay = nil
		return
	}
	p.delay = func() time.Duration { return lo + rand.N(hi-lo+1) }
}

// SetCut cuts (true) or restores (false) the link.
func (p *Proxy) SetCut(v bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.cut = v
	if v {
		p.dropLocked()
	}
}

// Retarget points the proxy at target and drops every open connection.
func (p *Proxy) Retarget(target string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.target = target
	p.dropLocked()
}

func (p *Proxy) dropLocked() {
	for c := range p.conns {
		c.Close()
	}
	p.conns = map[net.Conn]struct{}{}
}
