package sim

import (
	"strings"
	"testing"
)

// ParseScenarios reads the command line; ParseInfo and streamEvent read
// what a Redis server answers. None of them may panic on any input.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"all", "freeze,leave", " storm , none", "meteor", ",,", "steady",
		"# Commandstats\r\ncmdstat_get:calls=3,usec=1\r\nused_cpu_sys:0.5\r\n", "cmdstat_x:calls=,", "used_cpu_user:NaN"} {
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
