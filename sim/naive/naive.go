// Package naive is the design fleetgate is measured against, for the
// benchmarks only (nothing in the shipped binary imports it): a CoAP
// server that answers each heartbeat after one SET <device> EX <lease>
// on Redis, and takes offline from Redis keyspace notifications of
// expired keys. Its events are kept in memory, in the shape sim/check
// reads, so the same fleet and checker judge both designs.
package naive

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"time"

	"github.com/plgd-dev/go-coap/v3/message"
	"github.com/plgd-dev/go-coap/v3/message/codes"
	"github.com/plgd-dev/go-coap/v3/message/pool"
	"github.com/plgd-dev/go-coap/v3/udp/coder"
	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/sim"
	"github.com/fleetgate/fleetgate/sim/check"
)

// Peer is one naive gateway.
type Peer struct {
	rc     *redis.Client
	lease  time.Duration
	prefix string
	pc     net.PacketConn
	wg     sync.WaitGroup

	mu     sync.Mutex
	events []check.Event
	vers   map[string]uint64
	sub    *redis.PubSub
	subWG  sync.WaitGroup
}

var _ sim.Source = (*Peer)(nil)

// Start listens for CoAP on a free loopback port, turns keyspace
// notifications of expired keys on (CONFIG SET notify-keyspace-events
// Ex) and subscribes to them.
func Start(ctx context.Context, rc *redis.Client, lease time.Duration) (*Peer, error) {
	if err := rc.ConfigSet(ctx, "notify-keyspace-events", "Ex").Err(); err != nil {
		return nil, fmt.Errorf("naive: config set: %w", err)
	}
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("naive: listen: %w", err)
	}
	p := &Peer{rc: rc, lease: lease, prefix: "naive:", pc: pc, vers: map[string]uint64{}}
	p.subscribe(ctx)
	p.wg.Add(1)
	go func() { defer p.wg.Done(); p.serve() }()
	return p, nil
}

// Addr is the peer's CoAP address.
func (p *Peer) Addr() string { return p.pc.LocalAddr().String() }

func (p *Peer) subscribe(ctx context.Context) {
	sub := p.rc.Subscribe(ctx, "__keyevent@0__:expired")
	p.mu.Lock()
	p.sub = sub
	p.mu.Unlock()
	p.subWG.Add(1)
	go func() {
		defer p.subWG.Done()
		for m := range sub.Channel() {
			if dev, ok := strings.CutPrefix(m.Payload, p.prefix); ok {
				p.emit(dev, "offline", "expired")
			}
		}
	}()
}

// Cut drops the notification subscriber for d, as a network blip or a
// restarted consumer does: the expirations it would have heard are
// lost, which is what the design cannot help.
func (p *Peer) Cut(ctx context.Context, d time.Duration) {
	p.mu.Lock()
	sub := p.sub
	p.mu.Unlock()
	sub.Close()
	p.subWG.Wait()
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	p.subscribe(context.Background())
}

func (p *Peer) emit(dev, state, reason string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.vers[dev]++
	p.events = append(p.events, check.Event{Device: dev, State: state, Ver: p.vers[dev], At: time.Now(), Reason: reason})
}

// serve answers heartbeats: POST is SET key 1 EX lease GET (online when
// the key was absent), DELETE is DEL (offline when it was there).
func (p *Peer) serve() {
	buf := make([]byte, 1500)
	ctx := context.Background()
	for {
		n, from, err := p.pc.ReadFrom(buf)
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		req := pool.NewMessage(ctx)
		if _, err := req.UnmarshalWithDecoder(coder.DefaultCoder, buf[:n]); err != nil {
			continue
		}
		q, _ := req.Queries()
		dev := ""
		for _, kv := range q {
			if v, ok := strings.CutPrefix(kv, "d="); ok {
				dev = v
			}
		}
		code := codes.Changed
		switch req.Code() {
		case codes.POST:
			err := p.rc.SetArgs(ctx, p.prefix+dev, "1", redis.SetArgs{TTL: p.lease, Get: true}).Err()
			switch {
			case errors.Is(err, redis.Nil):
				p.emit(dev, "online", "connect")
			case err != nil:
				code = codes.ServiceUnavailable
			}
		case codes.DELETE:
			n, err := p.rc.Del(ctx, p.prefix+dev).Result()
			if err != nil {
				code = codes.ServiceUnavailable
			} else if n == 1 {
				p.emit(dev, "offline", "leave")
			}
		default:
			code = codes.MethodNotAllowed
		}
		resp := pool.NewMessage(ctx)
		resp.SetCode(code)
		if req.Type() == message.Confirmable {
			resp.SetType(message.Acknowledgement)
		} else {
			resp.SetType(message.NonConfirmable)
		}
		resp.SetMessageID(req.MessageID())
		resp.SetToken(req.Token())
		if out, err := resp.MarshalWithEncoder(coder.DefaultCoder); err == nil {
			_, _ = p.pc.WriteTo(out, from)
		}
	}
}

// Events returns the events emitted at or after since.
func (p *Peer) Events(_ context.Context, since time.Time) ([]check.Event, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []check.Event
	for _, e := range p.events {
		if !e.At.Before(since) {
			out = append(out, e)
		}
	}
	return out, nil
}

// Counters reads INFO commandstats and cpu of the peer's Redis.
func (p *Peer) Counters(ctx context.Context) (sim.Counters, bool, error) {
	info, err := p.rc.Info(ctx, "commandstats", "cpu").Result()
	if err != nil {
		return sim.Counters{}, false, err
	}
	return sim.ParseInfo(info), true, nil
}

// Close stops the server and the subscriber; the client stays open.
func (p *Peer) Close() error {
	p.pc.Close()
	p.wg.Wait()
	p.mu.Lock()
	sub := p.sub
	p.mu.Unlock()
	err := sub.Close()
	p.subWG.Wait()
	return err
}
