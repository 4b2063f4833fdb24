package sdk

import (
	"fmt"
	"math"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// testSink is a sink of a stream whose host takes data.
func testSink(t testing.TB) *sink {
	st := newSettler()
	return newSink(t.Context(), true, &st)
}

// TestTakeFillsFrames: what is pending goes out in frames of at most
// MaxFrame, oldest first.
func TestTakeFillsFrames(t *testing.T) {
	k := testSink(t)
	for i := range 2500 {
		if err := k.Send(t.Context(), Evidence{Kind: Renew, Device: fmt.Sprint("d-", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var sizes []int
	var batch []item
	next := 0
	for k.len() > 0 && len(sizes) < 10 {
		batch = k.take(batch)
		sizes = append(sizes, len(batch))
		for _, ev := range batch {
			if want := fmt.Sprint("d-", next); ev.Device != want {
				t.Fatalf("item %d is %s, want %s", next, ev.Device, want)
			}
			next++
		}
	}
	if len(sizes) != 3 || sizes[0] != MaxFrame || sizes[1] != MaxFrame || sizes[2] != 500 {
		t.Fatalf("frame sizes %v, want [1000 1000 500]", sizes)
	}
}

// TestEncodedFrameIsAnEvidenceFrame: the SDK's hand-encoded frame
// decodes, as the host reads it, to the EvidenceFrame that proto would
// have built from the same evidence, ages included.
func TestEncodedFrameIsAnEvidenceFrame(t *testing.T) {
	now := time.Unix(1_700_000_000, 0)
	items := []item{
		{Evidence: Evidence{Kind: Renew, Device: "d-1", At: now}},
		{Evidence: Evidence{Kind: Connect, Device: "dev.2:x", Instance: "gw-7", At: now.Add(-1500 * time.Millisecond), Lease: 2 * time.Hour}},
		{Evidence: Evidence{Kind: Leave, Device: "d-3", At: now.Add(time.Second)}}, // in the future: age 0
		{Evidence: Evidence{Kind: Renew, Device: "d-4", At: now.Add(-time.Hour), Metadata: map[string]string{"rssi": "-97", "": "empty key", "snr": ""}}},
		{Evidence: Evidence{Kind: Kind(99), Device: "d-5", At: now}},
		{Evidence: Evidence{Kind: Kind(-1), At: now}},
		{},
		{Evidence: Evidence{Kind: Renew, Device: "d-6", At: now}, data: &dataItem{id: 300, d: Data{
			Topic: "telemetry/temp", Payload: []byte("21.5"), ContentType: "text/plain", QoS: 1,
			Properties: []Property{{"unit", "C"}, {"", ""}, {"unit", "K"}}}}},
		{Evidence: Evidence{Kind: Connect, Device: "d-7", At: now.Add(-time.Second), Lease: 1500 * time.Microsecond}, data: &dataItem{}},
		{Evidence: Evidence{Kind: Renew, Device: "d-8", At: now, Lease: 100 * 24 * time.Hour}, data: &dataItem{d: Data{Payload: make([]byte, 300)}}},
	}
	// lease_ms: whole milliseconds rounded up, at most the largest uint32
	leaseMs := map[int]uint32{1: 7_200_000, 8: 2, 9: math.MaxUint32}
	want := &pb.EvidenceFrame{Ready: true, SentUnixUs: now.UnixMicro()}
	for i, ev := range items {
		age := max(0, now.Sub(ev.At).Microseconds())
		e := &pb.Evidence{Kind: pb.Kind(ev.Kind), Device: ev.Device, Instance: ev.Instance, AgeUs: age, Metadata: ev.Metadata, LeaseMs: leaseMs[i]}
		if d := ev.data; d != nil {
			e.Data = &pb.Data{Id: d.id, Topic: d.d.Topic, Payload: d.d.Payload, ContentType: d.d.ContentType, Qos: uint32(d.d.QoS)}
			for _, p := range d.d.Properties {
				e.Data.Properties = append(e.Data.Properties, &pb.Property{Key: p.Key, Value: p.Value})
			}
		}
		want.Evidence = append(want.Evidence, e)
	}
	wire, err := proto.Marshal(first(encodeFrame(true, items, now, nil)))
	if err != nil {
		t.Fatal(err)
	}
	got := &pb.EvidenceFrame{}
	if err := proto.Unmarshal(wire, got); err != nil {
		t.Fatal(err)
	}
	if !proto.Equal(got, want) {
		t.Fatalf("decoded %v\nwant    %v", got, want)
	}
	// Byte for byte what proto writes, for items without a map (whose
	// order proto does not fix either).
	plain := &pb.EvidenceFrame{Ready: true, SentUnixUs: now.UnixMicro(), Evidence: []*pb.Evidence{want.Evidence[0], want.Evidence[1], want.Evidence[4],
		want.Evidence[7], want.Evidence[8], want.Evidence[9]}}
	ref, err := proto.MarshalOptions{Deterministic: true}.Marshal(plain)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := proto.Marshal(first(encodeFrame(true, []item{items[0], items[1], items[4], items[7], items[8], items[9]}, now, nil)))
	if err != nil {
		t.Fatal(err)
	}
	if string(ref) != string(mine) {
		t.Fatalf("encoded % x\nproto   % x", mine, ref)
	}
}

// cpuTime is the CPU time this process has used.
func cpuTime(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkSendAndEncode is the SDK's own cost per item: Send, take and
// the frame's encoding, in full frames. cpu-ns/op is the process's CPU
// time (GC included), steadier than wall time on a shared machine.
func BenchmarkSendAndEncode(b *testing.B) {
	k := testSink(b)
	var batch []item
	var ages []int64
	cpu0 := cpuTime(b)
	ids := make([]string, MaxFrame)
	for i := range ids {
		ids[i] = fmt.Sprint("bench-", i)
	}
	b.ReportAllocs()
	for i := range b.N {
		_ = k.Send(b.Context(), Evidence{Kind: Renew, Device: ids[i%MaxFrame]})
		if i%MaxFrame == MaxFrame-1 {
			batch = k.take(batch)
			var f *pb.EvidenceFrame
			f, ages = encodeFrame(false, batch, time.Now(), ages)
			if _, err := proto.Marshal(f); err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(cpuTime(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

func first(f *pb.EvidenceFrame, _ []int64) *pb.EvidenceFrame { return f }

// TestConcurrentSendersBeyondTheQueue: several goroutines send more than
// QueueSize between them while a slow consumer takes frames; every item
// arrives once, each sender's in order, no frame exceeds MaxFrame, and
// no Send stays blocked.
func TestConcurrentSendersBeyondTheQueue(t *testing.T) {
	const senders, each = 4, 5000
	k := testSink(t)
	errs := make(chan error, senders)
	for s := range senders {
		go func() {
			for i := range each {
				if err := k.Send(t.Context(), Evidence{Kind: Renew, Device: fmt.Sprintf("s%d-%d", s, i)}); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	next := make([]int, senders)
	got, done := 0, 0
	var batch []item
	deadline := time.Now().Add(20 * time.Second)
	for got < senders*each {
		if time.Now().After(deadline) {
			t.Fatalf("got %d of %d items before the deadline", got, senders*each)
		}
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
			done++
		case <-k.wake:
		case <-time.After(100 * time.Millisecond):
		}
		batch = k.take(batch)
		if len(batch) > MaxFrame {
			t.Fatalf("a frame of %d items", len(batch))
		}
		for _, ev := range batch {
			var s, i int
			if _, err := fmt.Sscanf(ev.Device, "s%d-%d", &s, &i); err != nil || i != next[s] {
				t.Fatalf("got %s, want s%d-%d", ev.Device, s, next[s])
			}
			next[s]++
			got++
		}
		time.Sleep(time.Millisecond) // a slow consumer: the queue fills
	}
	for done < senders {
		select {
		case err := <-errs:
			if err != nil {
				t.Fatal(err)
			}
			done++
		case <-time.After(5 * time.Second):
			t.Fatal("a sender did not return")
		}
	}
	if n := k.len(); n != 0 {
		t.Fatalf("%d items left in the queue", n)
	}
}

// TestFramesBoundedByBytes: big data items go out in frames of at most
// MaxFrameBytes, oldest first.
func TestFramesBoundedByBytes(t *testing.T) {
	k := testSink(t)
	payload := make([]byte, 600<<10)
	for i := range 7 {
		if err := k.Data(t.Context(), Data{Device: fmt.Sprint("d-", i), Payload: payload}); err != nil {
			t.Fatal(err)
		}
	}
	var sizes []int
	var batch []item
	next := 0
	for k.len() > 0 {
		batch = k.take(batch)
		n := 0
		for _, it := range batch {
			if want := fmt.Sprint("d-", next); it.Device != want {
				t.Fatalf("item %d is %s, want %s", next, it.Device, want)
			}
			n += itemBytes(&it)
			next++
		}
		if n > MaxFrameBytes {
			t.Fatalf("a frame of %d bytes", n)
		}
		sizes = append(sizes, len(batch))
	}
	if fmt.Sprint(sizes) != "[3 3 1]" {
		t.Fatalf("frame sizes %v, want [3 3 1]", sizes)
	}
}

// TestQueueBytesBlockData: Data blocks while QueueBytes are queued, and
// goes on once a frame has taken them.
func TestQueueBytesBlockData(t *testing.T) {
	k := testSink(t)
	payload := make([]byte, MaxDataBytes-200)
	n := 0
	for k.bytes+itemBytes(&item{data: &dataItem{d: Data{Payload: payload}}}) <= QueueBytes {
		if err := k.Data(t.Context(), Data{Payload: payload}); err != nil {
			t.Fatal(err)
		}
		n++
	}
	blocked := make(chan error, 1)
	go func() { blocked <- k.Data(t.Context(), Data{Payload: payload}) }()
	select {
	case err := <-blocked:
		t.Fatalf("Data beyond QueueBytes (%d items queued) returned %v, want it to wait", n, err)
	case <-time.After(100 * time.Millisecond):
	}
	k.take(nil)
	select {
	case err := <-blocked:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Data still blocked after a frame took items")
	}
}
