package ratelimit

import "net/netip"

// Prefix lengths of the networks that Prefix groups source addresses
// into: what one site, or one host, usually holds.
const (
	// PrefixBits4 groups IPv4 addresses by /24.
	PrefixBits4 = 24
	// PrefixBits6 groups IPv6 addresses by /64: the network one host gets
	// and can draw any number of addresses from.
	PrefixBits6 = 64
)

// Prefix is the network of addr that bounds per network count: its /24
// for IPv4 (IPv4-mapped IPv6 addresses count as IPv4), its /64 for IPv6.
// The zero Addr (no address known) gives the zero Prefix, one key for
// all of them.
func Prefix(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap()
	bits := PrefixBits6
	switch {
	case !addr.IsValid():
		return netip.Prefix{}
	case addr.Is4():
		bits = PrefixBits4
	}
	return netip.PrefixFrom(addr.WithZone(""), bits).Masked()
}
