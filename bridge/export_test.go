package bridge

import "github.com/fleetgate/fleetgate/gateway"

// SetBeforeDurable makes the bridge of o call f before it puts commands
// into the commands queue (the kill -9 test holds a command there).
func SetBeforeDurable(o *Options, f func([]gateway.Message)) { o.beforeDurable = f }
