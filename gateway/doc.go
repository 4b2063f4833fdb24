// Package gateway holds fleetgate's domain: device and session identity,
// presence evidence, events and states, the clock, and the Store contract
// that the Redis and embedded stores implement. It imports no sibling
// package; protocol front ends, the uplink, the stores and the runner meet
// here and are wired together in cmd/fleetgate.
package gateway
