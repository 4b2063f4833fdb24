package sim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"reflect"
	"slices"
	"time"

	"github.com/fleetgate/fleetgate/sim/check"
)

// Truth is what one run played (a part of a fleet, or all of it): what
// CheckTruths needs to judge the union of the parts.
type Truth struct {
	Part    int            `json:"part"`
	Parts   int            `json:"parts"`
	Plan    PlanOptions    `json:"plan"`
	Start   time.Time      `json:"start"`
	End     time.Time      `json:"end"`
	Fleet   Snapshot       `json:"fleet"`
	Devices []check.Device `json:"devices"`
}

// ReadTruth reads a truth Run wrote to TruthOut.
func ReadTruth(r io.Reader) (Truth, error) {
	var t Truth
	err := json.NewDecoder(r).Decode(&t)
	return t, err
}

// MergeTruths is the union of the parts of one fleet: the same plan,
// every part exactly once, every device of the plan exactly once. It
// starts with the earliest start and ends with the latest end; the
// counters are summed.
func MergeTruths(parts []Truth) (Truth, error) {
	if len(parts) == 0 {
		return Truth{}, errors.New("no truth to check")
	}
	n := parts[0].Parts
	seen := make([]bool, n)
	for _, p := range parts {
		if !reflect.DeepEqual(p.Plan, parts[0].Plan) || p.Parts != n {
			return Truth{}, fmt.Errorf("part %d/%d is of another fleet (plan %+v, not %+v)", p.Part, p.Parts, p.Plan, parts[0].Plan)
		}
		if p.Part < 0 || p.Part >= n || seen[p.Part] {
			return Truth{}, fmt.Errorf("part %d/%d: given twice or out of range", p.Part, p.Parts)
		}
		seen[p.Part] = true
	}
	if i := slices.Index(seen, false); i >= 0 {
		return Truth{}, fmt.Errorf("part %d/%d is missing", i, n)
	}
	want := map[string]bool{}
	for _, d := range Plan(parts[0].Plan) {
		want[d.ID] = true
	}
	u := Truth{Part: 0, Parts: 1, Plan: parts[0].Plan, Start: parts[0].Start, End: parts[0].End, Fleet: Snapshot{OnTime: 1}}
	var onTime float64
	for _, p := range parts {
		if p.Start.Before(u.Start) {
			u.Start = p.Start
		}
		if p.End.After(u.End) {
			u.End = p.End
		}
		for _, d := range p.Devices {
			if !want[d.ID] {
				return Truth{}, fmt.Errorf("device %s is not in the plan, or played twice", d.ID)
			}
			delete(want, d.ID)
			u.Devices = append(u.Devices, d)
		}
		onTime += p.Fleet.OnTime * float64(p.Fleet.Heartbeats)
		u.Fleet = addSnapshots(u.Fleet, p.Fleet)
	}
	if len(want) > 0 {
		return Truth{}, fmt.Errorf("%d devices of the plan were played by no part", len(want))
	}
	if u.Fleet.Heartbeats > 0 {
		u.Fleet.OnTime = onTime / float64(u.Fleet.Heartbeats)
	}
	return u, nil
}

func addSnapshots(a, b Snapshot) Snapshot {
	sum := func(x, y map[string]int64) map[string]int64 {
		out := maps.Clone(x)
		if out == nil {
			out = map[string]int64{}
		}
		for k, v := range y {
			out[k] += v
		}
		return out
	}
	return Snapshot{Sent: a.Sent + b.Sent, Answered: a.Answered + b.Answered, Unanswered: a.Unanswered + b.Unanswered,
		SendErrors: a.SendErrors + b.SendErrors, Connects: a.Connects + b.Connects, ConnectErrors: a.ConnectErrors + b.ConnectErrors,
		ConnectErrorKinds: sum(a.ConnectErrorKinds, b.ConnectErrorKinds), Connected: a.Connected + b.Connected,
		Reconnects: a.Reconnects + b.Reconnects, CoAPCodes: sum(a.CoAPCodes, b.CoAPCodes), Retransmits: a.Retransmits + b.Retransmits,
		Misrouted: a.Misrouted + b.Misrouted, DTLSHandshakes: a.DTLSHandshakes + b.DTLSHandshakes, DTLSFailures: a.DTLSFailures + b.DTLSFailures,
		DTLSResumes: a.DTLSResumes + b.DTLSResumes, DTLSResumeFailed: a.DTLSResumeFailed + b.DTLSResumeFailed, Heartbeats: a.Heartbeats + b.Heartbeats, MaxLateMS: max(a.MaxLateMS, b.MaxLateMS)}
}

// CheckTruths judges the union of the parts of a fleet (MergeTruths)
// against the events, as Run judges its own: o gives the source, the
// bounds and the wait; the plan comes from the parts.
func CheckTruths(ctx context.Context, o Options, parts []Truth) (Report, error) {
	u, err := MergeTruths(parts)
	if err != nil {
		return Report{}, err
	}
	if o.Source == nil {
		return Report{}, errors.New("no event source")
	}
	p := u.Plan
	o.Devices, o.MQTTShare, o.Duration, o.Heartbeat, o.Scenarios, o.Seed, o.Prefix = p.Devices, p.MQTTShare, p.Duration, p.Heartbeat, p.Scenarios, p.Seed, p.Prefix
	o.Periods, o.ChurnAfter, o.ChurnShare = p.Periods, p.ChurnAfter, p.ChurnShare
	return o.judge(ctx, Plan(p), u)
}
