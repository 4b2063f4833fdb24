package adapter

import (
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ratelimit"
)

// rate is a token bucket of perSecond tokens a second with a burst of as
// many; perSecond 0 means unlimited. Not safe for concurrent use (one
// stream feeds it).
type rate struct {
	perSecond float64
	bucket    ratelimit.Bucket
}

func newRate(perSecond int) *rate {
	return &rate{perSecond: float64(perSecond), bucket: ratelimit.Full(float64(perSecond))}
}

// allow takes one token at now.
func (r *rate) allow(now time.Time) bool {
	if r.perSecond <= 0 {
		return true
	}
	ok, _ := r.bucket.Take(r.perSecond, now)
	return ok
}

// sessionKey names one session of one device.
type sessionKey struct {
	device  gateway.DeviceID
	session gateway.SessionID
}

// sessions counts an adapter's live sessions for its max_sessions limit:
// a session lives from its last evidence for a lease, or until its leave.
// max 0 means unlimited (nothing is tracked). Not safe for concurrent use.
type sessions struct {
	max       int
	lease     time.Duration
	last      map[sessionKey]time.Time
	lastSweep time.Time
}

func newSessions(max int, lease time.Duration) *sessions {
	return &sessions{max: max, lease: lease, last: make(map[sessionKey]time.Time)}
}

// admit records evidence of kind for k at now and reports whether it is
// within the limit: evidence of a known session always is; a new session
// is refused while max sessions are live.
func (s *sessions) admit(k sessionKey, kind gateway.Kind, now time.Time) bool {
	if s.max <= 0 {
		return true
	}
	if _, ok := s.last[k]; ok {
		if kind == gateway.Leave {
			delete(s.last, k)
		} else {
			s.last[k] = now
		}
		return true
	}
	if kind == gateway.Leave {
		return true
	}
	if len(s.last) >= s.max && now.Sub(s.lastSweep) >= time.Second {
		s.sweep(now)
	}
	if len(s.last) >= s.max {
		return false
	}
	s.last[k] = now
	return true
}

func (s *sessions) sweep(now time.Time) {
	s.lastSweep = now
	for k, t := range s.last {
		if now.Sub(t) >= s.lease {
			delete(s.last, k)
		}
	}
}

func (s *sessions) len() int { return len(s.last) }
