package bridge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"
	mqtt3 "github.com/eclipse/paho.mqtt.golang"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/ctxsleep"
)

// outgoing is one message to publish upstream.
type outgoing struct {
	topic       string
	qos         byte
	payload     []byte
	contentType string
	props       []gateway.Property
}

// inbound is one message the upstream broker delivered on the commands
// subscription. ack acknowledges it to the broker (PUBACK); until then
// the broker holds it in the bridge's session and delivers it again
// after a reconnect.
type inbound struct {
	topic       string
	payload     []byte
	contentType string
	props       []gateway.Property
	qos         byte
	ack         func()
}

// refusedError is the broker's refusal of one message: a reason code of
// 0x80 or more, or a message this connection cannot carry (larger than
// the broker's maximum packet size). Sending it again may only pass if
// the broker changed its mind.
type refusedError struct{ why string }

func (e *refusedError) Error() string { return "refused: " + e.why }

// upstream is the connection to the upstream broker: MQTT 5 with
// paho.golang's autopaho, or 3.1.1 with paho.mqtt.golang. Both keep
// reconnecting until the context they were dialled with ends.
type upstream interface {
	// publish sends o once and returns nil after its PUBACK (QoS 1) or
	// once written (QoS 0), a *refusedError, or another error: the
	// connection failed, was lost while o waited for its PUBACK, or the
	// PUBACK took longer than publishTimeout, and o is to be sent again
	// once connected.
	publish(o *outgoing) error
	// awaitConnection returns once connected (nil) or when ctx or the
	// upstream's context ends.
	awaitConnection(ctx context.Context) error
	// close disconnects, waiting at most until ctx ends, once the
	// upstream's context has ended.
	close(ctx context.Context)
}

// linkConfig is what both connections are made from.
type linkConfig struct {
	url            *url.URL // scheme "mqtt" or "tls"
	clientID       string
	username       string
	password       string
	tls            *tls.Config
	connectTimeout time.Duration
	// down is the commands subscription's filter, "" for none; with one
	// the session is kept by the broker (sessionExpiry) across
	// reconnects and restarts, so that commands it took while the bridge
	// was away, or delivered but not yet acknowledged, are delivered.
	down          string
	sessionExpiry uint32
	log           *slog.Logger
	onUp          func()
	onDown        func()
	onSubscribed  func()
	onCommand     func(inbound)
}

// connState tracks whether the connection is up and cancels what waits
// on a connection that was lost: neither client reports a PUBACK that
// will never come on a clean session (paho.golang drops the waiter,
// paho.mqtt.golang keeps its token open), so every publish waits on the
// context of the connection it was sent on, which the upstream's context
// (the bridge's) also ends. The lane then sends the message again; in the
// session kept for the commands (Down) the client also sends it again
// itself after reconnecting, so it may come twice, never out of order
// (the lane sends nothing newer before its PUBACK).
type connState struct {
	base   context.Context
	mu     sync.Mutex
	up     chan struct{} // closed while connected
	ctx    context.Context
	cancel context.CancelFunc
}

func newConnState(base context.Context) *connState {
	ctx, cancel := context.WithCancel(base)
	cancel()
	return &connState{base: base, up: make(chan struct{}), ctx: ctx, cancel: cancel}
}

// connected starts a new connection's context, wakes its waiters and
// returns the context.
func (s *connState) connected() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancel()
	s.ctx, s.cancel = context.WithCancel(s.base)
	select {
	case <-s.up:
	default:
		close(s.up)
	}
	return s.ctx
}

// lost cancels what waits on the connection.
func (s *connState) lost() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cancel()
	select {
	case <-s.up:
		s.up = make(chan struct{})
	default:
	}
}

// current returns the context of the connection up now (cancelled when
// there is none).
func (s *connState) current() context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctx
}

func (s *connState) await(ctx context.Context) error {
	s.mu.Lock()
	up := s.up
	s.mu.Unlock()
	select {
	case <-up:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-s.base.Done():
		return s.base.Err()
	}
}

// publishTimeout bounds the wait for one PUBACK (and SUBACK) on a
// connection that is up: a broker that holds it longer gets the message
// again.
const publishTimeout = 10 * time.Second

// mqtt5 is the MQTT 5 connection (autopaho).
type mqtt5 struct {
	cfg       linkConfig
	state     *connState
	cm        *autopaho.ConnectionManager
	maxPacket atomic.Uint32 // the broker's maximum packet size, 0 for none
}

func dial5(ctx context.Context, cfg linkConfig) (*mqtt5, error) {
	u := &mqtt5{cfg: cfg, state: newConnState(ctx)}
	redacted := cfg.url.Redacted()
	ac := autopaho.ClientConfig{
		ServerUrls: []*url.URL{cfg.url},
		AttemptConnection: func(ctx context.Context, _ autopaho.ClientConfig, u *url.URL) (net.Conn, error) {
			return dialPacketConn(ctx, u, cfg.tls, cfg.connectTimeout)
		},
		KeepAlive:                     30,
		CleanStartOnInitialConnection: cfg.down == "",
		SessionExpiryInterval:         cfg.sessionExpiry,
		ReconnectBackoff:              autopaho.NewExponentialBackoff(100*time.Millisecond, 5*time.Second, 500*time.Millisecond, 2),
		ConnectTimeout:                cfg.connectTimeout,
		ConnectUsername:               cfg.username,
		ConnectPassword:               []byte(cfg.password),
		OnConnectionUp: func(cm *autopaho.ConnectionManager, ca *paho.Connack) {
			var maxPacket uint32
			if ca.Properties != nil && ca.Properties.MaximumPacketSize != nil {
				maxPacket = *ca.Properties.MaximumPacketSize
			}
			u.maxPacket.Store(maxPacket)
			cfg.log.Info("connected to the upstream broker", "url", redacted, "session_present", ca.SessionPresent)
			ctx := u.state.connected()
			cfg.onUp()
			if cfg.down != "" {
				// every connection subscribes: the broker may have lost
				// the session (restarted from an older save)
				go u.subscribe(ctx, cm)
			}
		},
		OnConnectionDown: func() bool {
			u.state.lost()
			cfg.onDown()
			cfg.log.Warn("upstream connection lost; reconnecting", "url", redacted)
			return true
		},
		OnConnectError: func(err error) {
			cfg.log.Warn("upstream connection failed", "url", redacted, "err", err)
		},
		ClientConfig: paho.ClientConfig{
			ClientID:                   cfg.clientID,
			PacketTimeout:              publishTimeout,
			EnableManualAcknowledgment: cfg.down != "",
		},
	}
	if cfg.down != "" {
		ac.OnPublishReceived = []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			p, cli := pr.Packet, pr.Client
			in := inbound{topic: p.Topic, payload: p.Payload, qos: p.QoS, ack: func() {
				if err := cli.Ack(p); err != nil {
					cfg.log.Warn("acknowledge a command upstream", "topic", p.Topic, "err", err)
				}
			}}
			if p.Properties != nil {
				in.contentType = p.Properties.ContentType
				for _, up := range p.Properties.User {
					in.props = append(in.props, gateway.Property{Key: up.Key, Value: up.Value})
				}
			}
			cfg.onCommand(in)
			return true, nil
		}}
	}
	cm, err := autopaho.NewConnection(context.WithoutCancel(ctx), ac)
	if err != nil {
		return nil, err
	}
	u.cm = cm
	return u, nil
}

// subscribe subscribes the commands filter at QoS 1, trying again while
// the connection is up.
func (u *mqtt5) subscribe(ctx context.Context, cm *autopaho.ConnectionManager) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		sa, err := cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: u.cfg.down, QoS: 1}}})
		if err == nil && len(sa.Reasons) == 1 && sa.Reasons[0] < 0x80 {
			u.cfg.onSubscribed()
			return
		}
		if err == nil {
			err = fmt.Errorf("suback reason codes %v", sa.Reasons)
		}
		u.cfg.log.Warn("subscribe to commands upstream", "filter", u.cfg.down, "attempt", attempt+1, "err", err)
		if !ctxsleep.Sleep(ctx, time.Duration(min(attempt+1, 10))*time.Second) {
			return
		}
	}
}

func (u *mqtt5) awaitConnection(ctx context.Context) error { return u.state.await(ctx) }

func (u *mqtt5) publish(o *outgoing) error {
	pub := &paho.Publish{Topic: o.topic, QoS: o.qos, Payload: o.payload}
	if o.contentType != "" || len(o.props) > 0 {
		pub.Properties = &paho.PublishProperties{ContentType: o.contentType}
		for _, p := range o.props {
			pub.Properties.User = append(pub.Properties.User, paho.UserProperty{Key: p.Key, Value: p.Value})
		}
	}
	if limit := u.maxPacket.Load(); limit > 0 {
		if size, _ := pub.Packet().WriteTo(io.Discard); size > int64(limit) {
			return &refusedError{fmt.Sprintf("%d bytes, more than the broker's maximum packet size %d", size, limit)}
		}
	}
	resp, err := u.cm.Publish(u.state.current(), pub) // PacketTimeout bounds its wait
	switch {
	case resp != nil && resp.ReasonCode >= 0x80:
		why := fmt.Sprintf("reason code 0x%02x", resp.ReasonCode)
		if resp.Properties != nil && resp.Properties.ReasonString != "" {
			why += " (" + resp.Properties.ReasonString + ")"
		}
		return &refusedError{why}
	case errors.Is(err, paho.ErrInvalidArguments):
		return &refusedError{err.Error()}
	}
	return err
}

func (u *mqtt5) close(ctx context.Context) { _ = u.cm.Disconnect(ctx) }

// mqtt311 is the MQTT 3.1.1 connection (paho.mqtt.golang). MQTT 3.1.1
// has no reason codes, content type or user properties: a broker cannot
// refuse a message (mosquitto acknowledges one its ACL denies and drops
// it), and the properties are not sent.
type mqtt311 struct {
	cfg   linkConfig
	state *connState
	c     mqtt3.Client
}

func dial311(ctx context.Context, cfg linkConfig) *mqtt311 {
	u := &mqtt311{cfg: cfg, state: newConnState(ctx)}
	redacted := cfg.url.Redacted()
	o := mqtt3.NewClientOptions().
		AddBroker(cfg.url.String()).
		SetClientID(cfg.clientID).
		SetUsername(cfg.username).
		SetPassword(cfg.password).
		SetProtocolVersion(4).
		SetKeepAlive(30 * time.Second).
		SetConnectTimeout(cfg.connectTimeout).
		SetAutoReconnect(true).
		SetConnectRetry(true).
		SetConnectRetryInterval(time.Second).
		SetMaxReconnectInterval(5 * time.Second).
		SetCleanSession(cfg.down == "").
		SetResumeSubs(false).
		SetAutoAckDisabled(cfg.down != "").
		SetOnConnectHandler(func(c mqtt3.Client) {
			cfg.log.Info("connected to the upstream broker", "url", redacted)
			ctx := u.state.connected()
			cfg.onUp()
			if cfg.down != "" {
				go u.subscribe(ctx, c)
			}
		}).
		SetConnectionLostHandler(func(_ mqtt3.Client, err error) {
			u.state.lost()
			cfg.onDown()
			cfg.log.Warn("upstream connection lost; reconnecting", "url", redacted, "err", err)
		})
	if cfg.tls != nil {
		o.SetTLSConfig(cfg.tls)
	}
	if cfg.down != "" {
		o.SetDefaultPublishHandler(func(_ mqtt3.Client, m mqtt3.Message) {
			cfg.onCommand(inbound{topic: m.Topic(), payload: m.Payload(), qos: m.Qos(), ack: m.Ack})
		})
	}
	u.c = mqtt3.NewClient(o)
	u.c.Connect() // with SetConnectRetry it keeps trying in the background
	return u
}

func (u *mqtt311) subscribe(ctx context.Context, c mqtt3.Client) {
	for attempt := 0; ctx.Err() == nil; attempt++ {
		tok := c.Subscribe(u.cfg.down, 1, nil)
		err := waitToken(ctx, tok)
		if err == nil {
			st := tok.(*mqtt3.SubscribeToken)
			if qos := st.Result()[u.cfg.down]; qos <= 1 {
				u.cfg.onSubscribed()
				return
			}
			err = errors.New("the broker refused the subscription (0x80)")
		}
		u.cfg.log.Warn("subscribe to commands upstream", "filter", u.cfg.down, "attempt", attempt+1, "err", err)
		if !ctxsleep.Sleep(ctx, time.Duration(min(attempt+1, 10))*time.Second) {
			return
		}
	}
}

func (u *mqtt311) awaitConnection(ctx context.Context) error { return u.state.await(ctx) }

func (u *mqtt311) publish(o *outgoing) error {
	return waitToken(u.state.current(), u.c.Publish(o.topic, o.qos, false, o.payload))
}

// waitToken waits for tok, at most publishTimeout or until ctx ends.
func waitToken(ctx context.Context, tok mqtt3.Token) error {
	t := time.NewTimer(publishTimeout)
	defer t.Stop()
	select {
	case <-tok.Done():
		return tok.Error()
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return errors.New("no acknowledgement within " + publishTimeout.String())
	}
}

func (u *mqtt311) close(ctx context.Context) {
	quiesce := uint(250)
	if d, ok := ctx.Deadline(); ok {
		quiesce = uint(max(0, min(time.Until(d), time.Second)) / time.Millisecond)
	}
	u.c.Disconnect(quiesce)
}
