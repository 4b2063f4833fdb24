package admin

import "testing"

// The Host check of a loopback listener on port 9180 accepts loopback
// names with that port (or none) and refuses any other name, a DNS
// rebinding page's among them.
func TestLoopbackHost(t *testing.T) {
	for host, want := range map[string]bool{
		"127.0.0.1:9180": true, "localhost:9180": true, "[::1]:9180": true, "LOCALHOST:9180": true,
		"localhost.:9180": true, "127.0.0.2:9180": true, "127.0.0.1": true, "localhost": true, "[::1]": true, "": true,
		"127.0.0.1:9181": false, "localhost:80": false, "evil.example:9180": false, "evil.example": false,
		"localhost.evil.example:9180": false, "127.0.0.1.nip.io:9180": false, "10.0.0.1:9180": false,
		"[::ffff:10.0.0.1]:9180": false, "0.0.0.0:9180": false, "foo.localhost:9180": false, "[::1:9180": false,
	} {
		if got := loopbackHost(host, "9180"); got != want {
			t.Errorf("loopbackHost(%q) = %v, want %v", host, got, want)
		}
	}
}
