package sdk

import (
	"math"
	"slices"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/reflect/protoreflect"

	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// Field numbers of pb.Evidence, of its metadata entries, of pb.Data, of
// pb.Property and of pb.EvidenceFrame.
const (
	fieldKind     protowire.Number = 1
	fieldDevice   protowire.Number = 2
	fieldInstance protowire.Number = 3
	fieldAge      protowire.Number = 4
	fieldMetadata protowire.Number = 5
	fieldData     protowire.Number = 6
	fieldLease    protowire.Number = 7
	fieldMapKey   protowire.Number = 1
	fieldMapValue protowire.Number = 2

	fieldDataID          protowire.Number = 1
	fieldDataTopic       protowire.Number = 2
	fieldDataPayload     protowire.Number = 3
	fieldDataContentType protowire.Number = 4
	fieldDataQoS         protowire.Number = 5
	fieldDataProperties  protowire.Number = 6
	fieldPropertyKey     protowire.Number = 1
	fieldPropertyValue   protowire.Number = 2

	// fieldFrameEvidence is pb.EvidenceFrame's repeated evidence, and
	// fieldFrameSent its sent_unix_us.
	fieldFrameEvidence protowire.Number = 2
	fieldFrameSent     protowire.Number = 3
)

// encodeFrame encodes items, aged at now, as one pb.EvidenceFrame: each
// item becomes a record of the frame's field 2 (evidence) holding the
// bytes of a pb.Evidence message (with its pb.Data when it carries data),
// what proto.Marshal would write (in field order; map entries in map
// order), then its field 3 (sent_unix_us: now). The records go into one buffer
// allocated for the frame and attached to it as its raw fields, which
// proto writes out verbatim; the host decodes them as the frame's
// evidence. So no message is built per item. scratch is the caller's,
// kept between frames.
func encodeFrame(ready bool, items []item, now time.Time, scratch []int64) (*pb.EvidenceFrame, []int64) {
	scratch = slices.Grow(scratch[:0], 2*len(items)) // age, size of each item
	total := 0
	for i := range items {
		age := max(0, now.Sub(items[i].At).Microseconds())
		n := evidenceSize(&items[i], age)
		scratch = append(scratch, age, int64(n))
		total += 1 + protowire.SizeBytes(n)
	}
	sent := uint64(max(0, now.UnixMicro()))
	total += 1 + protowire.SizeVarint(sent)
	buf := make([]byte, 0, total)
	for i := range items {
		buf = appendTag(buf, fieldFrameEvidence, protowire.BytesType)
		buf = appendVarint(buf, uint64(scratch[2*i+1]))
		buf = appendEvidence(buf, &items[i], scratch[2*i])
	}
	buf = appendTag(buf, fieldFrameSent, protowire.VarintType)
	buf = appendVarint(buf, sent)
	f := &pb.EvidenceFrame{Ready: ready}
	f.ProtoReflect().SetUnknown(protoreflect.RawFields(buf))
	return f, scratch
}

// kindValue is the varint of a Kind as proto encodes an enum (int32).
func kindValue(k Kind) uint64 { return uint64(int64(pb.Kind(k))) }

// evidenceSize is the length of appendEvidence's output for ev.
func evidenceSize(ev *item, age int64) int {
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
	for k, v := range ev.Metadata {
		n += 1 + protowire.SizeBytes(entrySize(k, v))
	}
	if ev.data != nil {
		n += 1 + protowire.SizeBytes(dataSize(ev.data))
	}
	if ms := leaseMillis(ev.Lease); ms != 0 {
		n += 1 + protowire.SizeVarint(ms)
	}
	return n
}

// leaseMillis is lease as pb.Evidence's lease_ms: whole milliseconds
// rounded up, at most the largest uint32 (49 days, far beyond any
// max_lease); 0 for none.
func leaseMillis(lease time.Duration) uint64 {
	if lease <= 0 {
		return 0
	}
	return min(uint64((lease+time.Millisecond-1)/time.Millisecond), math.MaxUint32)
}

// dataSize is the length of appendData's output for d.
func dataSize(d *dataItem) int {
	n := 0
	if d.id != 0 {
		n += 1 + protowire.SizeVarint(d.id)
	}
	if d.d.Topic != "" {
		n += 1 + protowire.SizeBytes(len(d.d.Topic))
	}
	if len(d.d.Payload) > 0 {
		n += 1 + protowire.SizeBytes(len(d.d.Payload))
	}
	if d.d.ContentType != "" {
		n += 1 + protowire.SizeBytes(len(d.d.ContentType))
	}
	if d.d.QoS != 0 {
		n += 1 + protowire.SizeVarint(uint64(d.d.QoS))
	}
	for _, p := range d.d.Properties {
		n += 1 + protowire.SizeBytes(propertySize(p))
	}
	return n
}

// propertySize is the length of a pb.Property's encoding.
func propertySize(p Property) int {
	n := 0
	if p.Key != "" {
		n += 1 + protowire.SizeBytes(len(p.Key))
	}
	if p.Value != "" {
		n += 1 + protowire.SizeBytes(len(p.Value))
	}
	return n
}

func entrySize(k, v string) int {
	return 2 + protowire.SizeBytes(len(k)) + protowire.SizeBytes(len(v))
}

// appendVarint is protowire.AppendVarint with the one-byte case inline
// (tags, kinds and string lengths below 128).
func appendVarint(b []byte, v uint64) []byte {
	if v < 0x80 {
		return append(b, byte(v))
	}
	return protowire.AppendVarint(b, v)
}

func appendTag(b []byte, num protowire.Number, typ protowire.Type) []byte {
	return appendVarint(b, uint64(protowire.EncodeTag(num, typ)))
}

func appendString(b []byte, num protowire.Number, s string) []byte {
	b = appendTag(b, num, protowire.BytesType)
	b = appendVarint(b, uint64(len(s)))
	return append(b, s...)
}

// appendEvidence appends the pb.Evidence encoding of ev aged age (µs).
func appendEvidence(b []byte, ev *item, age int64) []byte {
	if pb.Kind(ev.Kind) != 0 {
		b = appendTag(b, fieldKind, protowire.VarintType)
		b = appendVarint(b, kindValue(ev.Kind))
	}
	if ev.Device != "" {
		b = appendString(b, fieldDevice, ev.Device)
	}
	if ev.Instance != "" {
		b = appendString(b, fieldInstance, ev.Instance)
	}
	if age != 0 {
		b = appendTag(b, fieldAge, protowire.VarintType)
		b = appendVarint(b, uint64(age))
	}
	for k, v := range ev.Metadata {
		b = appendTag(b, fieldMetadata, protowire.BytesType)
		b = appendVarint(b, uint64(entrySize(k, v)))
		b = appendString(b, fieldMapKey, k)
		b = appendString(b, fieldMapValue, v)
	}
	if ev.data != nil {
		b = appendTag(b, fieldData, protowire.BytesType)
		b = appendVarint(b, uint64(dataSize(ev.data)))
		b = appendData(b, ev.data)
	}
	if ms := leaseMillis(ev.Lease); ms != 0 {
		b = appendTag(b, fieldLease, protowire.VarintType)
		b = appendVarint(b, ms)
	}
	return b
}

// appendData appends the pb.Data encoding of d.
func appendData(b []byte, d *dataItem) []byte {
	if d.id != 0 {
		b = appendTag(b, fieldDataID, protowire.VarintType)
		b = appendVarint(b, d.id)
	}
	if d.d.Topic != "" {
		b = appendString(b, fieldDataTopic, d.d.Topic)
	}
	if len(d.d.Payload) > 0 {
		b = appendTag(b, fieldDataPayload, protowire.BytesType)
		b = appendVarint(b, uint64(len(d.d.Payload)))
		b = append(b, d.d.Payload...)
	}
	if d.d.ContentType != "" {
		b = appendString(b, fieldDataContentType, d.d.ContentType)
	}
	if d.d.QoS != 0 {
		b = appendTag(b, fieldDataQoS, protowire.VarintType)
		b = appendVarint(b, uint64(d.d.QoS))
	}
	for _, p := range d.d.Properties {
		b = appendTag(b, fieldDataProperties, protowire.BytesType)
		b = appendVarint(b, uint64(propertySize(p)))
		if p.Key != "" {
			b = appendString(b, fieldPropertyKey, p.Key)
		}
		if p.Value != "" {
			b = appendString(b, fieldPropertyValue, p.Value)
		}
	}
	return b
}
