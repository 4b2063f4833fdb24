package sim

import (
	"reflect"
	"testing"
	"time"
)

func TestPlanIsDrawnFromTheSeed(t *testing.T) {
	o := PlanOptions{Devices: 1000, MQTTShare: 0.3, Duration: time.Minute, Heartbeat: 5 * time.Second,
		CoAPGateways: 2, MQTTGateways: 2, Scenarios: AllScenarios, Seed: 42, Prefix: "d-"}
	a, b := Plan(o), Plan(o)
	if !reflect.DeepEqual(a, b) {
		t.Fatal("the same options gave two plans")
	}
	o.Seed++
	if reflect.DeepEqual(a, Plan(o)) {
		t.Fatal("another seed gave the same plan")
	}
	count := map[Proto]map[Churn]int{}
	for _, p := range a {
		if count[p.Proto] == nil {
			count[p.Proto] = map[Churn]int{}
		}
		count[p.Proto][p.Churn]++
		switch {
		case p.Churn == Storm && p.At != 30*time.Second:
			t.Fatalf("%s storms at %v", p.ID, p.At)
		case p.Churn == Visit && (p.At < 6*time.Second || p.At > 36*time.Second):
			t.Fatalf("%s visits at %v", p.ID, p.At)
		case p.Churn != Steady && p.Churn != Storm && p.Churn != Visit && (p.At < p.Phase+o.Heartbeat/2 || p.At > 27*time.Second+o.Heartbeat):
			t.Fatalf("%s churns (%s) at %v, first heartbeat at %v", p.ID, p.Churn, p.At, p.Phase)
		case p.Gateway == p.To:
			t.Fatalf("%s moves to its own gateway", p.ID)
		}
	}
	mqtt := 0
	for _, pr := range []Proto{MQTT5, MQTT311} {
		for _, n := range count[pr] {
			mqtt += n
		}
	}
	if mqtt != 300 {
		t.Fatalf("%d MQTT devices, want 300", mqtt)
	}
	for _, c := range AllScenarios {
		if count[CoAPNon][c]+count[CoAPCon][c] == 0 || count[MQTT5][c]+count[MQTT311][c] == 0 {
			t.Fatalf("scenario %s missing from a protocol: %v", c, count)
		}
	}
}

func TestPlanLeavesOutWhatCannotHappen(t *testing.T) {
	// one gateway per protocol: nobody can move, MQTT devices cannot
	// hold two connections on two gateways
	for _, p := range Plan(PlanOptions{Devices: 400, MQTTShare: 0.5, Duration: time.Minute, Heartbeat: time.Second,
		CoAPGateways: 1, MQTTGateways: 1, Scenarios: AllScenarios, Seed: 1, Prefix: "d-"}) {
		if p.Churn == Roam || p.Churn == Move || p.Churn == Dual && p.Proto.mqtt() {
			t.Fatalf("%s (%s) got %s with one gateway", p.ID, p.Proto, p.Churn)
		}
	}
}

func TestParseScenarios(t *testing.T) {
	got, err := ParseScenarios("storm, freeze,storm")
	if err != nil || !reflect.DeepEqual(got, []Churn{Freeze, Storm}) {
		t.Fatalf("got %v, %v", got, err)
	}
	if got, _ := ParseScenarios("all"); !reflect.DeepEqual(got, AllScenarios) {
		t.Fatalf("all: %v", got)
	}
	if got, _ := ParseScenarios("none"); len(got) != 0 {
		t.Fatalf("none: %v", got)
	}
	if _, err := ParseScenarios("meteor"); err == nil {
		t.Fatal("an unknown scenario was accepted")
	}
}

// A mix of periods goes to the CoAP devices in turn, each with its phase
// within its own period; the MQTT devices keep the heartbeat; everything
// else is drawn as without the mix. ChurnAfter puts every churn after it.
func TestPlanPeriods(t *testing.T) {
	o := PlanOptions{Devices: 400, MQTTShare: 0.25, Duration: 10 * time.Minute, Heartbeat: time.Second,
		CoAPGateways: 2, MQTTGateways: 2, Scenarios: AllScenarios, Seed: 7, Prefix: "p-"}
	plain := Plan(o)
	o.Periods = []time.Duration{100 * time.Millisecond, time.Second, 10 * time.Second, time.Minute}
	o.ChurnAfter = 3 * time.Minute
	mixed := Plan(o)
	count := map[time.Duration]int{}
	k := 0
	for i, p := range mixed {
		q := plain[i]
		if p.ID != q.ID || p.Proto != q.Proto || p.Churn != q.Churn || p.Gateway != q.Gateway || p.To != q.To || p.Seed != q.Seed {
			t.Fatalf("%s: the mix changed more than the periods and the churn times: %+v, was %+v", p.ID, p, q)
		}
		if p.Proto.mqtt() {
			if p.Period != time.Second {
				t.Fatalf("MQTT %s: period %v, want the heartbeat", p.ID, p.Period)
			}
		} else {
			if want := o.Periods[k%len(o.Periods)]; p.Period != want {
				t.Fatalf("CoAP device %d (%s): period %v, want %v", k, p.ID, p.Period, want)
			}
			k++
		}
		if p.Phase < 0 || p.Phase >= p.Period {
			t.Fatalf("%s: phase %v outside its period %v", p.ID, p.Phase, p.Period)
		}
		if p.Churn != Steady && p.At < o.ChurnAfter {
			t.Fatalf("%s: %s at %v, before ChurnAfter", p.ID, p.Churn, p.At)
		}
		if p.Churn != Steady && p.Churn != Storm && p.Churn != Visit && p.At < p.Phase+p.Period/2 {
			t.Fatalf("%s: %s at %v, before its first heartbeat was taken (phase %v)", p.ID, p.Churn, p.At, p.Phase)
		}
		count[p.Period]++
	}
	if count[100*time.Millisecond] != 75 || count[time.Minute] != 75 || count[time.Second] != 100+75 {
		t.Fatalf("devices per period %v", count)
	}
	if got := o.MaxPeriod(); got != time.Minute {
		t.Fatalf("MaxPeriod = %v", got)
	}
}

func TestParsePeriods(t *testing.T) {
	got, err := ParsePeriods("17ms, 1s,1m")
	if err != nil || !reflect.DeepEqual(got, []time.Duration{17 * time.Millisecond, time.Second, time.Minute}) {
		t.Fatalf("got %v, %v", got, err)
	}
	for _, bad := range []string{"1", "0s", "-1s", "soon"} {
		if _, err := ParsePeriods(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// ChurnShare gives every enabled churn that share of each protocol's
// devices.
func TestPlanChurnShare(t *testing.T) {
	o := PlanOptions{Devices: 200, Duration: time.Minute, Heartbeat: time.Second, CoAPGateways: 1,
		Scenarios: []Churn{Freeze}, Seed: 3, Prefix: "s-", ChurnShare: 0.5}
	n := 0
	for _, p := range Plan(o) {
		if p.Churn == Freeze {
			n++
		}
	}
	if n != 100 {
		t.Fatalf("%d frozen of 200 with ChurnShare 0.5", n)
	}
}
