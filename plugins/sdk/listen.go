package sdk

import "net"

// Exposed reports whether a listener bound to addr can be reached from
// other hosts: its IP is not a loopback address (an unspecified address,
// such as that of ":5700", is every interface's). Adapters that take
// traffic without authenticating it, or with a secret in clear, warn at
// start when it is.
func Exposed(addr net.Addr) bool {
	var ip net.IP
	switch a := addr.(type) {
	case *net.UDPAddr:
		ip = a.IP
	case *net.TCPAddr:
		ip = a.IP
	default:
		return true
	}
	return !ip.IsLoopback()
}
