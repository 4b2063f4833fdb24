package gateway_test

import (
	"errors"
	"regexp"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/gateway"
)

// The ID grammars of docs/design.md §1 and id.go, as regular expressions: the
// fuzz targets check the parsers against them.
var (
	deviceIDRe  = regexp.MustCompile(`^[A-Za-z0-9._:-]{1,128}$`)
	sessionIDRe = regexp.MustCompile(`^[\x21-\x7b\x7d\x7e]{1,200}$`) // printable ASCII but space and '|'
)

func TestParseDeviceID(t *testing.T) {
	for _, s := range []string{"a", "dev-1", "Sensor_42.eth0:1", "-", strings.Repeat("x", 128)} {
		if d, err := gateway.ParseDeviceID(s); err != nil || string(d) != s {
			t.Errorf("ParseDeviceID(%q) = %q, %v", s, d, err)
		}
	}
	for _, s := range []string{"", strings.Repeat("x", 129), "dev 1", "dev/1", "dev|1", "dev\x001", "dév", "dev\n", "a*"} {
		if d, err := gateway.ParseDeviceID(s); !errors.Is(err, gateway.ErrInvalidDeviceID) || d != "" {
			t.Errorf("ParseDeviceID(%q) = %q, %v; want ErrInvalidDeviceID", s, d, err)
		}
	}
}

func TestParseSessionID(t *testing.T) {
	for _, s := range []string{"coap/default", "site-a-1/3/17", "~!{}", strings.Repeat("s", 200)} {
		if id, err := gateway.ParseSessionID(s); err != nil || string(id) != s {
			t.Errorf("ParseSessionID(%q) = %q, %v", s, id, err)
		}
	}
	for _, s := range []string{"", strings.Repeat("s", 201), "a b", "a|b", "a\x00b", "a\x7f", "é", "tab\there"} {
		if id, err := gateway.ParseSessionID(s); !errors.Is(err, gateway.ErrInvalidSessionID) || id != "" {
			t.Errorf("ParseSessionID(%q) = %q, %v; want ErrInvalidSessionID", s, id, err)
		}
	}
}

func TestInstanceSessionID(t *testing.T) {
	for _, tc := range []struct{ protocol, instance, want string }{
		{"coap", "", "coap/default"},
		{"coap", "radio-2", "coap/radio-2"},
		{"lora", "a.b:c_d", "lora/a.b:c_d"},
	} {
		if got, err := gateway.InstanceSessionID(tc.protocol, tc.instance); err != nil || string(got) != tc.want {
			t.Errorf("InstanceSessionID(%q, %q) = %q, %v; want %q", tc.protocol, tc.instance, got, err, tc.want)
		}
	}
	for _, instance := range []string{"a/b", "a b", "a|b", strings.Repeat("i", 129)} {
		if _, err := gateway.InstanceSessionID("coap", instance); !errors.Is(err, gateway.ErrInvalidSessionID) {
			t.Errorf("InstanceSessionID(coap, %q): err = %v, want ErrInvalidSessionID", instance, err)
		}
	}
}

func TestConnectionSessionID(t *testing.T) {
	got := gateway.ConnectionSessionID("site-a-1", 3, 17)
	if got != "site-a-1/3/17" {
		t.Fatalf("ConnectionSessionID = %q", got)
	}
	if _, err := gateway.ParseSessionID(string(got)); err != nil {
		t.Fatal(err)
	}
}

func TestValidGatewayID(t *testing.T) {
	if err := gateway.ValidGatewayID("site-a-1"); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{"L", "L1a", "l1", "L-1", "Lobby"} {
		if err := gateway.ValidGatewayID(id); err != nil {
			t.Errorf("ValidGatewayID(%q) = %v, want nil", id, err)
		}
	}
	for _, id := range []string{"", "site a", "site/a", "L1", "L0", "L007"} {
		if err := gateway.ValidGatewayID(id); !errors.Is(err, gateway.ErrInvalidDeviceID) {
			t.Errorf("ValidGatewayID(%q) = %v, want ErrInvalidDeviceID", id, err)
		}
	}
}

// fnv1a32 is the reference FNV-1a (32 bit) that docs/design.md §3.1 names; every
// gateway and store must agree on it, so ShardOf is pinned to it.
func fnv1a32(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

func TestShardOf(t *testing.T) {
	// Published FNV-1a 32 test vectors, then values pinned for the
	// default 16 shards and for 64.
	for _, tc := range []struct {
		in   string
		hash uint32
	}{{"", 0x811c9dc5}, {"a", 0xe40c292c}, {"foobar", 0xbf9cf968}} {
		if got := fnv1a32(tc.in); got != tc.hash {
			t.Fatalf("reference fnv1a32(%q) = %#x, want %#x", tc.in, got, tc.hash)
		}
	}
	for _, tc := range []struct {
		device   string
		s16, s64 int
		hash     uint32
	}{
		{"a", 12, 44, 0xe40c292c},
		{"foobar", 8, 40, 0xbf9cf968},
		{"dev-1", 6, 54, 0x181c8e76},
		{"device-0001", 13, 45, 0xb35decad},
		{"sensor.42:eth0", 8, 40, 0x144d7468},
		{"Z_z-9.:", 6, 54, 0xa37d1a36},
	} {
		d := mustDevice(t, tc.device)
		if fnv1a32(tc.device) != tc.hash {
			t.Fatalf("fnv1a32(%q) = %#x, want %#x", tc.device, fnv1a32(tc.device), tc.hash)
		}
		if got := gateway.ShardOf(d, 16); got != tc.s16 {
			t.Errorf("ShardOf(%q, 16) = %d, want %d", tc.device, got, tc.s16)
		}
		if got := gateway.ShardOf(d, 64); got != tc.s64 {
			t.Errorf("ShardOf(%q, 64) = %d, want %d", tc.device, got, tc.s64)
		}
		if got := gateway.ShardOf(d, 1); got != 0 {
			t.Errorf("ShardOf(%q, 1) = %d", tc.device, got)
		}
	}
	// And across many IDs and shard counts, including ones that are not
	// powers of two.
	for i := range 2000 {
		d := mustDevice(t, "dev-"+strings.Repeat("x", i%7)+string(rune('a'+i%26))+strings.Repeat("9", i%11))
		for _, shards := range []int{1, 3, 16, 48, 1000} {
			if got, want := gateway.ShardOf(d, shards), int(fnv1a32(string(d))%uint32(shards)); got != want {
				t.Fatalf("ShardOf(%q, %d) = %d, reference %d", d, shards, got, want)
			}
		}
	}
}

func FuzzParseDeviceID(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		d, err := gateway.ParseDeviceID(s)
		switch valid := deviceIDRe.MatchString(s); {
		case valid && (err != nil || string(d) != s):
			t.Fatalf("ParseDeviceID(%q) = %q, %v; it matches %v", s, d, err, deviceIDRe)
		case !valid && (!errors.Is(err, gateway.ErrInvalidDeviceID) || d != ""):
			t.Fatalf("ParseDeviceID(%q) = %q, %v; it does not match %v", s, d, err, deviceIDRe)
		}
	})
}

func FuzzParseSessionID(f *testing.F) {
	f.Fuzz(func(t *testing.T, s string) {
		id, err := gateway.ParseSessionID(s)
		switch valid := sessionIDRe.MatchString(s); {
		case valid && (err != nil || string(id) != s):
			t.Fatalf("ParseSessionID(%q) = %q, %v; it matches %v", s, id, err, sessionIDRe)
		case !valid && (!errors.Is(err, gateway.ErrInvalidSessionID) || id != ""):
			t.Fatalf("ParseSessionID(%q) = %q, %v; it does not match %v", s, id, err, sessionIDRe)
		}
	})
}

func TestParseBootID(t *testing.T) {
	for _, bad := range []string{"", "1234", "00000000-0000-0000-0000-000000000000", "zz000000-0000-4000-8000-000000000001"} {
		if _, err := gateway.ParseBootID(bad); err == nil {
			t.Errorf("gateway.ParseBootID(%q) accepted", bad)
		}
	}
	id, err := gateway.ParseBootID("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0\n")
	if err != nil || id != (gateway.BootID{0x0f, 0x1e, 0x2d, 0x3c, 0x4b, 0x5a, 0x69, 0x78, 0x87, 0x96, 0xa5, 0xb4, 0xc3, 0xd2, 0xe1, 0xf0}) {
		t.Fatalf("ParseBootID = %x, %v", id, err)
	}
}
