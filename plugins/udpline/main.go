// Command udpline is a fleetgate adapter plugin for legacy controllers
// that send plain UDP datagrams of text lines:
//
//	hb <device> [instance]    a heartbeat (renewal; connect when new)
//	bye <device> [instance]   a clean leave
//
// One datagram may carry several lines (LF or CRLF). Malformed lines are
// counted, logged and ignored. Config (the adapter's `config` subtree):
//
//	listen: "127.0.0.1:5700"   # UDP address (the default)
//
// A datagram carries no proof of who sent it, and its source address can
// be spoofed: whoever can send one to the listen address speaks for every
// device of the adapter's devices. So it listens on loopback unless told
// otherwise, and warns at start when it listens on another address.
package main

import (
	"context"
	"fmt"
	"net"
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
// last line is then malformed or cut.
const maxDatagram = 64 << 10

// adapter is the udpline implementation of sdk.Adapter.
type adapter struct {
	cfg       config
	malformed atomic.Uint64
	// bound receives the bound address when Run listens (tests).
	bound func(net.Addr)
}

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
	if a.bound != nil {
		a.bound(pc.LocalAddr())
	}
	log.Info("listening", "udp", pc.LocalAddr().String())
	if sdk.Exposed(pc.LocalAddr()) {
		log.Warn("listening beyond loopback without authentication: whoever can send a datagram here (source addresses can be spoofed) speaks for every device of this adapter's devices; listen on loopback or a trusted network only",
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
			if err := sink.Send(ctx, sdk.Evidence{Kind: l.Kind, Device: l.Device, Instance: l.Instance, At: now}); err != nil {
				return nil // ctx ended
			}
		}
	}
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
