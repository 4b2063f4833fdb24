package sim

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
)

// conGateway reads requests on a real socket; it answers (a piggybacked
// 2.04) from the copy numbered answerAt on (0: the first), and returns
// the copies it saw.
func conGateway(t *testing.T, srv *net.UDPConn, copies, answerAt int) []*pool.Message {
	t.Helper()
	var got []*pool.Message
	buf := make([]byte, 1500)
	for i := range copies {
		_ = srv.SetReadDeadline(time.Now().Add(5 * time.Second))
		n, from, err := srv.ReadFromUDP(buf)
		if err != nil {
			t.Fatalf("copy %d: %v", i, err)
		}
		m := pool.NewMessage(context.Background())
		if _, err := m.UnmarshalWithDecoder(coder.DefaultCoder, buf[:n]); err != nil {
			t.Fatal(err)
		}
		got = append(got, m)
		if i < answerAt {
			continue
		}
		a := pool.NewMessage(context.Background())
		a.SetType(message.Acknowledgement)
		a.SetCode(codes.Changed)
		a.SetMessageID(m.MessageID())
		a.SetToken(m.Token())
		b, err := a.MarshalWithEncoder(coder.DefaultCoder)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := srv.WriteToUDP(b, from); err != nil {
			t.Fatal(err)
		}
	}
	return got
}

// A CON request unanswered for its ACK timeout goes again, the same
// message from the same endpoint, with the wait doubled; the answer to
// the copy makes the first send the evidence. One never answered goes
// MAX_RETRANSMIT times more and is then given up.
func TestCoAPConRetransmission(t *testing.T) {
	srv, err := net.ListenUDP("udp4", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	stats := newStats(30 * time.Second)
	f, err := newCoAPFleet(context.Background(), []string{srv.LocalAddr().String()}, nil, 1, 1, stats)
	if err != nil {
		t.Fatal(err)
	}
	defer f.close()
	plans := Plan(PlanOptions{Devices: 4, Duration: time.Minute, Heartbeat: 30 * time.Second, CoAPGateways: 1, Seed: 1, Prefix: "r-"})
	answered, lost := plans[1], plans[3] // CON devices
	if answered.Proto != CoAPCon || lost.Proto != CoAPCon {
		t.Fatalf("plan %+v", plans)
	}
	ta, tl := &truth{id: answered.ID}, &truth{id: lost.ID}
	da, dl := f.add(1, answered, ta), f.add(3, lost, tl)

	t0 := time.Unix(2000, 0)
	sess := f.send(da, 0, "", codes.POST, t0)
	f.flush()
	// not answered at once: the first retransmission comes after
	// 2–3 s, not before
	f.sweep(t0.Add(1999 * time.Millisecond))
	f.flush()
	f.sweep(t0.Add(3001 * time.Millisecond))
	f.flush()
	copies := conGateway(t, srv, 2, 1)
	if copies[0].MessageID() != copies[1].MessageID() || string(copies[0].Token()) != string(copies[1].Token()) || copies[0].Type() != message.Confirmable {
		t.Fatalf("the copy differs: %v / %v", copies[0], copies[1])
	}
	deadline := time.Now().Add(5 * time.Second)
	for len(ta.device().Sessions[0].Evidence) == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if ev := ta.device().Sessions; len(ev) != 1 || ev[0].ID != sess.ID || len(ev[0].Evidence) != 1 || !ev[0].Evidence[0].Equal(t0) || !ev[0].LastSent.Equal(t0.Add(3001*time.Millisecond)) {
		t.Fatalf("truth %+v", ev)
	}
	if stats.retransmits.Load() != 1 || stats.unanswered.Load() != 0 {
		t.Fatalf("retransmits %d, unanswered %d", stats.retransmits.Load(), stats.unanswered.Load())
	}

	// never answered: 1 + 4 copies, at waits doubling from 2–3 s, then
	// given up
	f.send(dl, 0, "", codes.POST, t0)
	f.flush()
	now := t0
	for range 100 {
		now = now.Add(sweepEvery * 10)
		f.sweep(now)
		f.flush()
	}
	conGateway(t, srv, 1+maxRetransmit, 1+maxRetransmit)
	if got := stats.retransmits.Load() - 1; got != maxRetransmit || stats.unanswered.Load() != 1 {
		t.Fatalf("retransmits %d, unanswered %d", got, stats.unanswered.Load())
	}
	_ = srv.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, _, err := srv.ReadFromUDP(make([]byte, 1500)); err == nil {
		t.Fatal("a copy after MAX_RETRANSMIT")
	}
}
