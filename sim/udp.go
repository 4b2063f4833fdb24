package sim

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"

	"golang.org/x/net/ipv4"
)

// sourceAddr is device i's own source address, in 127.0.0.0/8 and never
// 127.0.0.1: the second octet changes fastest, so that neighbours are in
// different /24 networks (the gateway bounds anonymous connects and DTLS
// handshakes per /24), then the third, then the fourth (1–254).
func sourceAddr(i int) net.IP {
	return net.IPv4(127, byte(1+i%254), byte(i/254%256), byte(1+i/(254*256)%254)).To4()
}

// udpPort is one UDP socket that sends on behalf of many devices, each
// datagram from its device's own address (IP_PKTINFO), and receives
// the answers to all of them: it is bound to the wildcard address on
// the loopback device (SO_BINDTODEVICE "lo"), so that a datagram to any
// 127.0.0.0/8 address at its port reaches it, and nothing from outside.
// Sends are queued and go out in batches (sendmmsg); reads come in
// batches (recvmmsg) with their destination address.
type udpPort struct {
	c    *net.UDPConn
	pc   *ipv4.PacketConn
	port int
	out  []ipv4.Message // queued; the scheduler's goroutine only
}

// batchSize is the most datagrams one sendmmsg or recvmmsg moves.
const batchSize = 64

func listenLoopbackUDP(ctx context.Context) (*udpPort, error) {
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptString(int(fd), syscall.SOL_SOCKET, syscall.SO_BINDTODEVICE, "lo")
		}); err != nil {
			return err
		}
		if serr != nil {
			return fmt.Errorf("bind to the loopback device: %w", serr)
		}
		return nil
	}}
	pc, err := lc.ListenPacket(ctx, "udp4", "0.0.0.0:0")
	if err != nil {
		return nil, err
	}
	c := pc.(*net.UDPConn)
	_ = c.SetReadBuffer(4 << 20)
	_ = c.SetWriteBuffer(4 << 20)
	p := ipv4.NewPacketConn(c)
	if err := p.SetControlMessage(ipv4.FlagDst, true); err != nil {
		c.Close()
		return nil, fmt.Errorf("IP_PKTINFO: %w", err)
	}
	return &udpPort{c: c, pc: p, port: c.LocalAddr().(*net.UDPAddr).Port}, nil
}

// queue queues b, from src, to dst; flush sends it.
func (u *udpPort) queue(b []byte, src net.IP, dst *net.UDPAddr) {
	cm := ipv4.ControlMessage{Src: src}
	u.out = append(u.out, ipv4.Message{Buffers: [][]byte{b}, OOB: cm.Marshal(), Addr: dst})
}

// flush sends what is queued; it returns how many datagrams were not
// sent, and the first error.
func (u *udpPort) flush() (int, error) {
	ms := u.out
	var failed int
	var first error
	for len(ms) > 0 {
		n, err := u.pc.WriteBatch(ms[:min(len(ms), batchSize)], 0)
		if err != nil {
			// the datagram at n failed; skip it and go on
			if first == nil {
				first = err
			}
			failed++
			n++
		}
		ms = ms[n:]
	}
	clear(u.out)
	u.out = u.out[:0]
	return failed, first
}

// read calls got for every datagram received, with the address it was
// sent to, until the socket is closed.
func (u *udpPort) read(got func(b []byte, to net.IP)) {
	ms := make([]ipv4.Message, batchSize)
	for i := range ms {
		ms[i].Buffers = [][]byte{make([]byte, 1500)}
		ms[i].OOB = ipv4.NewControlMessage(ipv4.FlagDst)
	}
	var cm ipv4.ControlMessage
	for {
		n, err := u.pc.ReadBatch(ms, 0)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		for _, m := range ms[:n] {
			if cm.Parse(m.OOB[:m.NN]) != nil {
				continue
			}
			got(m.Buffers[0][:m.N], cm.Dst)
		}
	}
}

func (u *udpPort) close() error { return u.c.Close() }
