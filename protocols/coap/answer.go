package coap

import (
	"errors"
	"math"
	"strconv"
	"strings"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/udp/coder"

	"github.com/fleetgate/fleetgate/gateway"
)

// uintOption is an option with a uint value of an answer; id 0 is none.
type uintOption struct {
	id    message.OptionID
	value uint32
}

// answer is the front end's answer to a request before it is fitted to
// a size and encoded: its code, a diagnostic payload (text/plain) of a
// refusal, one uint option (Max-Age of a 2.04 or 5.03, Size1 of a 4.13)
// and the command a 2.04 carries to the device.
type answer struct {
	code codes.Code
	diag string
	opt  uintOption
	cmd  *gateway.Command
}

// refusal is the answer to a request refused with err (parseRequest,
// the devices file, the device's rate, the Observer).
func refusal(err error) answer {
	if errors.Is(err, errDeviceRate) {
		return answer{code: codes.TooManyRequests, diag: "too many requests, retry after Max-Age"}
	}
	code, diag := errorResponse(err)
	a := answer{code: code, diag: diag}
	if code == codes.ServiceUnavailable {
		a.opt = uintOption{message.MaxAge, retryAfterSeconds}
	}
	return a
}

// carried says what became of the command of an answer once built.
type carried int

const (
	// carriedNothing: the answer had no command, or no room for a word
	// of it.
	carriedNothing carried = iota
	// carriedCommand: the answer carries the command.
	carriedCommand
	// carriedMarker: the command did not fit; Size2 tells the device how
	// large a request must be for it.
	carriedMarker
)

// scratch is the space one goroutine builds answers in.
type scratch struct {
	opts  message.Options
	vals  [3][4]byte // uint option values
	query []byte     // the Location-Query c=<id>
}

// Levels of build: what an answer keeps.
const (
	keepAll     = iota // the command, or the diagnostic; the option
	keepMarker         // the command replaced by its marker; the option
	keepOption         // the option
	keepNothing        // the code (and the request's token)
)

// build sets m's code, options and payload to a in at most limit bytes
// once encoded with m.Token: what does not fit is left out, first the
// command (replaced by the marker Size2 = the size a request must reach
// for it, commandAnswerSize), then the marker or the diagnostic, then
// the option. The header and the token always fit a request's size.
// m.Options and the values point into sc until the next build.
func (a *answer) build(m *message.Message, limit int, sc *scratch) carried {
	m.Code = a.code
	for level := keepAll; level < keepNothing; level++ {
		if level == keepMarker && a.cmd == nil {
			continue
		}
		got := a.compose(m, level, sc)
		if n, err := coder.DefaultCoder.Size(*m); err == nil && n <= limit {
			return got
		}
	}
	return a.compose(m, keepNothing, sc)
}

// compose sets m's options and payload to what level keeps of a.
func (a *answer) compose(m *message.Message, level int, sc *scratch) carried {
	opts := sc.opts[:0]
	m.Payload = nil
	got := carriedNothing
	uintOpt := func(id message.OptionID, v uint32, buf *[4]byte) {
		n, _ := message.EncodeUint32(buf[:], v)
		opts = append(opts, message.Option{ID: id, Value: buf[:n]})
	}
	// Options in ascending number: Location-Path 8, Content-Format 12,
	// Max-Age 14, Location-Query 20, Size2 28, Size1 60.
	switch {
	case level == keepAll && a.cmd != nil:
		for l := range strings.SplitSeq(a.cmd.Topic, "/") {
			opts = append(opts, message.Option{ID: message.LocationPath, Value: []byte(l)})
		}
		if cf, ok := contentFormat(a.cmd.ContentType); ok {
			uintOpt(message.ContentFormat, uint32(cf), &sc.vals[0])
		}
		m.Payload = a.cmd.Payload
		got = carriedCommand
	case level == keepAll && a.diag != "":
		// text/plain is 0, which encodes as no bytes.
		opts = append(opts, message.Option{ID: message.ContentFormat})
		m.Payload = []byte(a.diag)
	}
	if a.opt.id != 0 && level < keepNothing {
		uintOpt(a.opt.id, a.opt.value, &sc.vals[1])
	}
	switch {
	case got == carriedCommand:
		sc.query = strconv.AppendUint(append(sc.query[:0], "c="...), a.cmd.ID, 10)
		opts = append(opts, message.Option{ID: message.LocationQuery, Value: sc.query})
	case level == keepMarker:
		uintOpt(message.Size2, uint32(min(uint64(commandAnswerSize(a.cmd)), math.MaxUint32)), &sc.vals[2])
		got = carriedMarker
	}
	m.Options = opts
	sc.opts = opts
	return got
}

// maxLocationLen is the longest value of a Location-Path option (RFC
// 7252 §5.10).
const maxLocationLen = 255

// commandAnswerSize is the encoded size of a 2.04 that carries c with
// the longest token and Max-Age: over plain UDP a request at least that
// large always has room for c in its answer. A topic level longer than a
// Location-Path option can be never fits: math.MaxInt.
func commandAnswerSize(c *gateway.Command) int {
	for l := range strings.SplitSeq(c.Topic, "/") {
		if len(l) > maxLocationLen {
			return math.MaxInt
		}
	}
	a := answer{code: codes.Changed, opt: uintOption{message.MaxAge, math.MaxUint32}, cmd: c}
	m := message.Message{Token: make(message.Token, message.MaxTokenSize)}
	a.compose(&m, keepAll, &scratch{})
	n, err := coder.DefaultCoder.Size(m)
	if err != nil {
		return math.MaxInt
	}
	return n
}
