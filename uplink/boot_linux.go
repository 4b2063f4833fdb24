package uplink

import (
	"time"

	"golang.org/x/sys/unix"
)

// bootTime reads CLOCK_BOOTTIME: the time since boot, suspend included;
// it never steps.
func bootTime() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}
