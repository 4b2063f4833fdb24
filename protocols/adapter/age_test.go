package adapter_test

import (
	"encoding/json"
	"math"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/buildtest"
	"github.com/fleetgate/fleetgate/protocols/adapter"
)

// TestAgeNeverPutsEvidenceInTheFuture runs an adapter that sends ages the
// SDK never would: ages whose microseconds overflow a time.Duration (they
// used to wrap around into the future) and an age beyond the lease are
// rejected; a negative age counts as 0; the others date their evidence.
func TestAgeNeverPutsEvidenceInTheFuture(t *testing.T) {
	var path string
	if err := buildtest.Build(t.TempDir(), map[string]*string{"github.com/fleetgate/fleetgate/protocols/adapter/testdata/rawadapter": &path}); err != nil {
		t.Fatal(err)
	}
	e := newHost(t, nil) // lease: a minute
	ages := []int64{math.MaxInt64, -5, (time.Minute + time.Second).Microseconds(), 2_000_000, math.MaxInt64/1000 + 1}
	config, err := json.Marshal(map[string]any{"age_us": ages})
	if err != nil {
		t.Fatal(err)
	}
	spec := adapter.Spec{Name: "raw", Path: path, StartTimeout: 10 * time.Second, Devices: []string{"raw-*"}, Config: config}
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "five items", func() bool {
		st := e.status(t, "raw")
		return st.Accepted+st.Rejected+st.Dropped == 5
	})
	now := e.clock.Now()
	at := map[string]time.Time{}
	for _, ev := range e.rec.Evidence() {
		at[string(ev.Device)] = ev.ObservedAt
		if ev.ObservedAt.After(now) {
			t.Errorf("%s observed %s in the future", ev.Device, ev.ObservedAt.Sub(now))
		}
	}
	st := e.status(t, "raw")
	if st.Rejected != 3 || len(at) != 2 || !at["raw-1"].Equal(now) || !at["raw-3"].Equal(now.Add(-2*time.Second)) {
		t.Fatalf("status = %+v, observed %v (now %v); want raw-1 at now, raw-3 2 s before, the other three rejected", st, at, now)
	}
}

// TestFrameThatWaitedKeepsItsObservationTimes: a frame made 2 s before
// the host reads it (it waited while the gateway was stopped) dates its
// evidence from when it was made: its ages count from then.
func TestFrameThatWaitedKeepsItsObservationTimes(t *testing.T) {
	var path string
	if err := buildtest.Build(t.TempDir(), map[string]*string{"github.com/fleetgate/fleetgate/protocols/adapter/testdata/rawadapter": &path}); err != nil {
		t.Fatal(err)
	}
	e := newHost(t, nil) // lease: a minute
	config, err := json.Marshal(map[string]any{"age_us": []int64{0, 1_000_000}, "sent_ago_us": 2_000_000})
	if err != nil {
		t.Fatal(err)
	}
	spec := adapter.Spec{Name: "raw", Path: path, StartTimeout: 10 * time.Second, Devices: []string{"raw-*"}, Config: config}
	if err := e.host.Apply(ctx(t), []adapter.Spec{spec}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "two items", func() bool { return e.status(t, "raw").Accepted == 2 })
	now := e.clock.Now()
	for _, ev := range e.rec.Evidence() {
		want := 2 * time.Second
		if ev.Device == "raw-1" {
			want = 3 * time.Second
		}
		// the frame's wait is read on the wall clock: its transit adds a little
		if age := now.Sub(ev.ObservedAt); age < want || age > want+time.Second {
			t.Errorf("%s observed %v before now, want %v (and its transit)", ev.Device, age, want)
		}
	}
}
