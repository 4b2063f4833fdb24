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

// sessions counts an adapter's live sessions and devices for its
// max_sessions and max_devices limits: a session lives from its last
// evidence for a lease, or until its leave; a device lives while one of
// its sessions does. A max of 0 is unlimited; with both 0 nothing is
// tracked. Not safe for concurrent use.
type sessions struct {
	maxSessions int
	maxDevices  int
	lease       time.Duration
	last        map[sessionKey]time.Time
	perDevice   map[gateway.DeviceID]int
	lastSweep   time.Time
}

func newSessions(maxSessions, maxDevices int, lease time.Duration) *sessions {
	return &sessions{maxSessions: maxSessions, maxDevices: maxDevices, lease: lease,
		last: make(map[sessionKey]time.Time), perDevice: make(map[gateway.DeviceID]int)}
}

// admit records evidence of kind for k at now and reports whether it is
// within the limits: evidence of a known session always is; a new session
// is refused while maxSessions sessions are live, or, of a device without
// a live session, while maxDevices devices are.
func (s *sessions) admit(k sessionKey, kind gateway.Kind, now time.Time) bool {
	if s.maxSessions <= 0 && s.maxDevices <= 0 {
		return true
	}
	if _, ok := s.last[k]; ok {
		if kind == gateway.Leave {
			s.remove(k)
		} else {
			s.last[k] = now
		}
		return true
	}
	if kind == gateway.Leave {
		return true
	}
	if s.full(k.device) && now.Sub(s.lastSweep) >= time.Second {
		s.sweep(now)
	}
	if s.full(k.device) {
		return false
	}
	s.last[k] = now
	s.perDevice[k.device]++
	return true
}

// full reports whether a new session of device would break a limit.
func (s *sessions) full(device gateway.DeviceID) bool {
	if s.maxSessions > 0 && len(s.last) >= s.maxSessions {
		return true
	}
	return s.maxDevices > 0 && s.perDevice[device] == 0 && len(s.perDevice) >= s.maxDevices
}

func (s *sessions) remove(k sessionKey) {
	delete(s.last, k)
	if n := s.perDevice[k.device] - 1; n > 0 {
		s.perDevice[k.device] = n
	} else {
		delete(s.perDevice, k.device)
	}
}

func (s *sessions) sweep(now time.Time) {
	s.lastSweep = now
	for k, t := range s.last {
		if now.Sub(t) >= s.lease {
			s.remove(k)
		}
	}
}

func (s *sessions) len() int { return len(s.last) }

func (s *sessions) devices() int { return len(s.perDevice) }
