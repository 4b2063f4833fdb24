package sim

import (
	"strings"
	"testing"
)

// ParseScenarios and ParsePeriods read the command line; ParseInfo and
// streamEvent read what a Redis server answers. None of them may panic
// on any input.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"all", "freeze,leave", " storm , none", "meteor", ",,", "steady",
		"# Commandstats\r\ncmdstat_get:calls=3,usec=1\r\nused_cpu_sys:0.5\r\n", "cmdstat_x:calls=,", "used_cpu_user:NaN",
		"17ms,167ms,1s,10s,1m", "1s,,-1s", "9223372036854775807ns"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if cs, err := ParseScenarios(s); err == nil {
			for _, c := range cs {
				if c <= Steady || c > Visit {
					t.Fatalf("%q gave churn %d", s, c)
				}
			}
		}
		if ps, err := ParsePeriods(s); err == nil {
			for _, p := range ps {
				if p <= 0 {
					t.Fatalf("%q gave the period %v", s, p)
				}
			}
		}
		if c := ParseInfo(s); c.Calls < 0 {
			t.Fatalf("%q: negative calls %d", s, c.Calls)
		}
		fields := map[string]any{}
		for i, kv := range strings.Split(s, ",") {
			k, v, _ := strings.Cut(kv, "=")
			fields[k] = v
			if i%2 == 1 {
				fields[k] = []byte(v) // not a string: ignored
			}
		}
		_ = streamEvent(fields)
	})
}
