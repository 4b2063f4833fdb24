package coap

import (
	"errors"
	"fmt"

	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
)

// metrics are the front end's Prometheus counters.
type metrics struct {
	evidence map[gateway.Kind]prometheus.Counter
	requests *prometheus.CounterVec
	// byCode holds the request counter of each code in answeredCodes,
	// so that the hot path does no label hashing.
	byCode map[codes.Code]prometheus.Counter
}

// answeredCodes are the codes the handler answers with.
var answeredCodes = []codes.Code{
	codes.Changed, codes.BadRequest, codes.Unauthorized, codes.Forbidden,
	codes.NotFound, codes.MethodNotAllowed, codes.InternalServerError, codes.ServiceUnavailable,
}

// newMetrics builds the counters and registers them with reg (nil: not
// registered). A collector already registered with the same description,
// as by a second CoAP server (DTLS) on the same registry, is shared.
func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	evidence := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name:        "fleetgate_evidence_total",
		Help:        "Evidence accepted by the gateway from protocol front ends, by kind.",
		ConstLabels: prometheus.Labels{"protocol": "coap"},
	}, []string{"kind"})
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "fleetgate_coap_requests_total",
		Help: "CoAP requests answered by the front end, by response code.",
	}, []string{"code"})
	var err error
	if evidence, err = register(reg, evidence); err != nil {
		return nil, err
	}
	if requests, err = register(reg, requests); err != nil {
		return nil, err
	}
	m := &metrics{
		evidence: make(map[gateway.Kind]prometheus.Counter),
		requests: requests,
		byCode:   make(map[codes.Code]prometheus.Counter, len(answeredCodes)),
	}
	for _, k := range []gateway.Kind{gateway.Renew, gateway.Leave} {
		m.evidence[k] = evidence.WithLabelValues(k.String())
	}
	for _, c := range answeredCodes {
		m.byCode[c] = requests.WithLabelValues(codeLabel(c))
	}
	return m, nil
}

func register(reg prometheus.Registerer, c *prometheus.CounterVec) (*prometheus.CounterVec, error) {
	if reg == nil {
		return c, nil
	}
	err := reg.Register(c)
	if err == nil {
		return c, nil
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(*prometheus.CounterVec); ok {
			return existing, nil
		}
	}
	return nil, fmt.Errorf("register metrics: %w", err)
}

func (m *metrics) answered(c codes.Code) {
	if ctr, ok := m.byCode[c]; ok {
		ctr.Inc()
		return
	}
	m.requests.WithLabelValues(codeLabel(c)).Inc()
}

func (m *metrics) accepted(k gateway.Kind) {
	if ctr, ok := m.evidence[k]; ok {
		ctr.Inc()
	}
}

// codeLabel writes a code the way CoAP documents do: "2.04", "4.00".
func codeLabel(c codes.Code) string {
	return fmt.Sprintf("%d.%02d", uint16(c)>>5, uint16(c)&0x1f)
}
