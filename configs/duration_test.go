package configs_test

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/configs"
)

func TestDurationString(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                                    "0s",
		90 * time.Second:                     "90s",
		60 * time.Second:                     "1m",
		15 * time.Minute:                     "15m",
		2 * time.Hour:                        "2h",
		-20 * time.Second:                    "-20s",
		1500 * time.Millisecond:              "1.5s",
		250 * time.Millisecond:               "250ms",
		time.Hour + 30*time.Minute:           "1h30m0s",
		time.Hour + time.Second:              "1h0m1s",
		59*time.Minute + 59*time.Second:      "3599s",
		time.Duration(-1 << 63):              "-2562047h47m16.854775808s",
		time.Duration(1<<63 - 1):             "2562047h47m16.854775807s",
		65535 * time.Second:                  "18h12m15s",
		3*time.Second + 100*time.Microsecond: "3.0001s",
	} {
		if got := configs.Duration(d).String(); got != want {
			t.Errorf("%v: String() = %q, want %q", d, got, want)
		}
		var back configs.Duration
		if err := back.UnmarshalText([]byte(want)); err != nil || back.Std() != d {
			t.Errorf("%q parses to %v, %v; want %v", want, back.Std(), err, d)
		}
	}
}

func TestDurationRefusesBareNumbers(t *testing.T) {
	for in, want := range map[string]string{
		"90":   `duration 90 has no unit (write "90s" for seconds)`,
		"1.5":  `duration 1.5 has no unit (write "1.5s" for seconds)`,
		"0":    `duration 0 has no unit (write "0s" for seconds)`,
		"":     `invalid duration "" (want a number with a unit: ns, us, ms, s, m or h, as in "90s")`,
		"90 s": `invalid duration "90 s" (want a number with a unit: ns, us, ms, s, m or h, as in "90s")`,
		"1d":   `invalid duration "1d" (want a number with a unit: ns, us, ms, s, m or h, as in "90s")`,
	} {
		var d configs.Duration
		if err := d.UnmarshalText([]byte(in)); err == nil || err.Error() != want {
			t.Errorf("%q: err %v, want %s", in, err, want)
		}
	}
}

// Bounds go to the admin API as JSON; durations read as strings there.
func TestDurationJSON(t *testing.T) {
	out, err := json.Marshal(configs.Default().Bounds())
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"suspect":"45s","earliest_offline":"70s","worst_case_detection":"94s","worst_case_detection_failover":"99s","worst_case_detection_lost_gateway":"151s","after_store_outage":"64s","leave":"3s","leave_held":"7s","leave_cut":"154s","heartbeat_margin":"9s","max_lease":"90s","max_lease_heartbeat":"30s","worst_case_detection_max_lease":"94s"}`
	if string(out) != want {
		t.Fatalf("got %s, want %s", out, want)
	}
}
