// Package sim plays a fleet of CoAP and MQTT devices against fleetgate
// gateways, records what every device did (the truth), reads the
// presence events the gateways wrote, and compares the two with
// sim/check. `fleetgate simulate` is its command line.
package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
)

// Proto is how a device talks to its gateway.
type Proto uint8

const (
	CoAPNon Proto = iota // CoAP NON requests
	CoAPCon              // CoAP CON requests
	MQTT5                // MQTT 5 (eclipse/paho.golang)
	MQTT311              // MQTT 3.1.1 (eclipse/paho.mqtt.golang)
)

func (p Proto) String() string {
	return [...]string{"coap-non", "coap-con", "mqtt5", "mqtt311"}[p]
}

func (p Proto) mqtt() bool { return p == MQTT5 || p == MQTT311 }

// Churn is what happens to a device during the run, besides its
// heartbeats.
type Churn uint8

const (
	// Steady devices send heartbeats until the run ends.
	Steady Churn = iota
	// Freeze: the device stops without a word (an MQTT connection is
	// dropped without DISCONNECT).
	Freeze
	// Leave: a clean leave (CoAP DELETE, MQTT DISCONNECT), then silence.
	Leave
	// Roam: the device moves to another gateway and its old attachment
	// lapses (CoAP: the same session from elsewhere; MQTT: connect to B,
	// then drop A's connection without a word).
	Roam
	// Move: make before break with a clean goodbye: connect to B, and
	// once B has answered, a clean leave on A (CoAP: one instance per
	// gateway, DELETE on A; MQTT: DISCONNECT on A).
	Move
	// Dual: two sessions from the start (CoAP: two instances; MQTT: two
	// connections to two gateways); one is dropped mid-run.
	Dual
	// Storm: dropped with a share of the fleet at one moment and back
	// within a second (MQTT: connections dropped and reconnected; CoAP:
	// a pause and a new source port).
	Storm
	// Visit: the device wakes once, sends, and leaves at once (an MQTT
	// connect, publish, DISCONNECT; a CoAP POST then DELETE).
	Visit
)

var churnNames = [...]string{"steady", "freeze", "leave", "roam", "move", "dual", "storm", "visit"}

func (c Churn) String() string { return churnNames[c] }

// churnShare is the share of the fleet each churn takes when enabled.
var churnShare = map[Churn]float64{Freeze: 0.05, Leave: 0.05, Roam: 0.05, Move: 0.05, Dual: 0.05, Storm: 0.20, Visit: 0.02}

// AllScenarios is every churn, in plan order.
var AllScenarios = []Churn{Freeze, Leave, Roam, Move, Dual, Storm, Visit}

// ParseScenarios parses a comma-separated list of churn names; "all" is
// every one, "none" or "steady" none.
func ParseScenarios(s string) ([]Churn, error) {
	var out []Churn
	for _, name := range strings.Split(s, ",") {
		name = strings.TrimSpace(name)
		switch name {
		case "", "none", "steady":
			continue
		case "all":
			out = append(out, AllScenarios...)
			continue
		}
		i := slices.Index(churnNames[:], name)
		if i <= 0 {
			return nil, fmt.Errorf("scenario %q: want one of %s, all or none", name, strings.Join(churnNames[1:], ", "))
		}
		out = append(out, Churn(i))
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// PlanOptions shape a fleet.
type PlanOptions struct {
	Devices   int
	MQTTShare float64
	Duration  time.Duration
	Heartbeat time.Duration
	// CoAPGateways and MQTTGateways count the gateways of each protocol.
	CoAPGateways, MQTTGateways int
	Scenarios                  []Churn
	Seed                       uint64
	Prefix                     string
	// DTLSShare is the share of the CoAP devices that speak CoAP over
	// DTLS with a PSK (one NON and one CON device of each pair).
	DTLSShare float64 `json:",omitempty"`
	// Periods, when set, are the CoAP devices' heartbeat intervals, a
	// mix: the k-th CoAP device sends every Periods[k mod len] (±10 %);
	// the MQTT devices keep Heartbeat. None: every device sends every
	// Heartbeat.
	Periods []time.Duration `json:",omitempty"`
	// ChurnAfter delays the churn: it happens within the same shares of
	// the rest of the run after ChurnAfter (a fleet whose leases are
	// learned churns once they are).
	ChurnAfter time.Duration `json:",omitempty"`
	// ChurnShare, when not 0, is the share of each protocol's devices
	// each enabled churn takes, instead of its own (churnShare): enough
	// frozen devices to measure a detection per period.
	ChurnShare float64 `json:",omitempty"`
}

// DevicePlan is one device's part of the run, drawn from the seed.
type DevicePlan struct {
	ID    string
	Proto Proto
	Churn Churn
	// Gateway is the index of the device's first gateway among those of
	// its protocol; To the one it moves to (Roam, Move) or holds its
	// second session on (MQTT Dual).
	Gateway, To int
	// Phase is when its first heartbeat goes, after the start.
	Phase time.Duration
	// At is when its churn happens, after the start.
	At time.Duration
	// Pause is how long a Storm keeps it silent.
	Pause time.Duration
	// Seed drives its heartbeat jitter.
	Seed uint64
	// Period is its heartbeat interval (±10 % jitter): Heartbeat, or
	// its share of Periods.
	Period time.Duration
	// DTLS: a CoAP device that speaks over DTLS, identified by its PSK
	// identity, its ID (dtlsKey).
	DTLS bool
}

// firstAt is when the device acts first in a run started at start.
func (p DevicePlan) firstAt(start time.Time) time.Time {
	if p.Churn == Visit {
		return start.Add(p.At)
	}
	return start.Add(p.Phase)
}

// StormAt is when the reconnect storm strikes, as a share of the run.
const StormAt = 0.5

// Plan draws the fleet: who speaks what, to which gateway, and what
// happens to whom and when. The same options give the same plan.
func Plan(o PlanOptions) []DevicePlan {
	rng := rand.New(rand.NewPCG(o.Seed, 0x5eed))
	nMQTT := int(float64(o.Devices)*o.MQTTShare + 0.5)
	if o.MQTTGateways == 0 {
		nMQTT = 0
	}
	if o.CoAPGateways == 0 {
		nMQTT = o.Devices
	}
	plans := make([]DevicePlan, o.Devices)
	for i := range plans {
		p := &plans[i]
		p.ID = fmt.Sprintf("%s%d", o.Prefix, i)
		gws := o.CoAPGateways
		switch {
		case i < nMQTT && i%2 == 0:
			p.Proto, gws = MQTT5, o.MQTTGateways
		case i < nMQTT:
			p.Proto, gws = MQTT311, o.MQTTGateways
		case i%2 == 0:
			p.Proto = CoAPNon
		default:
			p.Proto = CoAPCon
		}
		p.Gateway = i % gws
		p.To = (p.Gateway + 1) % gws
		if k := (i - nMQTT) / 2; !p.Proto.mqtt() && o.DTLSShare > 0 {
			// the pairs spread evenly: pair k if the share's count
			// rises at it
			p.DTLS = int(float64(k+1)*o.DTLSShare) > int(float64(k)*o.DTLSShare)
		}
		p.Phase = time.Duration(rng.Int64N(int64(o.Heartbeat)))
		p.Seed = rng.Uint64()
		p.Period = o.Heartbeat
		if k := i - nMQTT; !p.Proto.mqtt() && len(o.Periods) > 0 {
			p.Period = o.Periods[k%len(o.Periods)]
			// its phase within its own period, the draws unchanged
			p.Phase = time.Duration(float64(p.Phase) / float64(o.Heartbeat) * float64(p.Period))
		}
	}
	// Churns per protocol family, so that each gets its share of each.
	for _, fam := range [][]int{indices(0, nMQTT), indices(nMQTT, o.Devices)} {
		rng.Shuffle(len(fam), func(i, j int) { fam[i], fam[j] = fam[j], fam[i] })
		for _, c := range o.Scenarios {
			share := churnShare[c]
			if o.ChurnShare > 0 {
				share = o.ChurnShare
			}
			n := int(share*float64(len(fam)) + 0.999)
			for k := 0; k < n && len(fam) > 0; {
				p := &plans[fam[0]]
				fam = fam[1:]
				if !applies(c, p.Proto, o) {
					continue // left steady
				}
				p.Churn = c
				k++
			}
		}
	}
	// the churn's window: the run, or what is left of it after ChurnAfter
	from, d := min(o.ChurnAfter, o.Duration), o.Duration-min(o.ChurnAfter, o.Duration)
	for i := range plans {
		p := &plans[i]
		switch p.Churn {
		case Storm:
			p.At = from + time.Duration(float64(d)*StormAt)
			p.Pause = time.Duration(rng.Int64N(int64(min(time.Second, o.Heartbeat)) + 1))
		case Visit:
			p.At = from + uniform(rng, d/10, d*6/10)
		case Steady:
		default:
			// after its first heartbeat has been taken: a device that
			// leaves before it ever sent anything would be a visit
			p.At = max(from+uniform(rng, d*15/100, d*45/100), p.Phase+p.Period/2)
		}
	}
	return plans
}

// MaxPeriod is the longest heartbeat interval of o's devices.
func (o PlanOptions) MaxPeriod() time.Duration {
	longest := o.Heartbeat
	for _, p := range o.Periods {
		longest = max(longest, p)
	}
	return longest
}

// ParsePeriods parses a comma-separated list of heartbeat intervals
// (PlanOptions.Periods), each a duration above zero.
func ParsePeriods(s string) ([]time.Duration, error) {
	var out []time.Duration
	for _, f := range strings.Split(s, ",") {
		if f = strings.TrimSpace(f); f == "" {
			continue
		}
		d, err := time.ParseDuration(f)
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("period %q: want a duration above zero (100ms, 1m)", f)
		}
		out = append(out, d)
	}
	return out, nil
}

func applies(c Churn, p Proto, o PlanOptions) bool {
	gws := o.CoAPGateways
	if p.mqtt() {
		gws = o.MQTTGateways
	}
	switch c {
	case Roam, Move:
		return gws >= 2
	case Dual:
		return !p.mqtt() || gws >= 2
	}
	return true
}

func indices(from, to int) []int {
	out := make([]int, 0, to-from)
	for i := from; i < to; i++ {
		out = append(out, i)
	}
	return out
}

func uniform(rng *rand.Rand, lo, hi time.Duration) time.Duration {
	if hi <= lo {
		return lo
	}
	return lo + time.Duration(rng.Int64N(int64(hi-lo)))
}

// jitter is a heartbeat interval with ±10 % jitter.
func jitter(rng *rand.Rand, h time.Duration) time.Duration {
	return h - h/10 + time.Duration(rng.Int64N(int64(h/5)+1))
}
