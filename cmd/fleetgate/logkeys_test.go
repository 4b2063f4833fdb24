package main

import (
	"strconv"
	"strings"
	"testing"
)

// repeatedKeys returns the keys that a log line of slog's text handler
// carries more than once (a logger made With("gateway", id) that also
// logs an explicit "gateway" attribute: "gateway=a ... gateway=a"). Lines
// that are not slog's (no leading time=) have none.
func repeatedKeys(line string) []string {
	if !strings.HasPrefix(line, "time=") {
		return nil
	}
	seen := map[string]bool{}
	var dup []string
	for i := 0; i < len(line); {
		if line[i] == ' ' {
			i++
			continue
		}
		j := i
		for j < len(line) && line[j] != '=' && line[j] != ' ' {
			j++
		}
		if j == len(line) || line[j] != '=' {
			i = j
			continue
		}
		key := line[i:j]
		j++
		if j < len(line) && line[j] == '"' {
			q, err := strconv.QuotedPrefix(line[j:])
			if err != nil {
				j = len(line)
			} else {
				j += len(q)
			}
		} else {
			for j < len(line) && line[j] != ' ' {
				j++
			}
		}
		if seen[key] {
			dup = append(dup, key)
		}
		seen[key] = true
		i = j
	}
	return dup
}

// checkLogKeys fails t for every line of a process's log that carries a
// key twice.
func checkLogKeys(t testing.TB, name, log string) {
	t.Helper()
	for _, line := range strings.Split(log, "\n") {
		if dup := repeatedKeys(line); len(dup) > 0 {
			t.Errorf("%s logged %v twice in one line: %s", name, dup, line)
		}
	}
}

func TestRepeatedKeys(t *testing.T) {
	for line, want := range map[string]string{
		`time=2026-12-01T00:00:00Z level=WARN msg="uplink down: buffering writes in the outbox" gateway=gw-a err="dial tcp: gateway=x refused"`:  "",
		`time=2026-12-01T00:00:00Z level=WARN msg="uplink down: buffering writes in the outbox" gateway=gw-a gateway=gw-a err=refused`:           "gateway",
		`time=2026-12-01T00:00:00Z level=ERROR msg="a \"quoted\" gateway=b" gateway=gw-a runner=gw-a/3 shard=1 err="x=1 y=2" shard=2 gateway=""`: "shard gateway",
		`panic: gateway=a gateway=a`: "",
	} {
		if got := strings.Join(repeatedKeys(line), " "); got != want {
			t.Errorf("repeatedKeys(%s) = %q, want %q", line, got, want)
		}
	}
}
