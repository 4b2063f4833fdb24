package uplink

import "time"

// Status is the uplink's state for /v1/status (marshalled as it is).
type Status struct {
	// Up is false while the store does not answer for some shard; Since
	// is when Up last changed, LastError the newest error of a shard
	// that is down.
	Up        bool      `json:"up"`
	Since     time.Time `json:"since"`
	LastError string    `json:"last_error,omitempty"`
	// ShardsDown lists the shards that are down (their writes go to the
	// outbox until a probe of them succeeds), by shard; none while Up.
	ShardsDown []ShardDown `json:"shards_down,omitempty"`
	// OutboxSessions is the outbox's entries; OutboxOldest the age of the
	// oldest evidence in it (0 when empty).
	OutboxSessions int           `json:"outbox_sessions"`
	OutboxOldest   time.Duration `json:"outbox_oldest_age_ns"`
	// Pending is the writes waiting in the batcher.
	Pending int     `json:"pending"`
	Dropped Dropped `json:"dropped"`
}

// ShardDown is a shard the store does not answer for: since when, and
// the newest error of a call or probe of it.
type ShardDown struct {
	Shard     int       `json:"shard"`
	Since     time.Time `json:"since"`
	LastError string    `json:"last_error"`
}

// Dropped counts writes given up, by reason.
type Dropped struct {
	// Overflow: oldest outbox entries dropped over outbox_max_sessions.
	Overflow uint64 `json:"overflow"`
	// Lapsed: outbox evidence whose lease ran out more than the gateway
	// grace before it could be replayed.
	Lapsed uint64 `json:"lapsed"`
	// UnknownAge: outbox evidence whose age could not be known (observed
	// before a reboot, or ahead of the boot clock); never replayed.
	UnknownAge uint64 `json:"unknown_age"`
	// Fenced: refused by the store because a newer epoch of this gateway
	// exists.
	Fenced uint64 `json:"fenced"`
	// Rejected: refused by the store as misrouted (a bug).
	Rejected uint64 `json:"rejected"`
}

// Status reports the uplink's state.
func (u *Uplink) Status() Status {
	u.hmu.Lock()
	s := Status{Up: u.ndown == 0, Since: u.since}
	if u.lastErr != nil {
		s.LastError = u.lastErr.Error()
	}
	for sh, h := range u.health {
		if h.down {
			s.ShardsDown = append(s.ShardsDown, ShardDown{Shard: sh, Since: h.since, LastError: h.lastErr.Error()})
		}
	}
	u.hmu.Unlock()
	s.OutboxSessions = u.ob.Len()
	s.OutboxOldest = u.outboxOldest()
	s.Pending = u.pending()
	s.Dropped = Dropped{
		Overflow:   u.overflow.Load(),
		Lapsed:     u.lapsed.Load(),
		UnknownAge: u.unknownAge.Load(),
		Fenced:     u.fenced.Load(),
		Rejected:   u.rejected.Load(),
	}
	return s
}

func (u *Uplink) outboxOldest() time.Duration {
	o := u.ob.Oldest()
	if o.IsZero() {
		return 0
	}
	return max(u.clock.Now().Sub(o), 0)
}
