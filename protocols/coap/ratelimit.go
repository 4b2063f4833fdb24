package coap

import (
	"net"
	"net/netip"
	"time"
)

// maxRateSources bounds each rate limiter's table. A source whose bucket
// is full again (it sent nothing for a second) is forgotten, since a full
// bucket is what a new source gets; only sources that sent within the
// last second are kept, about 60 bytes each.
const maxRateSources = 1 << 16

// allowSource takes a token of src's endpoint and then one of its
// address (UDP datagrams, DTLS handshakes and requests). A datagram the
// endpoint's limit refuses takes nothing from its address, whose budget
// the devices behind the same NAT share.
func (s *Server) allowSource(src netip.AddrPort, now time.Time) (bool, time.Duration) {
	src = netip.AddrPortFrom(src.Addr().Unmap(), src.Port())
	if ok, wait := s.endpoints.Allow(src, now); !ok {
		return false, wait
	}
	return s.limit.Allow(src.Addr(), now)
}

// endpointOf is the source endpoint of a peer address.
func endpointOf(a net.Addr) netip.AddrPort {
	if ua, ok := a.(*net.UDPAddr); ok {
		return ua.AddrPort()
	}
	return netip.AddrPort{}
}
