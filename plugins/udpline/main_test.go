package main

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
	"github.com/fleetgate/fleetgate/plugins/sdk"
	"github.com/fleetgate/fleetgate/plugins/sdk/sdktest"
)

func freeUDP(t *testing.T) string {
	t.Helper()
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	return pc.LocalAddr().String()
}

func send(ctx context.Context, addr, text string) error {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_, err = c.Write([]byte(text))
	return err
}

func TestConformance(t *testing.T) {
	sdktest.Conformance(t, sdktest.Suite{
		Info: sdk.Info{Name: "udpline", Version: "test"},
		New:  func(*testing.T) sdk.Adapter { return &adapter{} },
		Setup: func(t *testing.T) ([]byte, func(context.Context) (sdktest.Expect, error)) {
			addr := freeUDP(t)
			n := 0
			return []byte(fmt.Sprintf(`{"listen": %q}`, addr)), func(ctx context.Context) (sdktest.Expect, error) {
				n++
				dev := fmt.Sprintf("dev-%d", n)
				return sdktest.Expect{Kind: pb.Kind_KIND_RENEW, Device: dev, Instance: "radio1"}, send(ctx, addr, "hb "+dev+" radio1\n")
			}
		},
		BadConfig: []byte(`{"listen": "127.0.0.1:99999"}`),
		SetupData: func(t *testing.T) ([]byte, sdktest.DataTrigger) {
			addr := freeUDP(t)
			n := 0
			return []byte(fmt.Sprintf(`{"listen": %q}`, addr)), func(ctx context.Context) (sdktest.ExpectData, <-chan error, error) {
				n++
				dev := fmt.Sprintf("dev-%d", n)
				want := sdktest.ExpectData{Kind: pb.Kind_KIND_RENEW, Device: dev, Instance: "radio1", Topic: "telemetry/temp", Payload: []byte("21.5 C")}
				return want, nil, send(ctx, addr, "hb "+dev+" radio1 >telemetry/temp 21.5 C\n")
			}
		},
		SetupCommands: func(t *testing.T) ([]byte, sdktest.CommandCase) {
			addr := freeUDP(t)
			device, err := net.ListenPacket("udp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { device.Close() })
			return []byte(fmt.Sprintf(`{"listen": %q}`, addr)), sdktest.CommandCase{
				Prepare: func(context.Context) error {
					to, err := net.ResolveUDPAddr("udp", addr)
					if err != nil {
						return err
					}
					_, err = device.WriteTo([]byte("hb ctl-1\n"), to)
					return err
				},
				Accept: &pb.Command{Id: 1, Device: "ctl-1", Topic: "cmd/valve", Payload: []byte("open 50%")},
				Received: func(context.Context) error {
					return receiveLine(device, "cmd ctl-1 >cmd/valve open 50%\n")
				},
				Refuse: &pb.Command{Id: 2, Device: "ctl-1", Topic: "cmd", Payload: []byte("two\nlines")},
			}
		},
	})
}

// receiveLine reads one datagram from pc and checks it is want.
func receiveLine(pc net.PacketConn, want string) error {
	buf := make([]byte, maxDatagram)
	if err := pc.SetReadDeadline(time.Now().Add(5 * time.Second)); err != nil {
		return err
	}
	n, _, err := pc.ReadFrom(buf)
	if err != nil {
		return err
	}
	if got := string(buf[:n]); got != want {
		return fmt.Errorf("got %q, want %q", got, want)
	}
	return nil
}

func TestConfigureRefusesUnknownKeys(t *testing.T) {
	err := (&adapter{}).Configure(context.Background(), []byte(`{"listen": ":1", "lisen": ":2"}`))
	if err == nil || !strings.Contains(err.Error(), `unknown field "lisen"`) {
		t.Fatalf("err = %v, want unknown field lisen", err)
	}
}

// TestMalformedLinesCountedStreamGoesOn sends a datagram with good and bad
// lines: the good ones arrive, the bad ones are counted.
func TestMalformedLinesCountedStreamGoesOn(t *testing.T) {
	a := &adapter{}
	h := sdktest.Start(t, sdk.Info{Name: "udpline", Version: "test"}, a)
	addr := freeUDP(t)
	ctx := t.Context()
	st, err := h.Open(ctx, []byte(fmt.Sprintf(`{"listen": %q}`, addr)))
	if err != nil {
		t.Fatal(err)
	}
	if err := send(ctx, addr, "hb a\r\nping b\nhb\n\nbye a x\nhb c d e\n"); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		kind     pb.Kind
		dev, ins string
	}{{pb.Kind_KIND_RENEW, "a", ""}, {pb.Kind_KIND_LEAVE, "a", "x"}} {
		ev, err := st.Next()
		if err != nil {
			t.Fatal(err)
		}
		if ev.GetKind() != want.kind || ev.GetDevice() != want.dev || ev.GetInstance() != want.ins {
			t.Fatalf("got %v, want %+v", ev, want)
		}
	}
	// the last bad line follows the last good one: counted just after
	for i := 0; a.malformed.Load() < 3 && i < 200; i++ {
		time.Sleep(5 * time.Millisecond)
	}
	if n := a.malformed.Load(); n != 3 {
		t.Fatalf("malformed = %d, want 3", n)
	}
}

func TestParseDatagram(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want []Line
		bad  int
	}{
		{in: "hb d1", want: []Line{{Kind: sdk.Renew, Device: "d1"}}},
		{in: "hb d1 i1\r\nbye d2\n", want: []Line{{Kind: sdk.Renew, Device: "d1", Instance: "i1"}, {Kind: sdk.Leave, Device: "d2"}}},
		{in: "\n\n  \n", want: nil},
		{in: "HB d1", bad: 1},
		{in: "hb", bad: 1},
		{in: "hb a b c", bad: 1},
		{in: "hb " + strings.Repeat("x", 201), bad: 1},
		{in: "hb\td1\ti1", want: []Line{{Kind: sdk.Renew, Device: "d1", Instance: "i1"}}},
		{in: "hb d1 >t/1 21.5 C", want: []Line{{Kind: sdk.Renew, Device: "d1", Data: true, Topic: "t/1", Payload: []byte("21.5 C")}}},
		{in: "hb d1 i1 >t  two  blanks \r\n", want: []Line{{Kind: sdk.Renew, Device: "d1", Instance: "i1", Data: true, Topic: "t", Payload: []byte(" two  blanks ")}}},
		{in: "hb d1 > root", want: []Line{{Kind: sdk.Renew, Device: "d1", Data: true, Payload: []byte("root")}}},
		{in: "hb d1 >t", want: []Line{{Kind: sdk.Renew, Device: "d1", Data: true, Topic: "t", Payload: []byte{}}}},
		{in: "hb d1 >t\tx>y", want: []Line{{Kind: sdk.Renew, Device: "d1", Data: true, Topic: "t", Payload: []byte("x>y")}}},
		{in: "bye d1 >t x", bad: 1},
		{in: "hb >t x", bad: 1},
		{in: "hb d1 i1 extra >t x", bad: 1},
		{in: "hb d1 >" + strings.Repeat("t", 1025) + " x", bad: 1},
	} {
		got := ParseDatagram([]byte(tc.in))
		var ok []Line
		bad := 0
		for _, l := range got {
			if l.Err != nil {
				bad++
				continue
			}
			ok = append(ok, l)
		}
		if bad != tc.bad || fmt.Sprint(ok) != fmt.Sprint(tc.want) {
			t.Errorf("ParseDatagram(%q) = %v (%d bad), want %v (%d bad)", tc.in, ok, bad, tc.want, tc.bad)
		}
	}
}

// FuzzParseDatagram: every line parsed is well formed — a known verb, a
// device and instance without blanks, data only on a heartbeat, a topic
// without blanks and a payload without a line break — and a heartbeat
// with data written back the way a device writes it parses to the same
// line.
func FuzzParseDatagram(f *testing.F) {
	for _, s := range []string{"hb d1", "bye d1 i1\r\nhb d2\n", "hb", "\xff\xfe", "hb a b c d", "hb d1 i1 >t/1 21.5 C", "hb d1 >", "hb d1 > >x"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, l := range ParseDatagram(b) {
			if l.Err != nil {
				continue
			}
			if l.Kind != sdk.Renew && l.Kind != sdk.Leave {
				t.Fatalf("kind %v", l.Kind)
			}
			if l.Device == "" || strings.ContainsAny(l.Device+l.Instance, " \t\n") || len(l.Device) > maxField {
				t.Fatalf("bad fields %q %q", l.Device, l.Instance)
			}
			if !l.Data {
				continue
			}
			if l.Kind != sdk.Renew || strings.ContainsAny(l.Topic, " \t\n") || bytes.ContainsAny(l.Payload, "\n") {
				t.Fatalf("bad data %+v", l)
			}
			line := "hb " + l.Device
			if l.Instance != "" {
				line += " " + l.Instance
			}
			line += " >" + l.Topic + " " + string(l.Payload)
			again := ParseDatagram([]byte(line + "\n"))
			if bytes.HasSuffix(l.Payload, []byte("\r")) || len(bytes.TrimSpace([]byte(line))) == 0 {
				continue // a CR before the line break is the line's end
			}
			if len(again) != 1 || again[0].Err != nil || again[0].Device != l.Device || again[0].Instance != l.Instance ||
				again[0].Topic != l.Topic || !bytes.Equal(again[0].Payload, l.Payload) {
				t.Fatalf("%+v written as %q parses to %+v", l, line, again)
			}
		}
	})
}

// A datagram proves nothing about its sender: by default udpline listens
// on loopback only.
func TestDefaultListenIsLoopback(t *testing.T) {
	a := &adapter{}
	if err := a.Configure(t.Context(), []byte(`{}`)); err != nil {
		t.Fatal(err)
	}
	addr, err := net.ResolveUDPAddr("udp", a.cfg.Listen)
	if err != nil {
		t.Fatal(err)
	}
	if sdk.Exposed(addr) {
		t.Fatalf("default listen %q is reachable from other hosts, want loopback", a.cfg.Listen)
	}
}
