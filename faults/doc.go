// Package faults is fleetgate's fault suite (invariants 6–10 of
// docs/design.md §7): real redis-server processes (standalone, a replica, a
// Cluster with replicas), two `fleetgate run` binaries and a CoAP + MQTT
// fleet, put through Redis pauses, restarts, FLUSHALL, failovers, site
// partitions, gateway kills, moves and a simulated reboot. A checker
// compares the event log read from the `{P:s}:events` streams with what
// the fleet did and counts false offline, missed offline, repeated
// (device, ver) and broken alternation events.
//
// The tests carry the build tag `faults` so that `make test` does not run
// them: run them with `make test-faults`, or one scenario alone with
//
//	go test -tags faults -count=1 -v -run TestRedisFlushAll ./faults/
//
// FAULTS_REPORT=file appends each scenario's table row to file,
// FAULTS_DUMP=dir writes a failing scenario's event log and truth there,
// and each gateway's whole log (<test>-<gateway>.log), and
// FAULTS_LOG_LEVEL sets the gateways' log level (info unless set).
// docs/reliability.md has the figures.
package faults
