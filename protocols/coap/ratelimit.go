package coap

import (
	"net"
	"net/netip"
	"time"

	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

// maxRateSources bounds each rate limiter's table. A source whose bucket
// is full again (it sent nothing for a second) is forgotten, since a full
// bucket is what a new source gets; only sources that sent within the
// last second are kept, about 60 bytes each.
const maxRateSources = 1 << 16

// sourceLimits is a rate limit per source endpoint (address and port)
// and per source address, which may send ratelimit.AddressFactor times
// as much: the devices behind a NAT share it.
//
// The server keeps two: one for the unproven datagrams of plain UDP,
// whose source address anyone can claim, and one for DTLS handshakes
// (their source has returned the gate's cookie) and the requests of DTLS
// sessions (proven by the session's keys). Spoofed datagrams spend only
// the first, so they cannot lock out the DTLS devices behind the address
// they claim.
type sourceLimits struct {
	endpoints *ratelimit.Limiter[netip.AddrPort]
	addrs     *ratelimit.Limiter[netip.Addr]
}

// newSourceLimits is a sourceLimits of rate events a second per endpoint.
func newSourceLimits(rate int) sourceLimits {
	return sourceLimits{
		endpoints: ratelimit.NewBounded[netip.AddrPort](rate, maxRateSources),
		addrs:     ratelimit.NewBounded[netip.Addr](rate*ratelimit.AddressFactor, maxRateSources),
	}
}

// allow takes a token of src's endpoint and then one of its address. A
// datagram the endpoint's limit refuses takes nothing from its address,
// whose budget the devices behind the same NAT share.
func (l sourceLimits) allow(src netip.AddrPort, now time.Time) (bool, time.Duration) {
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	if ok, wait := l.endpoints.Allow(src, now); !ok {
		return false, wait
	}
	return l.addrs.Allow(src.Addr(), now)
}

// endpointOf is the source endpoint of a peer address.
func endpointOf(a net.Addr) netip.AddrPort {
	if ua, ok := a.(*net.UDPAddr); ok {
		return ua.AddrPort()
	}
	return netip.AddrPort{}
}
