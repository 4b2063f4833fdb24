package sdk_test

import (
	"net"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/plugins/sdk"
)

func TestDecodeConfig(t *testing.T) {
	type config struct {
		Listen string `json:"listen"`
		Max    int    `json:"max"`
	}
	for _, tc := range []struct {
		raw  string
		want config
		err  string // "" for none; else a part of the error
	}{
		{raw: `{}`, want: config{Listen: ":7000", Max: 1}},
		{raw: ` {"listen": "127.0.0.1:7001", "max": 5} ` + "\n", want: config{Listen: "127.0.0.1:7001", Max: 5}},
		{raw: `{"lisen": ":1"}`, err: `config: json: unknown field "lisen"`},
		{raw: `{"max": "5"}`, err: "config: json: cannot unmarshal string"},
		{raw: `{"max": 5} {"max": 6}`, err: "config: trailing data after the JSON object"},
		{raw: `{"max": 5}}`, err: "config: trailing data after the JSON object"},
		{raw: `{"max": 5`, err: "config: unexpected EOF"},
		{raw: ``, err: "config: EOF"},
	} {
		c := config{Listen: ":7000", Max: 1}
		err := sdk.DecodeConfig([]byte(tc.raw), &c)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.raw, err)
		case tc.err == "" && c != tc.want:
			t.Errorf("%q: decoded %+v, want %+v", tc.raw, c, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want %q", tc.raw, err, tc.err)
		}
	}
}

func TestExposed(t *testing.T) {
	for _, tc := range []struct {
		network, addr string
		want          bool
	}{
		{"udp", "127.0.0.1:5700", false},
		{"udp", "127.0.0.2:5700", false},
		{"tcp", "[::1]:8090", false},
		{"udp", ":5700", true},
		{"tcp", "0.0.0.0:8090", true},
		{"tcp", "[::]:8090", true},
		{"tcp", "192.0.2.1:8090", true},
	} {
		var a net.Addr
		var err error
		if tc.network == "udp" {
			a, err = net.ResolveUDPAddr("udp", tc.addr)
		} else {
			a, err = net.ResolveTCPAddr("tcp", tc.addr)
		}
		if err != nil {
			t.Fatal(err)
		}
		if got := sdk.Exposed(a); got != tc.want {
			t.Errorf("Exposed(%s %s) = %v, want %v", tc.network, tc.addr, got, tc.want)
		}
	}
}
