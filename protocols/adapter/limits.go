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

// byteRate is a token bucket of bytes: perSecond bytes a second, with a
// burst of as many. An item larger than the burst passes when the bucket
// is full and leaves it in debt, so that no item is too large to pass
// ever, and the rate holds over time. perSecond 0 means unlimited. Not
// safe for concurrent use (one stream feeds it).
type byteRate struct {
	perSecond float64
	tokens    float64
	last      time.Time
}

func newByteRate(perSecond int) *byteRate {
	return &byteRate{perSecond: float64(perSecond), tokens: float64(perSecond)}
}

// allow takes n bytes at now.
func (r *byteRate) allow(n int, now time.Time) bool {
	if r.perSecond <= 0 {
		return true
	}
	if !r.last.IsZero() && now.After(r.last) {
		r.tokens = min(r.perSecond, r.tokens+now.Sub(r.last).Seconds()*r.perSecond)
	}
	if now.After(r.last) {
		r.last = now
	}
	if r.tokens < min(float64(n), r.perSecond) {
		return false
	}
	r.tokens -= float64(n)
	return true
}

// sessionKey names one session of one device.
type sessionKey struct {
	device  gateway.DeviceID
	session gateway.SessionID
}

// sessions counts an adapter's live sessions and devices for its
// max_sessions and max_devices limits: a session lives from its last
// evidence for that evidence's lease, or until its leave; a device lives
// while one of its sessions does. A max of 0 is unlimited; with both 0 and no track
// nothing is tracked. track, when set, is told each device that comes to
// life (true) or dies (false) — command delivery follows the live
// devices —, and sessions are then swept at most once a second as
// evidence arrives, limits or not. Not safe for concurrent use.
type sessions struct {
	maxSessions int
	maxDevices  int
	// until is each live session's end: its last evidence + lease.
	until     map[sessionKey]time.Time
	perDevice map[gateway.DeviceID]int
	lastSweep time.Time
	track     func(gateway.DeviceID, bool)
}

// sweepEvery is how often at most sessions are swept.
const sweepEvery = time.Second

func newSessions(maxSessions, maxDevices int, track func(gateway.DeviceID, bool)) *sessions {
	return &sessions{maxSessions: maxSessions, maxDevices: maxDevices, track: track,
		until: make(map[sessionKey]time.Time), perDevice: make(map[gateway.DeviceID]int)}
}

// admit records evidence of kind for k at now, holding the session for
// lease, and reports whether it is within the limits: evidence of a known
// session always is; a new session is refused while maxSessions sessions
// are live, or, of a device without a live session, while maxDevices
// devices are.
func (s *sessions) admit(k sessionKey, kind gateway.Kind, now time.Time, lease time.Duration) bool {
	if s.maxSessions <= 0 && s.maxDevices <= 0 && s.track == nil {
		return true
	}
	if s.track != nil && now.Sub(s.lastSweep) >= sweepEvery {
		s.sweep(now)
	}
	if until, ok := s.until[k]; ok {
		if kind == gateway.Leave {
			s.remove(k)
		} else if end := now.Add(lease); end.After(until) {
			s.until[k] = end
		}
		return true
	}
	if kind == gateway.Leave {
		return true
	}
	if s.full(k.device) && now.Sub(s.lastSweep) >= sweepEvery {
		s.sweep(now)
	}
	if s.full(k.device) {
		return false
	}
	s.until[k] = now.Add(lease)
	s.perDevice[k.device]++
	if s.perDevice[k.device] == 1 && s.track != nil {
		s.track(k.device, true)
	}
	return true
}

// full reports whether a new session of device would break a limit.
func (s *sessions) full(device gateway.DeviceID) bool {
	if s.maxSessions > 0 && len(s.until) >= s.maxSessions {
		return true
	}
	return s.maxDevices > 0 && s.perDevice[device] == 0 && len(s.perDevice) >= s.maxDevices
}

func (s *sessions) remove(k sessionKey) {
	delete(s.until, k)
	if n := s.perDevice[k.device] - 1; n > 0 {
		s.perDevice[k.device] = n
	} else {
		delete(s.perDevice, k.device)
		if s.track != nil {
			s.track(k.device, false)
		}
	}
}

func (s *sessions) sweep(now time.Time) {
	s.lastSweep = now
	for k, until := range s.until {
		if !now.Before(until) {
			s.remove(k)
		}
	}
}

func (s *sessions) len() int { return len(s.until) }

func (s *sessions) devices() int { return len(s.perDevice) }
