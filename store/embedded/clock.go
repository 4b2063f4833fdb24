package embedded

import (
	"context"
	"fmt"
	"time"
)

// Now is the store clock at millisecond precision.
func (s *Store) Now(ctx context.Context) (time.Time, error) {
	if err := s.ready(ctx); err != nil {
		return time.Time{}, fmt.Errorf("embedded: now: %w", err)
	}
	return time.UnixMilli(s.nowMs()), nil
}

// nowMs is the store clock in ms since the Unix epoch.
func (s *Store) nowMs() int64 { return s.now().UnixMilli() }
