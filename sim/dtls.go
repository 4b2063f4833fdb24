package sim

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	piondtls "github.com/pion/dtls/v3"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/udp/coder"

	"github.com/fleetgate/fleetgate/sim/check"
)

// dtlsKey is the PSK of device id in the fleet of seed: every part of a
// split fleet and the devices file agree on it.
func dtlsKey(seed uint64, id string) []byte {
	h := sha256.Sum256(fmt.Appendf(nil, "fleetgate-sim/%d/%s", seed, id))
	return h[:16]
}

// WriteDevicesFile writes a devices file (auth.devices_file) that lists
// the DTLS devices of the fleet of o with their PSKs; it returns how
// many.
func WriteDevicesFile(w io.Writer, o PlanOptions) (int, error) {
	n := 0
	if _, err := io.WriteString(w, "devices:\n"); err != nil {
		return 0, err
	}
	for _, p := range Plan(o) {
		if !p.DTLS {
			continue
		}
		if _, err := fmt.Fprintf(w, "  - id: %q\n    psk: \"hex:%s\"\n", p.ID, hex.EncodeToString(dtlsKey(o.Seed, p.ID))); err != nil {
			return n, err
		}
		n++
	}
	if n == 0 {
		_, err := io.WriteString(w, "  []\n")
		return 0, err
	}
	return n, nil
}

// A DTLS device talks to its gateway in exchanges: when it has requests
// to send and no exchange runs, one starts in a goroutine of its own
// with a UDP socket of its own bound to the device's address and
// dtlsPort. It keeps its session between exchanges, as constrained
// devices do, but not its connection: at the end of an exchange it
// exports the session's state and closes the socket, and the next
// exchange with the same gateway resumes the session from that state
// (pion's Resume) without a handshake; the gateway, which parks a
// session idle for a few seconds, resumes it on its side at the first
// record. When that record gets no answer (the gateway restarted, or
// dropped its parked state) the device shakes hands and sends again. It
// sends the requests queued meanwhile one after another (a CON one
// retransmitted by RFC 7252's rules). Handshakes cost far more than
// datagrams.
type dtlsDevice struct {
	key []byte

	mu    sync.Mutex
	busy  bool
	queue []dtlsReq
	// kept is the state of the session with gateway keptGw, nil when
	// there is none (only the exchange goroutine touches them).
	kept   *piondtls.State
	keptGw int
}

// dtlsPort is the UDP port of every DTLS device's socket (each device has
// an address of its own): the same address and port each exchange, so
// that the gateway finds the session it parked.
const dtlsPort = 47000

// dtlsSession is a DTLS connection of an exchange and its socket.
type dtlsSession struct {
	dc      *piondtls.Conn
	sock    *net.UDPConn
	gw      int
	resumed bool // from the kept state, not answered yet
}

// end closes s, keeping its state in x for the next exchange: the
// socket is closed first, so the connection's close_notify never leaves
// (the gateway keeps the session parked).
func (x *dtlsDevice) end(s *dtlsSession) {
	if st, ok := s.dc.ConnectionState(); ok {
		x.kept, x.keptGw = &st, s.gw
	}
	_ = s.sock.Close()
	_ = s.dc.Close()
}

type dtlsReq struct {
	b      []byte
	tok    []byte
	gw     int
	con    bool
	sess   *check.Session
	leave  bool
	due    time.Time // the heartbeat's schedule, zero for other requests
	queued time.Time
}

// maxExchange bounds the requests of one exchange; more wait for the
// next.
const maxExchange = 16

// dtlsSend queues r for d and starts an exchange unless one runs.
func (f *coapFleet) dtlsSend(d *coapDevice, r dtlsReq) {
	x := d.dtls
	x.mu.Lock()
	x.queue = append(x.queue, r)
	start := !x.busy
	x.busy = true
	x.mu.Unlock()
	if start {
		f.exchanges.Add(1)
		go func() { defer f.exchanges.Done(); f.exchange(d) }()
	}
}

// exchange plays one exchange of d: a handshake per gateway, the
// requests queued.
func (f *coapFleet) exchange(d *coapDevice) {
	x := d.dtls
	var cur *dtlsSession
	// The session ends (its state kept) before busy is cleared, so that
	// the next exchange finds the state.
	for range maxExchange {
		x.mu.Lock()
		if len(x.queue) == 0 && cur == nil {
			x.busy = false
			x.mu.Unlock()
			return
		}
		if len(x.queue) == 0 {
			x.mu.Unlock()
			x.end(cur)
			cur = nil
			continue
		}
		r := x.queue[0]
		x.queue = x.queue[1:]
		x.mu.Unlock()
		if cur == nil || cur.gw != r.gw {
			if cur != nil {
				x.end(cur)
			}
			if cur = f.session(d, r.gw); cur == nil {
				continue
			}
		}
		if cur.resumed {
			cur.resumed = false
			if f.dtlsRequest(d, cur.dc, r, true) {
				continue
			}
			// not answered: the gateway does not hold the session
			f.stats.dtlsResumeFailures.Add(1)
			_ = cur.sock.Close()
			_ = cur.dc.Close()
			if cur = f.handshake(d, r.gw); cur == nil {
				continue
			}
		}
		f.dtlsRequest(d, cur.dc, r, false)
	}
	if cur != nil {
		x.end(cur)
	}
	x.mu.Lock()
	x.busy = false
	x.mu.Unlock()
}

// session is d's DTLS session with gateway gw for an exchange: the kept
// one resumed, else a new handshake; nil when none could be had.
func (f *coapFleet) session(d *coapDevice, gw int) *dtlsSession {
	x := d.dtls
	kept, keptGw := x.kept, x.keptGw
	x.kept = nil // a state is resumed at most once
	if kept != nil && keptGw == gw {
		if c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: d.addr, Port: dtlsPort}); err == nil {
			dc, err := piondtls.Resume(kept, c, f.dtlsGws[gw], f.dtlsConfig(d))
			if err == nil {
				f.stats.dtlsResumes.Add(1)
				return &dtlsSession{dc: dc, sock: c, gw: gw, resumed: true}
			}
			_ = c.Close()
		}
	}
	return f.handshake(d, gw)
}

// dtlsConfig is d's DTLS client configuration.
func (f *coapFleet) dtlsConfig(d *coapDevice) *piondtls.Config {
	key := d.dtls.key
	return &piondtls.Config{
		PSK:             func([]byte) ([]byte, error) { return key, nil },
		PSKIdentityHint: []byte(d.plan.ID),
		CipherSuites:    []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
	}
}

// handshake opens a new DTLS session of d with gateway gw; nil when it
// failed (counted, unless the run is over).
func (f *coapFleet) handshake(d *coapDevice, gw int) *dtlsSession {
	s, err := f.tryHandshake(d, gw)
	if err != nil {
		if f.ctx.Err() == nil { // else the run is over: not the gateway's failure
			f.stats.dtlsFailures.Add(1)
			f.stats.unanswered.Add(1)
		}
		return nil
	}
	return s
}

func (f *coapFleet) tryHandshake(d *coapDevice, gw int) (*dtlsSession, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: d.addr, Port: dtlsPort})
	if err != nil {
		// the port is taken (the previous socket not released yet, or
		// another process): any port, the session will not be resumed
		if c, err = net.ListenUDP("udp4", &net.UDPAddr{IP: d.addr}); err != nil {
			return nil, err
		}
	}
	dc, err := piondtls.Client(c, f.dtlsGws[gw], f.dtlsConfig(d))
	if err != nil {
		c.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(f.ctx, nonTimeout)
	defer cancel()
	f.stats.dtlsHandshakes.Add(1)
	if err := dc.HandshakeContext(ctx); err != nil {
		dc.Close()
		c.Close()
		return nil, err
	}
	return &dtlsSession{dc: dc, sock: c, gw: gw}, nil
}

// dtlsRequest sends r over dc and waits for its answer; the evidence is
// the moment it went. On a resumed session (probe) it sends once and
// reports whether any answer came, without counting a missing one: the
// caller shakes hands and sends again.
func (f *coapFleet) dtlsRequest(d *coapDevice, dc *piondtls.Conn, r dtlsReq, probe bool) bool {
	at := time.Now()
	if !r.due.IsZero() {
		f.stats.late(at.Sub(r.due))
	}
	if r.leave {
		d.truth.left(r.sess, at)
	} else {
		d.truth.sent(r.sess, at)
	}
	wait, tries := nonTimeout, 0
	if r.con {
		wait = ackTimeout + time.Duration(float64(ackTimeout)*ackRandomShare/2)
	}
	buf := make([]byte, 1500)
	for {
		if _, err := dc.Write(r.b); err != nil {
			f.stats.sendErrors.Add(1)
			return true
		}
		_ = dc.SetReadDeadline(time.Now().Add(wait))
		for {
			n, err := dc.Read(buf)
			if err != nil {
				break
			}
			m := pool.NewMessage(context.Background())
			if _, err := m.UnmarshalWithDecoder(coder.DefaultCoder, buf[:n]); err != nil || string(m.Token()) != string(r.tok) {
				continue
			}
			f.stats.code(m.Code().String())
			if m.Code() == codes.Changed {
				f.stats.answered.Add(1)
				if !r.leave {
					d.truth.acked(r.sess, at)
				}
			}
			return true
		}
		if f.ctx.Err() != nil {
			return true // the run is over
		}
		if probe {
			return false
		}
		if !r.con || tries == maxRetransmit {
			f.stats.unanswered.Add(1)
			return true
		}
		tries++
		wait *= 2
		d.truth.sent(r.sess, time.Now())
		f.stats.retransmits.Add(1)
	}
}
