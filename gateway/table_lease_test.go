package gateway_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// leasedWrite is a write the table enqueued, with its lease.
type leasedWrite struct {
	kind      gateway.Kind
	at, lease time.Duration
}

// observeLeased observes evidence of dev-1's session s1 at t0+at with the
// lease the front end granted (0: the table's).
func (f *fixture) observeLeased(k gateway.Kind, at, lease time.Duration) {
	f.t.Helper()
	f.clock.Set(t0.Add(at))
	err := f.tbl.Observe(context.Background(), gateway.Evidence{
		Device: "dev-1", Session: "s1", Kind: k, ObservedAt: f.clock.Now(), Protocol: "coap", Lease: lease,
	})
	if err != nil {
		f.t.Fatalf("observe %v at %v lease %v: %v", k, at, lease, err)
	}
}

func (f *fixture) expectLeased(want ...leasedWrite) {
	f.t.Helper()
	var got []leasedWrite
	for _, ev := range f.up.take() {
		got = append(got, leasedWrite{ev.Kind, ev.ObservedAt.Sub(t0), ev.Lease})
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		f.t.Fatalf("writes (kind at lease):\n got %v\nwant %v", got, want)
	}
}

// TestTableLeases: every write carries the lease its evidence holds the
// session for; the throttle and the local lease follow deadlines, so
// that a longer lease asked for just after a renewal is sent, and a
// reload that shortens the lease or renew_every ends nothing early.
func TestTableLeases(t *testing.T) {
	const s = time.Second
	type step struct {
		reload    [2]time.Duration // SetTiming(lease, renewEvery) before the evidence, when set
		kind      gateway.Kind
		at, lease time.Duration
		sweep     time.Duration // Sweep at t0+sweep after the evidence, when set
		swept     int
	}
	tests := []struct {
		name  string
		steps []step
		want  []leasedWrite
	}{
		{
			name: "own lease travels; table lease otherwise",
			steps: []step{
				{kind: gateway.Connect, at: 0, lease: 300 * s},
				{kind: gateway.Renew, at: 30 * s},
			},
			// 30s+90s is not 20s past 300s: the renewal is not sent.
			want: []leasedWrite{{gateway.Connect, 0, 300 * s}},
		},
		{
			name: "a longer lease asked just after a renewal is sent",
			steps: []step{
				{kind: gateway.Renew, at: 0},
				{kind: gateway.Renew, at: 5 * s, lease: time.Hour},
				{kind: gateway.Renew, at: 10 * s},
			},
			want: []leasedWrite{{gateway.Connect, 0, 90 * s}, {gateway.Renew, 5 * s, time.Hour}},
		},
		{
			name: "a leave reaches the deadline of the newest write sent",
			steps: []step{
				{kind: gateway.Renew, at: 0, lease: time.Hour},
				{kind: gateway.Leave, at: 10 * s},
			},
			want: []leasedWrite{{gateway.Connect, 0, time.Hour}, {gateway.Leave, 10 * s, time.Hour - 10*s}},
		},
		{
			name: "a leave of an unknown session takes the table lease",
			steps: []step{
				{kind: gateway.Leave, at: 10 * s},
			},
			want: []leasedWrite{{gateway.Leave, 10 * s, 90 * s}},
		},
		{
			name: "a long lease keeps the session in the table",
			steps: []step{
				{kind: gateway.Renew, at: 0, lease: time.Hour, sweep: 3599 * s},
				{kind: gateway.Renew, at: 3599 * s, sweep: 3599*s + 90*s, swept: 1},
			},
			want: []leasedWrite{{gateway.Connect, 0, time.Hour}, {gateway.Renew, 3599 * s, 90 * s}},
		},
		{
			name: "reload to a shorter lease: nothing ends early",
			steps: []step{
				{kind: gateway.Renew, at: 0},
				// evidence from before the reload keeps the session to 90s
				{reload: [2]time.Duration{30 * s, 5 * s}, kind: gateway.Renew, at: 30 * s, sweep: 89 * s},
				{kind: gateway.Renew, at: 60 * s},
				{kind: gateway.Renew, at: 65 * s, sweep: 94 * s},
				{kind: gateway.Renew, at: 70 * s, sweep: 100 * s, swept: 1},
			},
			want: []leasedWrite{{gateway.Connect, 0, 90 * s}, {gateway.Renew, 65 * s, 30 * s}, {gateway.Renew, 70 * s, 30 * s}},
		},
		{
			name: "reload to a longer lease: the next evidence carries it",
			steps: []step{
				{kind: gateway.Renew, at: 0},
				{reload: [2]time.Duration{180 * s, 20 * s}, kind: gateway.Renew, at: 1 * s},
			},
			want: []leasedWrite{{gateway.Connect, 0, 90 * s}, {gateway.Renew, 1 * s, 180 * s}},
		},
		{
			name: "front end keeps an old lease after a reload (an MQTT connection from before it)",
			steps: []step{
				{kind: gateway.Connect, at: 0},
				{reload: [2]time.Duration{30 * s, 5 * s}, kind: gateway.Renew, at: 75 * s, lease: 90 * s, sweep: 164 * s},
			},
			want: []leasedWrite{{gateway.Connect, 0, 90 * s}, {gateway.Renew, 75 * s, 90 * s}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, gateway.TableOptions{}, 16)
			for _, st := range tc.steps {
				if st.reload != [2]time.Duration{} {
					f.tbl.SetTiming(st.reload[0], st.reload[1])
				}
				f.observeLeased(st.kind, st.at, st.lease)
				if st.sweep != 0 {
					if n := f.tbl.Sweep(t0.Add(st.sweep)); n != st.swept {
						t.Fatalf("Sweep at %v after evidence at %v dropped %d, want %d", st.sweep, st.at, n, st.swept)
					}
				}
			}
			f.expectLeased(tc.want...)
		})
	}
}
