package gateway

import (
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// Clock is the time source of everything that decides leases and timers.
// Production code uses SystemClock; tests use clocktest.Clock and advance
// it by hand, so no lease test sleeps.
type Clock interface {
	Now() time.Time
	// NewTimer returns a timer that fires once d has passed on this clock.
	NewTimer(d time.Duration) Timer
}

// Timer is the part of *time.Timer that Clock users need.
type Timer interface {
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether it did.
	Stop() bool
}

// SystemClock is the real clock.
type SystemClock struct{}

func (SystemClock) Now() time.Time { return time.Now() }

func (SystemClock) NewTimer(d time.Duration) Timer { return sysTimer{time.NewTimer(d)} }

type sysTimer struct{ t *time.Timer }

func (s sysTimer) C() <-chan time.Time { return s.t.C }
func (s sysTimer) Stop() bool          { return s.t.Stop() }

// BootID names one boot of the machine (/proc/sys/kernel/random/boot_id).
// The zero BootID names none.
type BootID [16]byte

// ParseBootID reads a boot ID in the form of /proc/sys/kernel/random/boot_id
// (a UUID: 32 hex digits, dashes allowed anywhere).
func ParseBootID(s string) (BootID, error) {
	var id BootID
	h := strings.ReplaceAll(strings.TrimSpace(s), "-", "")
	if len(h) != 2*len(id) {
		return id, fmt.Errorf("boot ID %q: want 32 hex digits", s)
	}
	if _, err := hex.Decode(id[:], []byte(h)); err != nil {
		return id, fmt.Errorf("boot ID %q: %w", s, err)
	}
	if id == (BootID{}) {
		return id, fmt.Errorf("boot ID %q: all zero", s)
	}
	return id, nil
}

// BootClock reads a clock that never steps and counts from the machine's
// boot (Linux CLOCK_BOOTTIME, which also counts suspend), with the boot
// it counts from. Two readings are comparable only within one boot: the
// uplink keeps its outbox's observation times on it, so that their ages
// survive wall-clock steps and a reboot is recognised. The test clock
// (clocktest) implements it.
type BootClock interface {
	Boot() (BootID, time.Duration, error)
}
