// Command udpline is a fleetgate adapter plugin for legacy controllers
// that send plain UDP datagrams of text lines:
//
//	hb <device> [instance]                     a heartbeat (renewal; connect when new)
//	hb <device> [instance] ><topic> <payload>  a heartbeat with data
//	bye <device> [instance]                    a clean leave
//
// One datagram may carry several lines (LF or CRLF). A heartbeat with
// data sends the payload (the rest of the line after the topic and one
// space or tab, byte for byte; no content type) as QoS 0 data of the
// device on <topic> below its root ("" for the root itself: "> 21.5").
// Lines without ">" are what they always were. Malformed lines are
// counted, logged and ignored.
//
// Commands: udpline takes the commands of a device it has heard a
// heartbeat from, and sends each as one line, in one datagram from its
// listen address to the source address of the device's last heartbeat:
//
//	cmd <device> ><topic> <payload>
//
// (topic "cmd" or "cmd/<rest>"). A command is taken once it is sent: UDP
// says nothing about its arrival. A command whose payload holds a line
// break, or that does not fit a datagram, is refused. Config (the
// adapter's `config` subtree):
//
//	listen: "127.0.0.1:5700"   # UDP address (the default)
//
// A datagram carries no proof of who sent it, and its source address can
// be spoofed: whoever can send one to the listen address speaks for every
// device of the adapter's devices, and receives their commands. So it
// listens on loopback unless told otherwise, and warns at start when it
// listens on another address.
package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

// version is set by the Makefile's -ldflags.
var version = "dev"

func main() {
	sdk.Serve(sdk.Info{Name: "udpline", Version: version, Protocols: []string{"udp-line"}}, &adapter{})
}

// config is udpline's config subtree.
type config struct {
	Listen string `json:"listen"`
}

// maxDatagram bounds a datagram read; longer ones are truncated and their
// last line is then malformed or cut. A command line is at most as long.
const maxDatagram = 64 << 10

// maxAddresses bounds the devices whose last source address udpline
// keeps (for commands); beyond it, one it keeps is forgotten for each new
// one.
const maxAddresses = 65536

// adapter is the udpline implementation of sdk.Adapter and sdk.Commander.
type adapter struct {
	cfg       config
	malformed atomic.Uint64
	// bound receives the bound address when Run listens (tests).
	bound func(net.Addr)

	mu    sync.Mutex
	conn  net.PacketConn      // the listening socket while Run runs
	addrs map[string]net.Addr // device → source of its last heartbeat
}

var (
	_ sdk.Adapter   = (*adapter)(nil)
	_ sdk.Commander = (*adapter)(nil)
)

func (a *adapter) Configure(_ context.Context, raw []byte) error {
	c := config{Listen: "127.0.0.1:5700"}
	if err := sdk.DecodeConfig(raw, &c); err != nil {
		return err
	}
	if _, err := net.ResolveUDPAddr("udp", c.Listen); err != nil {
		return fmt.Errorf("listen: %q: %w", c.Listen, err)
	}
	a.cfg = c
	return nil
}

func (a *adapter) Run(ctx context.Context, sink sdk.Sink) error {
	log := sdk.Logger(ctx)
	var lc net.ListenConfig
	pc, err := lc.ListenPacket(ctx, "udp", a.cfg.Listen)
	if err != nil {
		return fmt.Errorf("listen: %w", err)
	}
	defer pc.Close()
	stop := context.AfterFunc(ctx, func() { pc.Close() })
	defer stop()
	a.mu.Lock()
	a.conn = pc
	if a.addrs == nil {
		a.addrs = make(map[string]net.Addr)
	}
	a.mu.Unlock()
	defer func() {
		a.mu.Lock()
		a.conn = nil
		a.mu.Unlock()
	}()
	if a.bound != nil {
		a.bound(pc.LocalAddr())
	}
	log.Info("listening", "udp", pc.LocalAddr().String())
	if sdk.Exposed(pc.LocalAddr()) {
		log.Warn("listening beyond loopback without authentication: whoever can send a datagram here (source addresses can be spoofed) speaks for every device of this adapter's devices and gets their commands; listen on loopback or a trusted network only",
			"udp", pc.LocalAddr().String())
	}
	sink.Ready()
	go a.reportMalformed(ctx)
	buf := make([]byte, maxDatagram)
	for {
		n, from, err := pc.ReadFrom(buf)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("read: %w", err)
		}
		now := time.Now()
		for _, l := range ParseDatagram(buf[:n]) {
			if l.Err != nil {
				a.malformed.Add(1)
				log.Debug("malformed line", "from", from.String(), "error", l.Err)
				continue
			}
			if l.Kind == sdk.Renew {
				a.heard(l.Device, from)
			}
			if l.Data {
				err = sink.Data(ctx, sdk.Data{Device: l.Device, Instance: l.Instance, Topic: l.Topic, Payload: l.Payload, At: now})
				if errors.Is(err, sdk.ErrRejected) || errors.Is(err, sdk.ErrNoDataPath) {
					log.Debug("data not sent", "device", l.Device, "error", err)
					continue
				}
			} else {
				err = sink.Send(ctx, sdk.Evidence{Kind: l.Kind, Device: l.Device, Instance: l.Instance, At: now})
			}
			if err != nil {
				return nil // ctx ended
			}
		}
	}
}

// heard records from as device's address for its commands.
func (a *adapter) heard(device string, from net.Addr) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if _, ok := a.addrs[device]; !ok && len(a.addrs) >= maxAddresses {
		for d := range a.addrs {
			delete(a.addrs, d)
			break
		}
	}
	a.addrs[device] = from
}

// Command sends c to the source address of its device's last heartbeat
// as the line "cmd <device> ><topic> <payload>".
func (a *adapter) Command(_ context.Context, c sdk.Command) error {
	if bytes.ContainsAny(c.Payload, "\r\n") {
		return errors.New("the payload holds a line break, which a line cannot carry")
	}
	line := fmt.Appendf(nil, "cmd %s >%s %s\n", c.Device, c.Topic, c.Payload)
	if len(line) > maxDatagram {
		return fmt.Errorf("the command line is %d bytes, a datagram holds %d", len(line), maxDatagram)
	}
	a.mu.Lock()
	conn, to := a.conn, a.addrs[c.Device]
	a.mu.Unlock()
	switch {
	case conn == nil:
		return errors.New("not listening")
	case to == nil:
		return fmt.Errorf("no heartbeat from %s since the adapter started: its address is unknown", c.Device)
	}
	if _, err := conn.WriteTo(line, to); err != nil {
		return fmt.Errorf("send to %s: %w", to, err)
	}
	return nil
}

// reportMalformed logs the count of malformed lines once a minute while
// it grows.
func (a *adapter) reportMalformed(ctx context.Context) {
	t := time.NewTicker(time.Minute)
	defer t.Stop()
	var last uint64
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if n := a.malformed.Load(); n != last {
				sdk.Logger(ctx).Warn("malformed lines ignored", "total", n, "new", n-last)
				last = n
			}
		}
	}
}
