package gateway

import (
	"testing"
	"time"
	"unsafe"
)

func TestThrottle(t *testing.T) {
	const renewEvery = 10 * time.Second
	sent := &entry{sentOK: true, sentDL: int64(100 * time.Second)}
	for _, tc := range []struct {
		name     string
		e        *entry
		k        Kind
		dl       time.Duration
		want     Kind
		wantSend bool
	}{
		{"first evidence", &entry{}, Renew, 30 * time.Second, Connect, true},
		{"connect", sent, Connect, 50 * time.Second, Connect, true},
		{"renew short of renew_every", sent, Renew, 100*time.Second + renewEvery - 1, 0, false},
		{"renew at renew_every", sent, Renew, 100*time.Second + renewEvery, Renew, true},
		{"renew with an older deadline", sent, Renew, 90 * time.Second, 0, false},
	} {
		k, send := throttle(tc.e, tc.k, int64(tc.dl), renewEvery)
		if k != tc.want || send != tc.wantSend {
			t.Errorf("%s: throttle = %v, %v; want %v, %v", tc.name, k, send, tc.want, tc.wantSend)
		}
	}
}

// A device's record in the table is its session count and its learned
// period, 8 bytes: the value of a map slot whose key is a 16-byte string
// header takes 8 either way, so learned leases cost no memory.
func TestDeviceRecordSize(t *testing.T) {
	if n := unsafe.Sizeof(device{}); n != 8 {
		t.Fatalf("device is %d bytes, want 8", n)
	}
}
