package ratelimit

import (
	"net/netip"
	"testing"
)

func TestPrefix(t *testing.T) {
	for _, c := range []struct{ addr, want string }{
		{"192.0.2.77", "192.0.2.0/24"},
		{"::ffff:192.0.2.77", "192.0.2.0/24"},
		{"127.0.0.1", "127.0.0.0/24"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"fe80::1%eth0", "fe80::/64"},
		{"::1", "::/64"},
	} {
		if got := Prefix(netip.MustParseAddr(c.addr)); got.String() != c.want {
			t.Errorf("Prefix(%s) = %s, want %s", c.addr, got, c.want)
		}
	}
	if got := Prefix(netip.Addr{}); got != (netip.Prefix{}) {
		t.Errorf("Prefix of the zero Addr = %v, want the zero Prefix", got)
	}
	if Prefix(netip.MustParseAddr("2001:db8::1")) != Prefix(netip.MustParseAddr("2001:db8::ffff:1")) {
		t.Error("two addresses of one /64 have different prefixes")
	}
}
