package storetest

import (
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// lease is the lease of the conformance batches.
const lease = 30 * time.Second

const (
	gwA = "gw-a"
	gwB = "gw-b"
)

// Run runs the conformance subtests against stores made by open.
func Run(t *testing.T, open Opener) {
	tests := []struct {
		name string
		fn   func(*testing.T, Opener)
	}{
		{"ShardsAndNow", testShardsAndNow},
		{"ConnectCreatesOnline", testConnectCreatesOnline},
		{"RenewLiveSession", testRenewLiveSession},
		{"SecondSessionKeepsDeviceOnline", testSecondSession},
		{"LeaveLastSession", testLeaveLastSession},
		{"LeaveIgnoredForNewerEvidence", testLeaveNewerEvidence},
		{"LapsedEvidenceIgnored", testLapsedEvidence},
		{"RenewAfterDeadlineBeforeReap", testRenewAfterDeadline},
		{"LeaveAfterDeadlineBeforeReap", testLeaveAfterDeadline},
		{"LateButValidRenewal", testLateButValidRenewal},
		{"PerWriteLease", testPerWriteLease},
		{"ExpiryOfOneSessionKeepsAnother", testExpiryKeepsOther},
		{"Reap", testReap},
		{"ReapKeepsDeviceWithLiveSession", testReapKeepsLive},
		{"Fencing", testFencing},
		{"FencedBatchWritesNoExpiry", testFencedNoExpiry},
		{"EmptyBatchRecordsEpoch", testEmptyBatchRecordsEpoch},
		{"ShardErrors", testShardErrors},
		{"DeviceNotFound", testDeviceNotFound},
		{"VerContinues", testVerContinues},
		{"DuplicateWritesInBatch", testDuplicateWrites},
		{"ReplayedBatchWritesNoEvent", testReplayedBatch},
		{"SessionMovesBetweenGateways", testSessionMoves},
		{"EventsPaging", testEventsPaging},
		{"ListPaging", testListPaging},
		{"ShardLock", testShardLock},
		{"VerStartsAtStoreTime", testVerStartsAtStoreTime},
		{"LeaveTombstone", testLeaveTombstone},
		{"OlderEvidenceTakesNothing", testOlderEvidenceTakesNothing},
		{"RestoreOfALostRecord", testRestore},
		{"SessionsPerDeviceBounded", testStoreSessionCap},
		{"ConcurrentApply", testConcurrentApply},
		{"ConcurrentReapAndRenew", testConcurrentReapAndRenew},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}

func wr(d gateway.DeviceID, s gateway.SessionID, k gateway.Kind, age time.Duration) gateway.Write {
	return gateway.Write{Device: d, Session: s, Kind: k, Age: age}
}

func batch(gw string, epoch uint64, ws ...gateway.Write) gateway.Batch {
	return gateway.Batch{Gateway: gw, Epoch: epoch, Lease: lease, Writes: ws}
}

func onlineInfo(d gateway.DeviceID, ver uint64, since time.Time, sessions ...gateway.SessionInfo) gateway.DeviceInfo {
	var deadline time.Time
	for _, s := range sessions {
		if s.Deadline.After(deadline) {
			deadline = s.Deadline
		}
	}
	return gateway.DeviceInfo{Device: d, State: gateway.Online, Deadline: deadline, Ver: ver, Since: since, Sessions: sessions}
}

func offlineInfo(d gateway.DeviceID, ver uint64, since time.Time) gateway.DeviceInfo {
	return gateway.DeviceInfo{Device: d, State: gateway.Offline, Ver: ver, Since: since}
}

func sess(id gateway.SessionID, deadline time.Time) gateway.SessionInfo {
	return gateway.SessionInfo{ID: id, Deadline: deadline}
}
