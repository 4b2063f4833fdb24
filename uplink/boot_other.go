//go:build !linux

package uplink

import (
	"crypto/rand"
	"encoding/hex"
	"time"
)

// Outside Linux there is no CLOCK_BOOTTIME nor boot ID to read: the boot
// clock is the monotonic time since the process started, in a "boot"
// named at random per process, so that every restart counts as a reboot
// (the outbox of an earlier process is dropped, never replayed as
// fresh).
var processStart = time.Now()

func systemBootID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", err
	}
	b[0] |= 1 // never all zero
	return hex.EncodeToString(b[:]), nil
}

func bootTime() (time.Duration, error) { return time.Since(processStart), nil }
