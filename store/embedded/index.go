package embedded

import (
	"encoding/binary"
	"fmt"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// The indexes of List and Gateways (from state file format 6), kept by
// commit in the transaction that changes the records:
//
//	chg/  byte state (0 offline, 1 online) ‖ u64 since ‖ device ID →
//	      empty: every record by its state and last change (List by
//	      OrderChanged walks it backwards); moved by a transition only
//	"sessions.<gateway>"  u64: the live sessions of the shard whose
//	      gateway is that one (GatewayInfo.Sessions; absent: 0)
//
// The ID order needs no index: dev/ is keyed by device ID.
var bucketChg = []byte("chg")

const keySessions = "sessions."

// chgKey is the change index key of a record of device d.
func chgKey(online bool, since int64, d gateway.DeviceID) []byte {
	k := make([]byte, 9, 9+len(d))
	if online {
		k[0] = 1
	}
	binary.BigEndian.PutUint64(k[1:], uint64(since))
	return append(k, d...)
}

// parseChgKey reads a change index key.
func parseChgKey(k []byte) (online bool, since int64, d gateway.DeviceID, ok bool) {
	if len(k) <= 9 || k[0] > 1 {
		return false, 0, "", false
	}
	return k[0] == 1, int64(binary.BigEndian.Uint64(k[1:9])), gateway.DeviceID(k[9:]), true
}

// sessionGateways is the gateway of each session of r, in order.
func sessionGateways(r *record) []string {
	if len(r.sessions) == 0 {
		return nil
	}
	gws := make([]string, len(r.sessions))
	for i, x := range r.sessions {
		gws[i] = x.gw
	}
	return gws
}

// moveSessions adds to delta what the sessions of a record changing
// from the gateways was to those of is do to each gateway's count.
func moveSessions(delta map[string]int64, was, is []string) {
	for _, g := range was {
		delta[g]--
	}
	for _, g := range is {
		delta[g]++
	}
}

// addSessions moves the session counts of the shard bucket root by
// delta.
func addSessions(root *bolt.Bucket, delta map[string]int64) error {
	for g, n := range delta {
		if n == 0 {
			continue
		}
		k := []byte(keySessions + g)
		var have uint64
		if b := root.Get(k); b != nil {
			v, err := decodeU64(b)
			if err != nil {
				return fmt.Errorf("sessions of %s: %w", g, err)
			}
			have = v
		}
		v := int64(have) + n
		var err error
		if v <= 0 {
			err = root.Delete(k)
		} else {
			err = root.Put(k, u64(uint64(v)))
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// sessionsOf is the session count of gateway gw in the shard bucket
// root.
func sessionsOf(root *bolt.Bucket, gw string) (int64, error) {
	b := root.Get([]byte(keySessions + gw))
	if b == nil {
		return 0, nil
	}
	v, err := decodeU64(b)
	return int64(v), err
}

// indexShard builds the indexes of the shard bucket root, which has no
// chg/ yet, in one pass over its records.
func indexShard(root *bolt.Bucket) error {
	chg, err := root.CreateBucket(bucketChg)
	if err != nil {
		return err
	}
	delta := map[string]int64{}
	if dev := root.Bucket(bucketDev); dev != nil {
		err := dev.ForEach(func(k, v []byte) error {
			r, err := decodeRecord(v)
			if err != nil {
				return fmt.Errorf("device %s: %w", k, err)
			}
			moveSessions(delta, nil, sessionGateways(&r))
			return chg.Put(chgKey(r.online, r.since, gateway.DeviceID(k)), nil)
		})
		if err != nil {
			return err
		}
	}
	return addSessions(root, delta)
}

// indexShards builds the indexes of every shard bucket of tx that has
// none.
func indexShards(tx *bolt.Tx) error {
	for n := 0; ; n++ {
		root := tx.Bucket(shardBucket(n))
		if root == nil {
			return nil
		}
		if root.Bucket(bucketChg) != nil {
			continue
		}
		if err := indexShard(root); err != nil {
			return fmt.Errorf("shard %d: %w", n, err)
		}
	}
}
