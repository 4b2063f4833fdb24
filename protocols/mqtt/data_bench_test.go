package mqtt

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mochi "github.com/mochi-mqtt/server/v2"
	"github.com/mochi-mqtt/server/v2/packets"

	"github.com/fleetgate/fleetgate/gateway"
)

// countSink is the benchmark's DataSink: it takes every message at once.
type countSink struct{ n atomic.Int64 }

func (k *countSink) Publish(_ context.Context, msgs []gateway.Message) error {
	k.n.Add(int64(len(msgs)))
	return nil
}

// Publishers of BenchmarkPublishQoS1: connections, the QoS 1 messages
// each keeps in flight (below the broker's receive maximum, 64), and the
// rounds of each way.
const (
	benchPublishers = 4
	benchWindow     = 32
	benchRounds     = 3
)

// BenchmarkPublishQoS1 measures QoS 1 PUBLISH throughput through the
// front end into a DataSink that returns at once (msgs/s), against the
// same publishes with no sink (ceiling-msgs/s, the broker alone), and
// reports their ratio. b.N messages each way and round, from
// benchPublishers MQTT 5 devices in this process, each pipelining
// benchWindow PUBLISHes of 16 bytes to "devices/<id>/telemetry" and
// reading the PUBACKs. The two alternate for benchRounds rounds and the
// best of each counts, so that neither gains from going second.
func BenchmarkPublishQoS1(b *testing.B) {
	var ceiling, rate float64
	k := &countSink{}
	for range benchRounds {
		ceiling = max(ceiling, publishRate(b, nil))
		rate = max(rate, publishRate(b, k))
	}
	if got := k.n.Load(); got != int64(benchRounds*b.N) {
		b.Fatalf("the sink took %d of %d messages", got, benchRounds*b.N)
	}
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(ceiling, "ceiling-msgs/s")
	b.ReportMetric(rate/ceiling, "ratio-to-ceiling")
}

// publishRate runs b.N QoS 1 publishes through a server with sink (nil:
// none) and returns the messages per second.
func publishRate(b *testing.B, sink gateway.DataSink) float64 {
	b.Helper()
	s := startServer(b, &countingObserver{}, Options{AllowAnonymous: true, Sink: sink, HeartbeatInterval: time.Hour,
		ConnectsPerSecond: 1000, AnonymousConnectsPerSecond: 1000})
	conns := make([]net.Conn, benchPublishers)
	for i := range conns {
		r := dialRaw(b, tcpAddr(s))
		if code := r.connack(connectPacket(b, 5, fmt.Sprintf("bench-%d", i), "", 0)); code != 0 {
			b.Fatalf("connack %#x", code)
		}
		conns[i] = r.Conn
	}
	var wg sync.WaitGroup
	errs := make(chan error, benchPublishers)
	begin := time.Now()
	for i, c := range conns {
		n := b.N / benchPublishers
		if i < b.N%benchPublishers {
			n++
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := publishN(c, fmt.Sprintf("devices/bench-%d/telemetry", i), n); err != nil {
				errs <- err
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(begin)
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
	return float64(b.N) / elapsed.Seconds()
}

// publishN sends n QoS 1 PUBLISHes to topic on c, at most benchWindow
// unacknowledged, and returns once every PUBACK came.
func publishN(c net.Conn, topic string, n int) error {
	var frame []byte
	{
		pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, ProtocolVersion: 5,
			PacketID: 1, TopicName: topic, Payload: []byte("0123456789abcdef")}
		var buf bytes.Buffer
		if err := pk.PublishEncode(&buf); err != nil {
			return err
		}
		frame = buf.Bytes()
	}
	idAt := len(frame) - 16 - 1 - 2 // payload, properties length, packet ID
	window := make(chan struct{}, benchWindow)
	acked := make(chan error, 1)
	go func() {
		rd := bufio.NewReader(c)
		for range n {
			typ, err := readFrame(rd)
			if err == nil && typ != packets.Puback {
				err = fmt.Errorf("packet type %d, want PUBACK", typ)
			}
			if err != nil {
				acked <- err
				return
			}
			<-window
		}
		acked <- nil
	}()
	w := bufio.NewWriter(c)
	for i := range n {
		select {
		case window <- struct{}{}:
		default:
			if err := w.Flush(); err != nil {
				return err
			}
			window <- struct{}{}
		}
		id := uint16(i%65535 + 1)
		frame[idAt], frame[idAt+1] = byte(id>>8), byte(id)
		if _, err := w.Write(frame); err != nil {
			return err
		}
	}
	if err := w.Flush(); err != nil {
		return err
	}
	return <-acked
}

// readFrame reads one packet and returns its type.
func readFrame(rd *bufio.Reader) (byte, error) {
	hdr, err := rd.ReadByte()
	if err != nil {
		return 0, err
	}
	n, mult := 0, 1
	for {
		b, err := rd.ReadByte()
		if err != nil {
			return 0, err
		}
		n += int(b&0x7f) * mult
		mult *= 128
		if b&0x80 == 0 {
			break
		}
	}
	if _, err := rd.Discard(n); err != nil {
		return 0, err
	}
	return hdr >> 4, nil
}

// BenchmarkPublishUpHook measures the hook's part of a QoS 1 PUBLISH on
// its own (OnPublish into a sink that returns at once: the message built,
// the call bounded by sinkTimeout), without the network, the broker or a
// client: ns/op and allocs/op are the data path's cost per message.
func BenchmarkPublishUpHook(b *testing.B) {
	s := startServer(b, &countingObserver{}, Options{AllowAnonymous: true, Sink: &countSink{}})
	h := &presence{srv: s}
	cl := &mochi.Client{}
	cl.Net.Conn = &conn{device: "dev-1", session: "gw-1/7/1", root: "devices/dev-1"}
	pk := packets.Packet{FixedHeader: packets.FixedHeader{Type: packets.Publish, Qos: 1}, PacketID: 1,
		TopicName: "devices/dev-1/telemetry", Payload: []byte("0123456789abcdef")}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.OnPublish(cl, pk); err != nil {
			b.Fatal(err)
		}
	}
}
