package main

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
)

// A CoAP device asks for a longer lease (l=<seconds>) within
// presence.max_lease: it is answered with the Max-Age that fits it, and
// the store holds the device for that lease, not presence.lease.
func TestCoAPLeaseAsked(t *testing.T) {
	t.Parallel()
	gw := newGateway(t, "gw-l", "", fastTiming) // lease 4s, heartbeat 1s
	gw.env = append(gw.env, "FLEETGATE_PRESENCE_MAX_LEASE=60s")
	gw.start()
	post := func(query ...string) (uint32, time.Time) {
		t.Helper()
		cc := dialCoAP(t, gw.coapAddr)
		defer cc.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		var opts message.Options
		for _, q := range query {
			opts = append(opts, message.Option{ID: message.URIQuery, Value: []byte(q)})
		}
		sent := time.Now()
		resp, err := cc.Post(ctx, "/hb", message.TextPlain, nil, opts...)
		if err != nil {
			t.Fatal(err)
		}
		if resp.Code() != codes.Changed {
			t.Fatalf("POST /hb %v: %v, want 2.04", query, resp.Code())
		}
		v, err := resp.GetOptionUint32(message.MaxAge)
		if err != nil {
			t.Fatalf("no Max-Age: %v", err)
		}
		return v, sent
	}
	deadline := func() time.Time {
		t.Helper()
		var info struct {
			Deadline time.Time `json:"deadline"`
		}
		waitFor(t, 10*time.Second, "dev-l in the store", func() bool {
			code, out, _ := runCLI(t, "devices", "get", "--addr", gw.admin, "--json", "dev-l")
			return code == 0 && json.Unmarshal([]byte(out), &info) == nil && !info.Deadline.IsZero()
		})
		return info.Deadline
	}

	if got, _ := post("d=dev-l", "l=30"); got != 27 {
		t.Fatalf("Max-Age for l=30 = %d, want 27 (30s - (4s - 1s))", got)
	}
	if got, _ := post("d=dev-l", "l=600"); got != 57 {
		t.Fatalf("Max-Age for l=600 = %d, want 57 (granted max_lease 60s)", got)
	}
	_, sent := post("d=dev-l", "l=60")
	waitFor(t, 10*time.Second, "the 60s lease in the store", func() bool {
		d := deadline()
		return d.After(sent.Add(50*time.Second)) && d.Before(time.Now().Add(61*time.Second))
	})
	if got, _ := post("d=dev-other"); got != 1 {
		t.Fatalf("Max-Age without l= = %d, want the heartbeat interval 1", got)
	}
	gw.stop()
}
