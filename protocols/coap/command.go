package coap

import (
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// Commands reach a CoAP device on the answers to its own requests
// (docs/design.md §6.7): it keeps no socket open for them. A 2.04 to a
// renewal (POST /hb, POST /d/...) of a device with a pending command
// carries the oldest one: its payload, its Content-Format, its topic in
// Location-Path options ("cmd", then the levels of the rest) and its ID
// in the Location-Query c=<id>. The device acknowledges it with the
// query a=<id> on a later request, which removes it (Commands.Ack); the
// answer to that request carries the next one. A command not
// acknowledged is sent again on every renewal until it is or it expires:
// delivery is at least once.
//
// Over plain UDP no answer is larger than its request: a command whose
// answer does not fit is replaced by the marker Size2 = the size the
// request must reach (commandAnswerSize), and the device sends a request
// padded to it. A command whose answer could not fit even the largest
// message (limits.coap_max_message_size) can never be delivered to a
// CoAP device: the front end drops it (Commands.Ack) and counts it.

// pendingLookahead is how many of a device's pending commands an answer
// looks at: the first deliverable one among them is sent, the
// undeliverable ones before it are dropped.
const pendingLookahead = 4

// pickCommand chooses the command an answer carries from a device's
// pending commands (oldest first, as Commands.Pending returns them): the
// first one not expired at now whose answer fits in maxSize bytes
// (commandAnswerSize). The ones before it that never fit are returned as
// undeliverable; expired ones are passed over. A zero Expires never
// expires.
func pickCommand(pending []gateway.Command, now time.Time, maxSize int) (pick *gateway.Command, undeliverable []gateway.Command) {
	for i := range pending {
		c := &pending[i]
		switch {
		case !c.Expires.IsZero() && !now.Before(c.Expires):
		case commandAnswerSize(c) > maxSize:
			undeliverable = append(undeliverable, *c)
		default:
			return c, undeliverable
		}
	}
	return nil, undeliverable
}
