package gateway

import "time"

// Reasons a front end refuses a device, the values of a Refusal's Reason
// (and of the reason label of fleetgate_refused_total). A front end keeps
// its finer reasons in its own metrics; these are what an operator acts
// on.
const (
	// RefusedUnknownDevice: the device is not in the devices file and
	// anonymous access does not admit it.
	RefusedUnknownDevice = "unknown_device"
	// RefusedBadCredentials: a device of the devices file with a wrong
	// or missing key or password (or an MQTT user name other than its
	// client ID).
	RefusedBadCredentials = "bad_credentials"
	// RefusedNotAuthorized: the device authenticated but asked for what
	// it may not (a topic outside its subtree, another device's ID, an
	// adapter speaking for a device it may not).
	RefusedNotAuthorized = "not_authorized"
	// RefusedLimit: a bound was reached (clients, sessions per device,
	// anonymous devices, an adapter's limits, a client too slow).
	RefusedLimit = "limit"
	// RefusedRate: the device connected or sent faster than it may.
	RefusedRate = "rate"
	// RefusedBadRequest: the request was malformed or invalid (a client
	// ID that is not a device ID, an unknown CoAP resource or option).
	RefusedBadRequest = "bad_request"
	// RefusedRevoked: a reload of the devices file removed the device or
	// changed its credentials, ending its sessions.
	RefusedRevoked = "revoked"
	// RefusedOverloaded: the gateway shed load.
	RefusedOverloaded = "overloaded"
	// RefusedError: the gateway failed (an internal error).
	RefusedError = "error"
)

// Refusal is one refusal of a device by a front end, for the operator:
// the device is told as little as its protocol allows, the operator why.
type Refusal struct {
	// Protocol is the front end: "coap", "mqtt", or an adapter's name.
	Protocol string `json:"protocol"`
	// Device is the ID the client claimed, unchecked: it may not be a
	// valid device ID (the reporter sanitizes it).
	Device string `json:"device"`
	// Reason is one of the Refused* values.
	Reason string `json:"reason"`
	// Detail says what exactly was wrong, in a few words ("wrong
	// password"); never a secret.
	Detail string `json:"detail,omitempty"`
	// Remote is the client's address, "" when unknown.
	Remote string `json:"remote,omitempty"`
	// At is when the front end refused it.
	At time.Time `json:"at"`
}

// Refusals takes the front ends' refusals of devices: it logs them
// (rate-limited), counts them and keeps each device's last one.
// Refuse must be cheap and safe for concurrent use: a flood of refused
// clients calls it for each.
type Refusals interface {
	Refuse(r Refusal)
}

// NoRefusals discards refusals (a front end built without a reporter).
type NoRefusals struct{}

var _ Refusals = NoRefusals{}

func (NoRefusals) Refuse(Refusal) {}
