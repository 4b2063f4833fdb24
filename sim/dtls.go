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
// with a UDP socket of its own bound to the device's address. It shakes
// hands (the gateway closes idle sessions after a few seconds, so a
// device heartbeating every 30 s shakes hands every time), sends the
// requests queued meanwhile one after another (a CON one retransmitted
// by RFC 7252's rules), and closes the session. Handshakes cost far
// more than datagrams: the simulator's share of DTLS devices is what
// bounds its CPU.
type dtlsDevice struct {
	key []byte

	mu    sync.Mutex
	busy  bool
	queue []dtlsReq
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
	var dc *piondtls.Conn
	gw := -1
	defer func() {
		if dc != nil {
			dc.Close()
		}
	}()
	for range maxExchange {
		x.mu.Lock()
		if len(x.queue) == 0 {
			x.busy = false
			x.mu.Unlock()
			return
		}
		r := x.queue[0]
		x.queue = x.queue[1:]
		x.mu.Unlock()
		if dc == nil || gw != r.gw {
			if dc != nil {
				dc.Close()
			}
			var err error
			if dc, err = f.handshake(d, r.gw); err != nil {
				dc = nil
				if f.ctx.Err() != nil {
					continue // the run is over: not the gateway's failure
				}
				f.stats.dtlsFailures.Add(1)
				f.stats.unanswered.Add(1)
				continue
			}
			gw = r.gw
		}
		f.dtlsRequest(d, dc, r)
	}
	x.mu.Lock()
	x.busy = false
	x.mu.Unlock()
}

func (f *coapFleet) handshake(d *coapDevice, gw int) (*piondtls.Conn, error) {
	c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: d.addr})
	if err != nil {
		return nil, err
	}
	key := d.dtls.key
	dc, err := piondtls.Client(c, f.dtlsGws[gw], &piondtls.Config{
		PSK:             func([]byte) ([]byte, error) { return key, nil },
		PSKIdentityHint: []byte(d.plan.ID),
		CipherSuites:    []piondtls.CipherSuiteID{piondtls.TLS_PSK_WITH_AES_128_CCM_8},
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	ctx, cancel := context.WithTimeout(f.ctx, nonTimeout)
	defer cancel()
	f.stats.dtlsHandshakes.Add(1)
	if err := dc.HandshakeContext(ctx); err != nil {
		dc.Close()
		return nil, err
	}
	return dc, nil
}

// dtlsRequest sends r over dc and waits for its answer; the evidence is
// the moment it went.
func (f *coapFleet) dtlsRequest(d *coapDevice, dc *piondtls.Conn, r dtlsReq) {
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
			return
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
			return
		}
		if f.ctx.Err() != nil {
			return // the run is over
		}
		if !r.con || tries == maxRetransmit {
			f.stats.unanswered.Add(1)
			return
		}
		tries++
		wait *= 2
		d.truth.sent(r.sess, time.Now())
		f.stats.retransmits.Add(1)
	}
}
