package mqtt

import (
	"io"
	"net"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// FuzzConnection plays a byte stream from a device through mochi and the
// presence hook (on a net.Pipe, without the listener), then checks that
// the connection ended without a panic, gave its max_clients slot back,
// and that the evidence is well-formed: a session's evidence starts with
// its Connect and nothing follows a Leave. The seed corpus is in
// testdata/fuzz/FuzzConnection.
func FuzzConnection(f *testing.F) {
	rec := &recorder{}
	s := startServer(f, rec, Options{AllowAnonymous: true, Credentials: testCreds(f), MaxPacketSize: 2048})
	f.Fuzz(func(t *testing.T, stream []byte) {
		rec.Take()

		server, device := net.Pipe()
		c := &conn{Conn: server}
		_ = server.SetDeadline(time.Now().Add(2 * time.Second))
		go func() {
			_, _ = device.Write(stream)
			_ = device.Close()
		}()
		drained := make(chan struct{})
		go func() {
			defer close(drained)
			_, _ = io.Copy(io.Discard, device)
		}()
		_ = s.broker.EstablishConnection("tcp", c)
		s.release(c)
		_ = server.Close()
		<-drained

		if n := s.conns.Load(); n != 0 {
			t.Fatalf("%d slots held after the connection ended", n)
		}
		evs := rec.Evidence()
		checkEvidence(t, evs)
		state := map[gateway.SessionID]gateway.Kind{}
		for _, ev := range evs {
			last, seen := state[ev.Session]
			switch {
			case !seen && ev.Kind != gateway.Connect:
				t.Fatalf("%v before Connect: %+v", ev.Kind, evs)
			case seen && (ev.Kind == gateway.Connect || last == gateway.Leave):
				t.Fatalf("%v after %v: %+v", ev.Kind, last, evs)
			}
			state[ev.Session] = ev.Kind
		}
	})
}
