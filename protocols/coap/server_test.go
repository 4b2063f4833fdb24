package coap

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
)

var start = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestHeartbeatEvidence(t *testing.T) {
	clock := clocktest.New(start)
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true, HeartbeatInterval: 30 * time.Second, Clock: clock})
	cc := dial(t, s)

	cases := []struct {
		name    string
		code    codes.Code
		queries []string
		want    gateway.Evidence
	}{
		{"renew default instance", codes.POST, []string{"d=dev-1"},
			gateway.Evidence{Device: "dev-1", Session: "coap/default", Kind: gateway.Renew}},
		{"renew named instance", codes.POST, []string{"d=dev-1", "s=radio2"},
			gateway.Evidence{Device: "dev-1", Session: "coap/radio2", Kind: gateway.Renew}},
		{"query order and unknown keys", codes.POST, []string{"fw=1.2", "s=radio2", "d=dev.2:a_b-C"},
			gateway.Evidence{Device: "dev.2:a_b-C", Session: "coap/radio2", Kind: gateway.Renew}},
		{"leave", codes.DELETE, []string{"d=dev-1"},
			gateway.Evidence{Device: "dev-1", Session: "coap/default", Kind: gateway.Leave}},
		{"leave named instance", codes.DELETE, []string{"d=dev-1", "s=radio2"},
			gateway.Evidence{Device: "dev-1", Session: "coap/radio2", Kind: gateway.Leave}},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clock.Advance(time.Second)
			r := request(t, cc, message.Confirmable, tc.code, "/hb", tc.queries...)
			if r.code != codes.Changed || r.maxAge != 30 || r.typ != message.Acknowledgement {
				t.Fatalf("reply %v Max-Age %d type %v, want 2.04 Changed, Max-Age 30, ACK", r.code, r.maxAge, r.typ)
			}
			evs := rec.Evidence()
			if len(evs) != i+1 {
				t.Fatalf("%d pieces of evidence, want %d", len(evs), i+1)
			}
			want := tc.want
			want.ObservedAt = clock.Now()
			want.Protocol = "coap"
			want.Anonymous = true // plain UDP
			if got := evs[i]; got != want {
				t.Fatalf("evidence %+v, want %+v", got, want)
			}
		})
	}
}

// padding is a query the server ignores that makes a request large
// enough for the diagnostic of its answer: over plain UDP no answer is
// larger than its request.
var padding = "pad=" + strings.Repeat("x", maxDiagnosticLen)

func TestRefusals(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true})
	cc := dial(t, s)

	cases := []struct {
		name    string
		code    codes.Code
		path    string
		queries []string
		want    codes.Code
		diag    string
	}{
		{"space in device", codes.POST, "/hb", []string{"d=bad id"}, codes.BadRequest, "invalid device id"},
		{"percent in device", codes.POST, "/hb", []string{"d=bad%20id"}, codes.BadRequest, "invalid device id"},
		{"129-byte device", codes.POST, "/hb", []string{"d=" + strings.Repeat("a", 129)}, codes.BadRequest, "129 bytes"},
		{"empty device", codes.POST, "/hb", []string{"d="}, codes.BadRequest, "empty"},
		{"no device", codes.POST, "/hb", []string{"s=radio2"}, codes.BadRequest, "d=<device> required"},
		{"device twice", codes.POST, "/hb", []string{"d=a", "d=b"}, codes.BadRequest, "twice"},
		{"bad instance", codes.POST, "/hb", []string{"d=dev-1", "s=a/b"}, codes.BadRequest, "invalid session id"},
		{"empty instance", codes.DELETE, "/hb", []string{"d=dev-1", "s="}, codes.BadRequest, "invalid session id"},
		{"unknown path", codes.POST, "/heartbeat", []string{"d=dev-1"}, codes.NotFound, "/hb"},
		{"sub path", codes.POST, "/hb/x", []string{"d=dev-1"}, codes.NotFound, "/hb"},
		{"root", codes.POST, "/", []string{"d=dev-1"}, codes.NotFound, "/hb"},
		{"GET", codes.GET, "/hb", []string{"d=dev-1"}, codes.MethodNotAllowed, "POST and DELETE"},
		{"PUT", codes.PUT, "/hb", []string{"d=dev-1"}, codes.MethodNotAllowed, "POST and DELETE"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r := request(t, cc, message.Confirmable, tc.code, tc.path, append(tc.queries, padding)...)
			if r.code != tc.want || !strings.Contains(r.payload, tc.diag) {
				t.Fatalf("reply %v %q, want %v with %q", r.code, r.payload, tc.want, tc.diag)
			}
			if len(r.payload) > maxDiagnosticLen {
				t.Fatalf("diagnostic of %d bytes", len(r.payload))
			}
		})
	}
	if evs := rec.Evidence(); len(evs) != 0 {
		t.Fatalf("refused requests made evidence: %+v", evs)
	}
	if got := gather(t, s.metrics.requests)[`fleetgate_coap_requests_total{code="4.00"}`]; got != 8 {
		t.Fatalf("4.00 counted %v times, want 8", got)
	}
}

func TestAnonymousOff(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: false})
	cc := dial(t, s)
	for _, code := range []codes.Code{codes.POST, codes.DELETE} {
		r := request(t, cc, message.Confirmable, code, "/hb", "d=dev-1")
		if r.code != codes.Unauthorized {
			t.Fatalf("%v without credentials: %v %q, want 4.01", code, r.code, r.payload)
		}
	}
	if evs := rec.Evidence(); len(evs) != 0 {
		t.Fatalf("unauthenticated requests made evidence: %+v", evs)
	}
}

func TestObserverErrors(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true})
	cc := dial(t, s)
	cases := []struct {
		err    error
		code   codes.Code
		maxAge int64
		diag   string
	}{
		{fmt.Errorf("table: %w", gateway.ErrOverloaded), codes.ServiceUnavailable, retryAfterSeconds, "overloaded"},
		{fmt.Errorf("table: %w", gateway.ErrInvalidSessionID), codes.BadRequest, -1, "invalid session id"},
		{errors.New("secret detail"), codes.InternalServerError, -1, "internal error"},
	}
	for _, tc := range cases {
		rec.SetErr(tc.err)
		r := request(t, cc, message.Confirmable, codes.POST, "/hb", "d=dev-1", padding)
		if r.code != tc.code || r.maxAge != tc.maxAge || r.payload != diagnostic(r.payload) || !strings.Contains(r.payload, tc.diag) {
			t.Fatalf("observer error %v: reply %v Max-Age %d %q, want %v Max-Age %d with %q",
				tc.err, r.code, r.maxAge, r.payload, tc.code, tc.maxAge, tc.diag)
		}
		if strings.Contains(r.payload, "secret") {
			t.Fatalf("internal error detail leaked to the device: %q", r.payload)
		}
	}
}

// backpressureObserver blocks like an uplink with a full queue: until
// its context is done, then refuses with ErrOverloaded.
type backpressureObserver struct{}

func (backpressureObserver) Observe(ctx context.Context, _ gateway.Evidence) error {
	<-ctx.Done()
	return fmt.Errorf("uplink: enqueue: %w: %w", gateway.ErrOverloaded, ctx.Err())
}

func TestObserverBackpressureBounded(t *testing.T) {
	s := startServer(t, backpressureObserver{}, Options{AllowAnonymous: true})
	cc := dial(t, s)
	begin := time.Now()
	r := request(t, cc, message.Confirmable, codes.POST, "/hb", "d=dev-1")
	if r.code != codes.ServiceUnavailable || r.maxAge != retryAfterSeconds {
		t.Fatalf("reply %v Max-Age %d, want 5.03 Max-Age %d", r.code, r.maxAge, retryAfterSeconds)
	}
	if took := time.Since(begin); took < observeTimeout || took > observeTimeout+3*time.Second {
		t.Fatalf("answered after %v, want about %v", took, observeTimeout)
	}
}

func TestNonConfirmable(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true, HeartbeatInterval: 1500 * time.Millisecond})
	cc := dial(t, s)
	r := request(t, cc, message.NonConfirmable, codes.POST, "/hb", "d=dev-non")
	if r.code != codes.Changed || r.typ != message.NonConfirmable || r.maxAge != 2 {
		t.Fatalf("NON heartbeat: %v type %v Max-Age %d, want 2.04 NON Max-Age 2", r.code, r.typ, r.maxAge)
	}
	r = request(t, cc, message.NonConfirmable, codes.POST, "/nope", "d=dev-non")
	if r.code != codes.NotFound || r.typ != message.NonConfirmable {
		t.Fatalf("NON to unknown path: %v type %v, want 4.04 NON", r.code, r.typ)
	}
	if evs := rec.Evidence(); len(evs) != 1 || evs[0].Device != "dev-non" {
		t.Fatalf("evidence %+v", evs)
	}
}

func TestWireFormat(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true})
	c := rawConn(t, s)

	// CON: the answer is piggybacked on the ACK, same MID and token.
	b, ok := exchange(t, c, datagram(t, message.Confirmable, codes.POST, 0x1234, "/hb", "d=dev-1"), 5*time.Second)
	if !ok {
		t.Fatal("no answer to a CON heartbeat")
	}
	m := decode(t, b)
	if m.Type() != message.Acknowledgement || m.MessageID() != 0x1234 || m.Code() != codes.Changed ||
		string(m.Token()) != string(message.Token{0xf1, 0xee, 0x12, 0x34}) {
		t.Fatalf("answer %v", m)
	}

	// NON: a NON answer with the request's token.
	b, ok = exchange(t, c, datagram(t, message.NonConfirmable, codes.DELETE, 0x1235, "/hb", "d=dev-1"), 5*time.Second)
	if !ok {
		t.Fatal("no answer to a NON leave")
	}
	m = decode(t, b)
	if m.Type() != message.NonConfirmable || m.Code() != codes.Changed ||
		string(m.Token()) != string(message.Token{0xf1, 0xee, 0x12, 0x35}) {
		t.Fatalf("answer %v", m)
	}

	// A CON retransmission (its ACK was lost) is answered again:
	// heartbeats are idempotent, so no response cache is kept. Like a
	// device, the test retransmits until acknowledged; a copy that
	// arrives while the first is still being handled is dropped.
	con := datagram(t, message.Confirmable, codes.POST, 0x2000, "/hb", "d=dev-1")
	if b, ok = exchange(t, c, con, 5*time.Second); !ok {
		t.Fatal("no answer to a CON heartbeat")
	}
	for try := 0; ; try++ {
		if try == 20 {
			t.Fatal("retransmitted CON never acknowledged")
		}
		if b, ok = exchange(t, c, con, 250*time.Millisecond); ok {
			break
		}
	}
	if m = decode(t, b); m.MessageID() != 0x2000 || m.Code() != codes.Changed {
		t.Fatalf("answer to the retransmission: %v", m)
	}
	if n := len(rec.Evidence()); n != 4 {
		t.Fatalf("%d pieces of evidence, want 4 (the retransmission is evidence too)", n)
	}

	// No-Response (RFC 7967) for 2.xx: a CON still gets an empty ACK.
	req := datagram(t, message.Confirmable, codes.POST, 0x2001, "/hb", "d=dev-1")
	m = decode(t, req)
	m.SetOptionUint32(message.NoResponse, 2)
	req, err := m.MarshalWithEncoder(coder.DefaultCoder)
	if err != nil {
		t.Fatal(err)
	}
	b, ok = exchange(t, c, req, 5*time.Second)
	if !ok {
		t.Fatal("no ACK for a CON with No-Response")
	}
	if m = decode(t, b); m.Type() != message.Acknowledgement || m.Code() != codes.Empty || m.MessageID() != 0x2001 {
		t.Fatalf("answer %v, want an empty ACK", m)
	}
}

func TestManyConcurrentClients(t *testing.T) {
	rec := &recorder{}
	s := startServer(t, rec, Options{AllowAnonymous: true})
	const clients, beats = 40, 10
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for i := range clients {
		cc := dial(t, s)
		wg.Add(1)
		go func() {
			defer wg.Done()
			typ := message.Confirmable
			if i%2 == 1 {
				typ = message.NonConfirmable
			}
			for range beats {
				ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
				req := cc.AcquireMessage(ctx)
				token, _ := cc.GetToken()
				req.SetCode(codes.POST)
				req.SetType(typ)
				req.SetToken(token)
				_ = req.SetPath("/hb")
				req.AddQuery(fmt.Sprintf("d=dev-%d", i))
				resp, err := cc.Do(req)
				cc.ReleaseMessage(req)
				cancel()
				if err != nil {
					errs <- fmt.Errorf("client %d: %w", i, err)
					return
				}
				code := resp.Code()
				cc.ReleaseMessage(resp)
				if code != codes.Changed {
					errs <- fmt.Errorf("client %d: %v", i, code)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	perDevice := map[gateway.DeviceID]int{}
	for _, ev := range rec.Evidence() {
		perDevice[ev.Device]++
	}
	for i := range clients {
		if n := perDevice[gateway.DeviceID(fmt.Sprintf("dev-%d", i))]; n != beats {
			t.Errorf("dev-%d: %d pieces of evidence, want %d", i, n, beats)
		}
	}
}

func TestSetTiming(t *testing.T) {
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true, HeartbeatInterval: 30 * time.Second})
	cc := dial(t, s)
	s.SetTiming(gateway.Timing{Lease: 90 * time.Second, HeartbeatInterval: 45*time.Second + time.Millisecond})
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb", "d=dev-1"); r.maxAge != 46 {
		t.Fatalf("Max-Age %d after reload, want 46", r.maxAge)
	}
	s.SetTiming(gateway.Timing{Lease: 90 * time.Second})
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb", "d=dev-1"); r.maxAge != 46 {
		t.Fatalf("Max-Age %d after a refused reload, want 46", r.maxAge)
	}
}

// TestLeaseAsked: a device asks for a lease per request (l=<seconds>); it
// is granted within [lease, max_lease], carried in the evidence, and
// answered with the Max-Age that fits it: the granted lease minus (lease
// − heartbeat_interval). A reload changes the bounds of later requests.
func TestLeaseAsked(t *testing.T) {
	const s = time.Second
	rec := &recorder{}
	srv := startServer(t, rec, Options{AllowAnonymous: true, HeartbeatInterval: 30 * s, Lease: 90 * s, MaxLease: time.Hour})
	cc := dial(t, srv)
	for _, tc := range []struct {
		query  string
		lease  time.Duration // in the evidence (0: presence.lease)
		maxAge int64
	}{
		{"d=dev-1", 0, 30},
		{"d=dev-1&l=600", 600 * s, 540},
		{"d=dev-1&l=7200", time.Hour, 3540},
		{"d=dev-1&l=10", 90 * s, 30},
		{"d=dev-1&l=3600&s=radio", time.Hour, 3540},
	} {
		rec.Take()
		r := request(t, cc, message.Confirmable, codes.POST, "/hb", strings.Split(tc.query, "&")...)
		evs := rec.Take()
		if r.code != codes.Changed || r.maxAge != tc.maxAge || len(evs) != 1 || evs[0].Lease != tc.lease {
			t.Errorf("%s: %v Max-Age %d, evidence %+v; want 2.04 Max-Age %d and lease %v", tc.query, r.code, r.maxAge, evs, tc.maxAge, tc.lease)
		}
	}
	if r := request(t, cc, message.Confirmable, codes.POST, "/hb", "d=dev-1", "l=soon"); r.code != codes.BadRequest {
		t.Errorf("l=soon: %v, want 4.00", r.code)
	}
	// max_lease 0 (off): no lease longer than presence.lease.
	srv.SetTiming(gateway.Timing{Lease: 60 * s, HeartbeatInterval: 20 * s})
	rec.Take()
	r := request(t, cc, message.Confirmable, codes.POST, "/hb", "d=dev-1", "l=600")
	if evs := rec.Take(); r.maxAge != 20 || len(evs) != 1 || evs[0].Lease != 60*s {
		t.Errorf("l=600 with max_lease off: Max-Age %d, evidence %+v; want 20 and lease 60s", r.maxAge, evs)
	}
}

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true, Registerer: reg})
	// A second server on the same registry shares the collectors.
	startServer(t, &recorder{}, Options{AllowAnonymous: true, Registerer: reg})
	cc := dial(t, s)
	request(t, cc, message.Confirmable, codes.POST, "/hb", "d=dev-1")
	request(t, cc, message.Confirmable, codes.POST, "/hb", "d=dev-1")
	request(t, cc, message.Confirmable, codes.DELETE, "/hb", "d=dev-1")
	request(t, cc, message.Confirmable, codes.GET, "/hb", "d=dev-1")

	got := gather(t, reg)
	want := map[string]float64{
		`fleetgate_coap_requests_total{code="2.04"}`:             3,
		`fleetgate_coap_requests_total{code="4.05"}`:             1,
		`fleetgate_coap_requests_total{code="4.00"}`:             0,
		`fleetgate_evidence_total{kind="renew",protocol="coap"}`: 2,
		`fleetgate_evidence_total{kind="leave",protocol="coap"}`: 1,
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}

// gather collects g's counters and gauges as "name{label="value",...}" → value,
// labels sorted by name.
func gather(t testing.TB, c prometheus.Collector) map[string]float64 {
	t.Helper()
	reg, ok := c.(prometheus.Gatherer)
	if !ok {
		r := prometheus.NewPedanticRegistry()
		r.MustRegister(c)
		reg = r
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	out := map[string]float64{}
	for _, f := range families {
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetCounter().GetValue()
			if m.Gauge != nil {
				v = m.GetGauge().GetValue()
			}
			out[f.GetName()+"{"+strings.Join(labels, ",")+"}"] = v
		}
	}
	return out
}

func TestNewRefusesBadOptions(t *testing.T) {
	if _, err := New(&recorder{}, Options{Addr: "127.0.0.1:0"}); err == nil {
		t.Fatal("New accepted a zero heartbeat interval")
	}
	if _, err := New(nil, Options{Addr: "127.0.0.1:0", HeartbeatInterval: time.Second}); err == nil {
		t.Fatal("New accepted a nil observer")
	}
	if _, err := New(&recorder{}, Options{Addr: "256.0.0.1:0", HeartbeatInterval: time.Second}); err == nil {
		t.Fatal("New accepted a bad address")
	}
	if _, err := New(&recorder{}, Options{HeartbeatInterval: time.Second}); err == nil {
		t.Fatal("New accepted no address")
	}
	if _, err := New(&recorder{}, Options{DTLS: "127.0.0.1:0", HeartbeatInterval: time.Second}); err == nil {
		t.Fatal("New accepted DTLS without credentials")
	}
	if _, err := New(&recorder{}, Options{Addr: "127.0.0.1:0", HeartbeatInterval: time.Second, RequestsPerSecond: -1}); err == nil {
		t.Fatal("New accepted a negative rate")
	}
}

// blockingObserver holds every Observe until release is closed.
type blockingObserver struct {
	entered chan struct{}
	release chan struct{}
	mu      sync.Mutex
	calls   int
}

func (b *blockingObserver) Observe(ctx context.Context, _ gateway.Evidence) error {
	b.mu.Lock()
	b.calls++
	b.mu.Unlock()
	b.entered <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
	}
	return nil
}

func TestServeEndsWithContext(t *testing.T) {
	obs := &blockingObserver{entered: make(chan struct{}, 1), release: make(chan struct{})}
	s, err := New(obs, Options{Addr: "127.0.0.1:0", AllowAnonymous: true, HeartbeatInterval: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	go func() { served <- s.Serve(ctx) }()

	c := rawConn(t, s)
	if _, err := c.Write(datagram(t, message.Confirmable, codes.POST, 1, "/hb", "d=dev-1")); err != nil {
		t.Fatal(err)
	}
	select {
	case <-obs.entered:
	case <-time.After(5 * time.Second):
		t.Fatal("observer never called")
	}
	// The handler is inside Observe: cancelling Serve's context cancels
	// the request's, and Serve returns only after the handler has.
	cancel()
	select {
	case err := <-served:
		if err != nil {
			t.Fatalf("Serve: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after its context was cancelled")
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if _, err := c.Write(datagram(t, message.Confirmable, codes.POST, 2, "/hb", "d=dev-1")); err != nil {
		t.Fatal(err)
	}
	// A closed socket is refused by the kernel; a read error or silence
	// are both fine, an answer is not.
	if err := c.SetReadDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	if n, err := c.Read(make([]byte, 64)); err == nil {
		t.Fatalf("closed server answered %d bytes", n)
	}
	obs.mu.Lock()
	defer obs.mu.Unlock()
	if obs.calls != 1 {
		t.Fatalf("observer called %d times, want 1", obs.calls)
	}
}

func TestNoPerPeerState(t *testing.T) {
	s := startServer(t, &recorder{}, Options{AllowAnonymous: true})
	c := rawConn(t, s)
	if _, ok := exchange(t, c, datagram(t, message.NonConfirmable, codes.POST, 1, "/hb", "d=dev-1"), 5*time.Second); !ok {
		t.Fatal("no answer")
	}
	before := runtime.NumGoroutine()
	const peers = 200
	for i := range peers {
		c := rawConn(t, s)
		if _, ok := exchange(t, c, datagram(t, message.Confirmable, codes.POST, uint16(i), "/hb", "d=dev-1"), 5*time.Second); !ok {
			t.Fatalf("peer %d: no answer", i)
		}
	}
	if n := runtime.NumGoroutine(); n > before+2 {
		t.Fatalf("%d goroutines after %d peers, %d before", n, peers, before)
	}
	if n := s.unproven.addrs.Len(); n != 1 {
		t.Fatalf("rate limiter tracks %d sources, want 1 (127.0.0.1)", n)
	}
}
