package sdk

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// TestTakeFillsFrames: what is pending goes out in frames of at most
// MaxFrame, oldest first.
func TestTakeFillsFrames(t *testing.T) {
	k := newSink()
	for i := range 2500 {
		if err := k.Send(t.Context(), Evidence{Kind: Renew, Device: fmt.Sprint("d-", i)}); err != nil {
			t.Fatal(err)
		}
	}
	var sizes []int
	var batch []Evidence
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
	items := []Evidence{
		{Kind: Renew, Device: "d-1", At: now},
		{Kind: Connect, Device: "dev.2:x", Instance: "gw-7", At: now.Add(-1500 * time.Millisecond)},
		{Kind: Leave, Device: "d-3", At: now.Add(time.Second)}, // in the future: age 0
		{Kind: Renew, Device: "d-4", At: now.Add(-time.Hour), Metadata: map[string]string{"rssi": "-97", "": "empty key", "snr": ""}},
		{Kind: Kind(99), Device: "d-5", At: now},
		{Kind: Kind(-1), At: now},
		{},
	}
	want := &pb.EvidenceFrame{Ready: true}
	for _, ev := range items {
		age := max(0, now.Sub(ev.At).Microseconds())
		want.Evidence = append(want.Evidence, &pb.Evidence{Kind: pb.Kind(ev.Kind), Device: ev.Device,
			Instance: ev.Instance, AgeUs: age, Metadata: ev.Metadata})
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
	plain := &pb.EvidenceFrame{Ready: true, Evidence: []*pb.Evidence{want.Evidence[0], want.Evidence[1], want.Evidence[4]}}
	ref, err := proto.Marshal(plain)
	if err != nil {
		t.Fatal(err)
	}
	mine, err := proto.Marshal(first(encodeFrame(true, []Evidence{items[0], items[1], items[4]}, now, nil)))
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
	k := newSink()
	var batch []Evidence
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
	k := newSink()
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
	var batch []Evidence
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
