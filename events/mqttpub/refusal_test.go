package mqttpub

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
)

// A refusal is the broker's answer about the message; a failure of the
// connection is none (the message waits for the broker).
func TestRefusal(t *testing.T) {
	for _, tc := range []struct {
		name string
		resp *paho.PublishResponse
		err  error
		want string
	}{
		{"acknowledged", &paho.PublishResponse{ReasonCode: 0}, nil, ""},
		{"no matching subscribers", &paho.PublishResponse{ReasonCode: 0x10}, nil, ""},
		{"not authorized (PUBACK)", &paho.PublishResponse{ReasonCode: 0x87}, errors.New("error publishing: not authorized"), "reason code 0x87"},
		{"quota exceeded (PUBREC)", &paho.PublishResponse{ReasonCode: 0x97, Properties: &paho.PublishResponseProperties{ReasonString: "slow down"}}, nil, "reason code 0x97 (slow down)"},
		{"retain not available", nil, fmt.Errorf("%w: cannot send Publish with retain flag set", paho.ErrInvalidArguments), "invalid argument: cannot send Publish with retain flag set"},
		{"connection down", nil, autopaho.ConnectionDownError, ""},
		{"timeout", nil, context.DeadlineExceeded, ""},
	} {
		if got := refusal(tc.resp, tc.err); got != tc.want {
			t.Errorf("%s: refusal = %q, want %q", tc.name, got, tc.want)
		}
	}
}
