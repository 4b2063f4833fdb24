//go:build !linux

package uplink

import (
	"errors"
	"time"
)

// bootTime has no CLOCK_BOOTTIME to read outside Linux: the outbox
// cannot age its entries there.
func bootTime() (time.Duration, error) {
	return 0, errors.New("CLOCK_BOOTTIME is Linux only")
}
