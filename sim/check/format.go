package check

import (
	"fmt"
	"time"
)

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// ms formats a time as the store does, milliseconds since the epoch.
func ms(t time.Time) string { return fmt.Sprintf("%d", t.UnixMilli()) }

func describe(e Event, ok bool) string {
	if !ok {
		return "none"
	}
	return fmt.Sprintf("%s ver %d at %s reason %s", e.State, e.Ver, ms(e.At), e.Reason)
}
