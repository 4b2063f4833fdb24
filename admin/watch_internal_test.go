package admin

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// appendEnvelope writes what json.Marshal writes, for a device's event
// and for a gateway's (no device: no reason, a contact).
func FuzzAppendEnvelope(f *testing.F) {
	f.Add("pump-17", "coap/default", "site-a-1", "v1:x@1-0", int64(1796078834146), int64(0), int64(0), uint64(3))
	f.Add("d", "s\"<&>\\\x01é", "gw\n", "", int64(0), int64(1796078834146), int64(0), uint64(0))
	f.Add("", "", "site-a-1", "v1:x@1-0", int64(1796078834146), int64(0), int64(1796078830000), uint64(1796078834146))
	f.Fuzz(func(t *testing.T, dev, sess, gw, cursor string, at, deadline, contact int64, ver uint64) {
		e := gateway.Envelope{Device: gateway.DeviceID(dev), State: gateway.Offline, Ver: ver, Reason: gateway.ReasonExpired,
			Gateway: gw, Session: gateway.SessionID(sess), Cursor: cursor}
		if dev == "" {
			e.State, e.Reason = gateway.Lost, ""
		}
		if at != 0 {
			e.At = time.UnixMilli(at % 1e14).UTC()
		}
		if deadline != 0 {
			e.Deadline = time.UnixMilli(deadline % 1e14).UTC()
		}
		if contact != 0 {
			e.Contact = time.UnixMilli(contact % 1e14).UTC()
		}
		want, err := json.Marshal(e)
		if err != nil {
			t.Skip() // times json cannot write
		}
		if got := appendEnvelope(nil, e, cursor); string(got) != string(want) {
			t.Errorf("appendEnvelope\n%s\njson.Marshal\n%s", got, want)
		}
	})
}

// A page token of /v1/snapshot from outside never crashes its parser.
func FuzzParseSnapshotPage(f *testing.F) {
	f.Add("0~~v1:a@0,b@1-2,c@0")
	f.Add("2~12.3~v1:a@0,b@1-2,c@0")
	f.Add("~~")
	f.Fuzz(func(t *testing.T, s string) {
		p, err := parseSnapshotPage(s, 3)
		if err != nil {
			return
		}
		if p.shard < 0 || p.shard >= 3 {
			t.Errorf("shard %d out of range", p.shard)
		}
		if _, err := gateway.ParseCursor(p.cursor, 3); err != nil {
			t.Errorf("accepted page with a bad cursor: %v", err)
		}
	})
}
