package diskq_test

import (
	"path/filepath"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/queue/diskq"
	"github.com/fleetgate/fleetgate/queue/queuetest"
)

// openFile makes a harness on a file of its own opened by diskq.Open
// (fsync on every commit) with commit interval every.
func openFile(every time.Duration) queuetest.Opener {
	return func(t *testing.T, o queuetest.Options) queuetest.Harness {
		path := filepath.Join(t.TempDir(), "bridge.db")
		return queuetest.Harness{Durable: true, Open: func() (gateway.Queue, error) {
			return diskq.Open(diskq.Options{Path: path, MaxBytes: o.MaxBytes, MaxAge: o.MaxAge, CommitInterval: every, Clock: o.Clock})
		}}
	}
}

// openShared makes a harness whose queue shares its bbolt file (opened
// without fsync: the property runs open hundreds of queues; the crash
// test checks durability) with another queue that holds a message of
// its own. A restart closes the file and opens it again, and the other
// queue's message must still be there, alone.
func openShared(t *testing.T, o queuetest.Options) queuetest.Harness {
	path := filepath.Join(t.TempDir(), "bridge.db")
	var db *bolt.DB
	var other *diskq.Queue
	closeDB := func() {
		if db == nil {
			return
		}
		checkNeighbour(t, other)
		if err := other.Close(); err != nil {
			t.Errorf("close the other queue: %v", err)
		}
		if err := db.Close(); err != nil {
			t.Errorf("close bbolt: %v", err)
		}
		db = nil
	}
	t.Cleanup(closeDB)
	return queuetest.Harness{Durable: true, Open: func() (gateway.Queue, error) {
		closeDB()
		var err error
		db, err = bolt.Open(path, 0o600, &bolt.Options{Timeout: time.Second, NoSync: true})
		if err != nil {
			return nil, err
		}
		other, err = diskq.OpenDB(db, diskq.Options{Bucket: "commands", MaxBytes: 1 << 20})
		if err != nil {
			return nil, err
		}
		if other.Stats().Messages == 0 {
			if _, err := other.Put(t.Context(), []gateway.Message{neighbour}); err != nil {
				return nil, err
			}
		}
		return diskq.OpenDB(db, diskq.Options{Bucket: "up", MaxBytes: o.MaxBytes, MaxAge: o.MaxAge, Clock: o.Clock})
	}}
}

// neighbour is the other queue's message in openShared.
var neighbour = gateway.Message{Device: "dev-9", Topic: "cmd/x", Payload: []byte("the other queue"), QoS: 1, Received: time.UnixMilli(1), Source: "upstream"}

func checkNeighbour(t *testing.T, q *diskq.Queue) {
	t.Helper()
	got, err := q.Read(done(), 0, 10)
	if err != nil || len(got) != 1 || got[0].ID != 1 || string(got[0].Payload) != string(neighbour.Payload) {
		t.Errorf("the other queue in the file holds %v, %v; want its one message", got, err)
	}
}

func TestConformance(t *testing.T) {
	t.Run("Open", func(t *testing.T) { queuetest.Run(t, openFile(0)) })
	t.Run("OpenCommitInterval", func(t *testing.T) { queuetest.Run(t, openFile(5*time.Millisecond)) })
	t.Run("OpenDBShared", func(t *testing.T) { queuetest.Run(t, openShared) })
}

func TestProperties(t *testing.T) { queuetest.RunProperties(t, openShared) }
