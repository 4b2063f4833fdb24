package sdk_test

import (
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
