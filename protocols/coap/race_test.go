//go:build race

package coap

// raceEnabled: the race detector slows everything down several times, so
// the flood tests send less to keep the same proportions.
const raceEnabled = true
