package sim

import (
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/sim/check"
)

// partsOf are the truths of a fleet split in parts as Run splits it,
// each device with one session.
func partsOf(po PlanOptions, parts int) []Truth {
	plans := Plan(po)
	start := time.Unix(1000, 0)
	out := make([]Truth, parts)
	for p := range parts {
		out[p] = Truth{Part: p, Parts: parts, Plan: po, Start: start.Add(time.Duration(p) * time.Millisecond), End: start.Add(time.Minute),
			Fleet: Snapshot{Heartbeats: 10, OnTime: 1 - float64(p)/10, Sent: 5}}
		for i, d := range plans {
			if inPart(i, p, parts) {
				out[p].Devices = append(out[p].Devices, check.Device{ID: d.ID, Active: true})
			}
		}
	}
	return out
}

// However a fleet is split, the parts cover every device of the plan
// exactly once and merge into its truth; a missing, doubled or foreign
// part is refused.
func TestSplitCoversTheFleetOnce(t *testing.T) {
	po := PlanOptions{Devices: 1001, MQTTShare: 0.1, Duration: time.Minute, Heartbeat: 30 * time.Second, CoAPGateways: 1, MQTTGateways: 1,
		Scenarios: AllScenarios, Seed: 9, Prefix: "p-"}
	for _, n := range []int{1, 2, 3, 7, 1001, 1002} {
		parts := partsOf(po, n)
		u, err := MergeTruths(parts)
		if err != nil {
			t.Fatalf("%d parts: %v", n, err)
		}
		seen := map[string]int{}
		for _, d := range u.Devices {
			seen[d.ID]++
		}
		for _, d := range Plan(po) {
			if seen[d.ID] != 1 {
				t.Fatalf("%d parts: device %s played %d times", n, d.ID, seen[d.ID])
			}
		}
		if len(u.Devices) != po.Devices || !u.Start.Equal(parts[0].Start) || u.Fleet.Sent != int64(5*n) || u.Fleet.Heartbeats != int64(10*n) {
			t.Fatalf("%d parts: union of %d devices from %v, fleet %+v", n, len(u.Devices), u.Start, u.Fleet)
		}
	}
	parts := partsOf(po, 3)
	other := po
	other.Seed++
	foreign := partsOf(other, 3)
	for name, tc := range map[string]struct {
		parts []Truth
		err   string
	}{
		"missing": {parts[:2], "part 2/3 is missing"},
		"twice":   {[]Truth{parts[0], parts[1], parts[1]}, "given twice"},
		"foreign": {[]Truth{parts[0], parts[1], foreign[2]}, "another fleet"},
		"none":    {nil, "no truth"},
	} {
		if _, err := MergeTruths(tc.parts); err == nil || !strings.Contains(err.Error(), tc.err) {
			t.Errorf("%s: %v, want %q", name, err, tc.err)
		}
	}
}
