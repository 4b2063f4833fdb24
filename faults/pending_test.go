//go:build faults

package faults

import (
	"os"
	"testing"
)

// pending lists the scenarios that fail on today's code, each with the
// issue-9 item it waits for (docs/reliability.md has what they measured).
// Delete a line when its fix lands; FAULTS_ALL=1 runs every
// scenario regardless.
var pending = map[string]string{
	"TestRedisRestartWithoutPersistence":      "waits for issue 9 items 5 (versions that never repeat) and 2 (grace after an incarnation change; offline of devices whose record was lost)",
	"TestRedisFlushAll":                       "waits for issue 9 items 5 (versions that never repeat) and 2 (grace after an incarnation change; offline of devices whose record was lost)",
	"TestFailoverToLaggingReplica":            "waits for issue 9 items 5 (versions that never repeat after a failover to a lagging replica) and 2 (gateway grace)",
	"TestClusterMasterKilled":                 "waits for issue 9 Tests (gateways and runner follow a Cluster failover: go-redis reloads slots every 60 s) and item 2 (gateway grace)",
	"TestLeaveThroughBThenStaleRenewThroughA": "waits for issue 9 item 3 (leave tombstone)",
}

// issue9Keys are configuration keys issue 9 adds, with the value the
// scenarios are designed for. TestMain writes each into every gateway's
// YAML once the built binary accepts it (it asks check-config), so the
// harness needs no change when a key lands.
func issue9Keys(tm timing) map[string]any {
	return map[string]any{"presence.gateway_grace": tm.grace.String()}
}

// gatewaysStream is the Redis key of the gateways event stream (`lost`
// and `back`, issue 9 item 2) once the fix names it; "" leaves that check
// out of the long partition.
var gatewaysStream = ""

// skipPending skips t if its scenario is pending.
func skipPending(t *testing.T) {
	t.Helper()
	if why, ok := pending[t.Name()]; ok && os.Getenv("FAULTS_ALL") == "" {
		t.Skipf("%s (pending in faults/pending_test.go; FAULTS_ALL=1 runs it)", why)
	}
}
