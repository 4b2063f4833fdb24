package sdk

import (
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// Field numbers of pb.Evidence and of its metadata entries.
const (
	fieldKind     protowire.Number = 1
	fieldDevice   protowire.Number = 2
	fieldInstance protowire.Number = 3
	fieldAge      protowire.Number = 4
	fieldMetadata protowire.Number = 5
	fieldMapKey   protowire.Number = 1
	fieldMapValue protowire.Number = 2
)

// encodeFrame encodes items, aged at now, as one frame: each item becomes
// the bytes of a pb.Evidence message (what proto.Marshal would write, in
// field order) in one buffer allocated for the frame. The frame is sent
// as a pb.EncodedEvidenceFrame, which the host reads as a
// pb.EvidenceFrame (the same wire format).
func encodeFrame(ready bool, items []Evidence, now time.Time) *pb.EncodedEvidenceFrame {
	ages := make([]int64, len(items))
	size := 0
	for i := range items {
		ages[i] = max(0, now.Sub(items[i].At).Microseconds())
		size += evidenceSize(&items[i], ages[i])
	}
	buf := make([]byte, 0, size)
	out := make([][]byte, len(items))
	for i := range items {
		start := len(buf)
		buf = appendEvidence(buf, &items[i], ages[i])
		out[i] = buf[start:len(buf):len(buf)]
	}
	return &pb.EncodedEvidenceFrame{Ready: ready, Evidence: out}
}

// kindValue is the varint of a Kind as proto encodes an enum (int32).
func kindValue(k Kind) uint64 { return uint64(int64(pb.Kind(k))) }

// evidenceSize is the length of appendEvidence's output for ev.
func evidenceSize(ev *Evidence, age int64) int {
	n := 0
	if pb.Kind(ev.Kind) != 0 {
		n += 1 + protowire.SizeVarint(kindValue(ev.Kind))
	}
	if ev.Device != "" {
		n += 1 + protowire.SizeBytes(len(ev.Device))
	}
	if ev.Instance != "" {
		n += 1 + protowire.SizeBytes(len(ev.Instance))
	}
	if age != 0 {
		n += 1 + protowire.SizeVarint(uint64(age))
	}
	if len(ev.Metadata) == 0 {
		return n
	}
	for k, v := range ev.Metadata {
		n += 1 + protowire.SizeBytes(entrySize(k, v))
	}
	return n
}

func entrySize(k, v string) int {
	return 2 + protowire.SizeBytes(len(k)) + protowire.SizeBytes(len(v))
}

// appendEvidence appends the pb.Evidence encoding of ev aged age (µs).
func appendEvidence(b []byte, ev *Evidence, age int64) []byte {
	if pb.Kind(ev.Kind) != 0 {
		b = protowire.AppendTag(b, fieldKind, protowire.VarintType)
		b = protowire.AppendVarint(b, kindValue(ev.Kind))
	}
	if ev.Device != "" {
		b = protowire.AppendTag(b, fieldDevice, protowire.BytesType)
		b = protowire.AppendString(b, ev.Device)
	}
	if ev.Instance != "" {
		b = protowire.AppendTag(b, fieldInstance, protowire.BytesType)
		b = protowire.AppendString(b, ev.Instance)
	}
	if age != 0 {
		b = protowire.AppendTag(b, fieldAge, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(age))
	}
	if len(ev.Metadata) == 0 {
		return b
	}
	for k, v := range ev.Metadata {
		b = protowire.AppendTag(b, fieldMetadata, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(entrySize(k, v)))
		b = protowire.AppendTag(b, fieldMapKey, protowire.BytesType)
		b = protowire.AppendString(b, k)
		b = protowire.AppendTag(b, fieldMapValue, protowire.BytesType)
		b = protowire.AppendString(b, v)
	}
	return b
}
