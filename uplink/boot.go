package uplink

import (
	"fmt"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// SystemBoot is the machine's CLOCK_BOOTTIME with its boot ID.
type SystemBoot struct{ id gateway.BootID }

var _ gateway.BootClock = (*SystemBoot)(nil)

// NewSystemBoot reads the boot ID, or takes override when it is not
// empty (FLEETGATE_TEST_BOOT_ID: a test simulates a reboot with it).
func NewSystemBoot(override string) (*SystemBoot, error) {
	s := override
	if s == "" {
		var err error
		if s, err = systemBootID(); err != nil {
			return nil, fmt.Errorf("uplink: boot ID: %w", err)
		}
	}
	id, err := gateway.ParseBootID(s)
	if err != nil {
		return nil, fmt.Errorf("uplink: %w", err)
	}
	return &SystemBoot{id: id}, nil
}

// Boot returns the boot ID and CLOCK_BOOTTIME.
func (b *SystemBoot) Boot() (gateway.BootID, time.Duration, error) {
	d, err := bootTime()
	if err != nil {
		return b.id, 0, fmt.Errorf("uplink: read CLOCK_BOOTTIME: %w", err)
	}
	return b.id, d, nil
}
