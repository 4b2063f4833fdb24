package uplink

import (
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// systemBootID reads the name Linux gives the current boot.
func systemBootID() (string, error) {
	b, err := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return string(b), err
}

// bootTime reads CLOCK_BOOTTIME: the time since boot, suspend included;
// it never steps.
func bootTime() (time.Duration, error) {
	var ts unix.Timespec
	if err := unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts); err != nil {
		return 0, err
	}
	return time.Duration(ts.Nano()), nil
}
