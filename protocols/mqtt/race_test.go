//go:build race

package mqtt

// raceEnabled: the race detector makes bcrypt about ten times slower, so
// the flood test hashes at a lower cost to keep the same proportions.
const raceEnabled = true
