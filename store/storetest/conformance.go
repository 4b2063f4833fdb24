package storetest

import (
	"testing"
	"time"
)

// lease is the lease of the conformance batches.
const lease = 30 * time.Second

const (
	gwA = "gw-a"
	gwB = "gw-b"
)

// Run runs the conformance subtests against stores made by open.
func Run(t *testing.T, open Opener) {
	suite{
		{"ShardsAndNow", testShardsAndNow},
		{"ConnectCreatesOnline", testConnectCreatesOnline},
		{"RenewLiveSession", testRenewLiveSession},
		{"SecondSessionKeepsDeviceOnline", testSecondSession},
		{"LeaveLastSession", testLeaveLastSession},
		{"LeaveBridgedInBatch", testLeaveBridgedInBatch},
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
		{"Probe", testProbe},
		{"IncarnationNamed", testIncarnationNamed},
		{"DeviceNotFound", testDeviceNotFound},
		{"VerContinues", testVerContinues},
		{"DuplicateWritesInBatch", testDuplicateWrites},
		{"ReplayedBatchWritesNoEvent", testReplayedBatch},
		{"SessionMovesBetweenGateways", testSessionMoves},
		{"EventsPaging", testEventsPaging},
		{"ListPaging", testListPaging},
		{"ListOrders", testListOrders},
		{"ListByChangeMoves", testListByChangeMoves},
		{"ListSparseFilter", testListSparseFilter},
		{"ShardLock", testShardLock},
		{"VerStartsAtStoreTime", testVerStartsAtStoreTime},
		{"LeaveTombstone", testLeaveTombstone},
		{"OlderEvidenceTakesNothing", testOlderEvidenceTakesNothing},
		{"RestoreOfALostRecord", testRestore},
		{"RestoredLeave", testRestoredLeave},
		{"SessionsPerDeviceBounded", testStoreSessionCap},
		{"ConcurrentApply", testConcurrentApply},
		{"ConcurrentReapAndRenew", testConcurrentReapAndRenew},
		{"Counts", testCounts},
		{"CountsSuspect", testCountsSuspect},
		{"Gateways", testGateways},
		{"GatewaySessions", testGatewaySessions},
		{"Forget", testForget},
		{"ForgetOffline", testForgetOffline},
		{"ForgetVerNeverRepeats", testForgetVerNeverRepeats},
		{"ForgetConcurrentRenewal", testForgetConcurrentRenewal},
	}.run(t, open)
}

// suite is a list of named cases.
type suite []struct {
	name string
	fn   func(*testing.T, Opener)
}

// run runs each case as a subtest of its name with stores made by open.
func (s suite) run(t *testing.T, open Opener) {
	for _, tc := range s {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, open) })
	}
}
