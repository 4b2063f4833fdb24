package uplink

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/statefile"
	bolt "go.etcd.io/bbolt"
)

// A record (format 2) is: version (1 byte), seq (8), kind (1, 0 for
// none), at (8), leave (1), leave time (8), boot ID (16), kind lease (8),
// leave lease (8); integers big endian, times in ns since boot (of a
// format-1 entry migrated, with a zero boot ID: unix ns on the wall
// clock), leases in ns (0: the batch's). The leave byte is 0 for none, 1
// for a leave sent before the kind, 2 for a leave sent after it (a
// visit, slot.kindFirst; the times may tie).
const (
	recordVersion = 2
	recordLen     = 59
)

const (
	leaveNone  = 0
	leaveFirst = 1
	leaveAfter = 2
)

func encodeRecord(s slot, boot gateway.BootID, seq uint64) []byte {
	b := make([]byte, recordLen)
	b[0] = recordVersion
	binary.BigEndian.PutUint64(b[1:], seq)
	b[9] = byte(s.kind)
	if s.kind != 0 {
		binary.BigEndian.PutUint64(b[10:], uint64(s.at.UnixNano()))
		binary.BigEndian.PutUint64(b[43:], uint64(s.kindLease))
	}
	if !s.leave.IsZero() {
		b[18] = leaveFirst
		if s.kind != 0 && s.kindFirst {
			b[18] = leaveAfter
		}
		binary.BigEndian.PutUint64(b[19:], uint64(s.leave.UnixNano()))
		binary.BigEndian.PutUint64(b[51:], uint64(s.leaveLease))
	}
	copy(b[27:43], boot[:])
	return b
}

var errBadRecord = errors.New("malformed outbox record")

func decodeRecord(sk, v []byte) (record, error) {
	var r record
	dev, sess, ok := bytes.Cut(sk, []byte{0})
	if !ok || len(v) != recordLen || v[0] != recordVersion || v[18] > leaveAfter {
		return r, fmt.Errorf("%w: key %q, %d bytes", errBadRecord, sk, len(v))
	}
	d, err := gateway.ParseDeviceID(string(dev))
	if err != nil {
		return r, fmt.Errorf("%w: %w", errBadRecord, err)
	}
	s, err := gateway.ParseSessionID(string(sess))
	if err != nil {
		return r, fmt.Errorf("%w: %w", errBadRecord, err)
	}
	r.key = key{d, s}
	r.seq = binary.BigEndian.Uint64(v[1:])
	copy(r.boot[:], v[27:43])
	lease := func(off int) (time.Duration, error) {
		l := time.Duration(binary.BigEndian.Uint64(v[off:]))
		if l < 0 {
			return 0, fmt.Errorf("%w: lease %v", errBadRecord, l)
		}
		return l, nil
	}
	switch k := gateway.Kind(v[9]); k {
	case 0:
	case gateway.Connect, gateway.Renew:
		r.kind = k
		r.at = time.Unix(0, int64(binary.BigEndian.Uint64(v[10:])))
		if r.kindLease, err = lease(43); err != nil {
			return r, err
		}
	default:
		return r, fmt.Errorf("%w: kind %d", errBadRecord, k)
	}
	if v[18] != leaveNone {
		r.leave = time.Unix(0, int64(binary.BigEndian.Uint64(v[19:])))
		r.kindFirst = v[18] == leaveAfter && r.kind != 0
		if r.leaveLease, err = lease(51); err != nil {
			return r, err
		}
	}
	if r.n() == 0 {
		return r, fmt.Errorf("%w: no writes", errBadRecord)
	}
	r.own = timeKey(r.first(), r.seq)
	return r, nil
}

// Migrations are the outbox's changes of the state file format, oldest
// first (internal/statefile): the binary opens the file with them.
var Migrations = []statefile.Migration{
	{To: 2, What: "outbox entries on the boot clock, with their leases", Run: migrateOutboxV2},
}

// migrateOutboxV2 rewrites the outbox entries of format 1 (wall-clock
// times in ms, no boot, no lease) in format 2 with a zero boot ID: their
// times stay on the wall clock (readable decides whether they can be
// aged) and their writes take the batch's lease. Their time index keys
// (first observation in ms) do not change. An entry that cannot be read
// is left as it is, to be removed as unreadable.
func migrateOutboxV2(tx *bolt.Tx) error {
	sb := tx.Bucket(bucketSessions)
	if sb == nil {
		return nil
	}
	type kv struct{ k, v []byte }
	var out []kv
	err := sb.ForEach(func(k, v []byte) error {
		if s, seq, ok := decodeV1(v); ok {
			out = append(out, kv{bytes.Clone(k), encodeRecord(s, gateway.BootID{}, seq)})
		}
		return nil
	})
	if err != nil {
		return err
	}
	for _, e := range out {
		if err := sb.Put(e.k, e.v); err != nil {
			return err
		}
	}
	return nil
}

// decodeV1 reads a record of format 1: version 1 (1 byte), seq (8), kind
// (1, 0 for none), at ms (8), leave (1: 0 none, 1 before the kind, 2 after
// it), leave ms (8), wall-clock unix ms; ok is false when it is not one.
func decodeV1(v []byte) (s slot, seq uint64, ok bool) {
	if len(v) != 27 || v[0] != 1 || v[18] > leaveAfter {
		return s, 0, false
	}
	switch kind := gateway.Kind(v[9]); kind {
	case 0:
	case gateway.Connect, gateway.Renew:
		s.kind = kind
		s.at = time.UnixMilli(int64(binary.BigEndian.Uint64(v[10:])))
	default:
		return s, 0, false
	}
	if v[18] != leaveNone {
		s.leave = time.UnixMilli(int64(binary.BigEndian.Uint64(v[19:])))
		s.kindFirst = v[18] == leaveAfter && s.kind != 0
	}
	return s, binary.BigEndian.Uint64(v[1:]), s.n() > 0
}
