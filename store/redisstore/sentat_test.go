package redisstore

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// beforeSend runs fn (once) after a call's arguments are built and before
// it is sent: the call's process was starved in between.
type beforeSend struct{ fn func() }

var _ redis.Hook = (*beforeSend)(nil)

func (h *beforeSend) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *beforeSend) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}
func (h *beforeSend) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if fn := h.fn; fn != nil {
			h.fn = nil
			fn()
		}
		return next(ctx, cmd)
	}
}

// movers returns a function that opens, on the real clock, a store of
// one shard for a gateway with its own client, every one under the same
// prefix, with the gateway grace, silence and horizon: two gateways a
// device moves between.
func movers(t *testing.T) func(c *redis.Client) *env {
	prefix := uniquePrefix()
	return func(c *redis.Client) *env {
		s, err := Open(t.Context(), c, Options{Prefix: prefix, Shards: 1,
			GatewayGrace: testGrace, GatewaySilence: testSilence, GatewayLost: testLease,
			GatewayHorizon: testLease + testGrace})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { s.Close() })
		return &env{t: t, ctx: t.Context(), c: c, store: s}
	}
}

// A device moves make-before-break from gw-b to gw-a: gw-a observes its
// connect, then gw-b its goodbye. gw-a's call carrying the connect leaves
// late (its process starved after the call was built), after gw-b's
// goodbye and a keep-alive that covers it are applied. The connect's age
// counts from when gw-a sent the call, not from when the store ran it: it
// was observed before the goodbye, so the move bridges it, with no event.
func TestStarvedCallDatesItsEvidenceWhenSent(t *testing.T) {
	srv := redistest.Start(t)
	open := movers(t)
	ca := srv.Client(t)
	hook := &beforeSend{}
	ca.AddHook(hook)
	gwa, gwb := open(ca), open(srv.Client(t))
	if evs := gwb.apply(0, covered(leased("gw-b", false, write("mover", "mqtt/b", gateway.Connect, 0)))); len(evs) != 1 {
		t.Fatalf("connect at gw-b: %s", describe(evs))
	}
	// (a store reports coverage once it has seen the store's clock)
	gwa.apply(0, covered(leased("gw-a", false)))
	gwa.apply(0, covered(leased("gw-a", false)))
	hook.fn = func() {
		time.Sleep(150 * time.Millisecond)
		if evs := gwb.apply(0, covered(leased("gw-b", false, write("mover", "mqtt/b", gateway.Leave, 0)))); len(evs) != 0 {
			t.Errorf("goodbye at gw-b while gw-a lags: %s, want it held", describe(evs))
		}
		time.Sleep(20 * time.Millisecond)
		gwb.apply(0, covered(leased("gw-b", false)))
		time.Sleep(150 * time.Millisecond)
	}
	if evs := gwa.apply(0, covered(leased("gw-a", false, write("mover", "mqtt/a", gateway.Connect, 0)))); len(evs) != 0 {
		t.Fatalf("gw-a's connect, observed before the goodbye and sent late: %s, want none", describe(evs))
	}
	if info := gwa.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover: %+v, want online", info)
	}
}

// lateReplies delays every reply by d once it has arrived: the store's
// estimate of the server's clock, a lower bound, is then about d low.
type lateReplies struct{ d time.Duration }

var _ redis.Hook = (*lateReplies)(nil)

func (h *lateReplies) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *lateReplies) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		time.Sleep(h.d)
		return err
	}
}
func (h *lateReplies) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		time.Sleep(h.d)
		return err
	}
}

// A device moves make-before-break from gw-b to gw-a: gw-a observes its
// connect, then gw-b its goodbye 5 ms later. Each gateway dates its
// evidence on its own estimate of the store's clock, a lower bound, and
// every reply gw-b gets comes back 40 ms late: its estimate is about
// 40 ms low, and its goodbye is dated before gw-a's connect. The move
// must still bridge the goodbye: no offline, whether the store judges it
// at the goodbye, at gw-a's connect, or at a reap once both gateways
// have covered it.
func TestMoveDatedOutOfOrderByTheGatewaysClocks(t *testing.T) {
	srv := redistest.Start(t)
	open := movers(t)
	cb := srv.Client(t)
	cb.AddHook(&lateReplies{40 * time.Millisecond})
	gwa, gwb := open(srv.Client(t)), open(cb)
	if evs := gwb.apply(0, covered(leased("gw-b", false, write("mover", "mqtt/b", gateway.Connect, 0)))); len(evs) != 1 {
		t.Fatalf("connect at gw-b: %s", describe(evs))
	}
	// (a store dates evidence and coverage once it has seen the store's clock)
	for range 3 {
		gwa.apply(0, covered(leased("gw-a", false)))
		gwb.apply(0, covered(leased("gw-b", false)))
	}
	connected := time.Now()
	time.Sleep(5 * time.Millisecond)
	left := time.Now()
	if evs := gwb.apply(0, covered(leased("gw-b", false, write("mover", "mqtt/b", gateway.Leave, time.Since(left))))); len(evs) != 0 {
		t.Fatalf("goodbye at gw-b while gw-a's coverage lags: %s, want it held", describe(evs))
	}
	time.Sleep(60 * time.Millisecond)
	if evs := gwa.apply(0, covered(leased("gw-a", false, write("mover", "mqtt/a", gateway.Connect, time.Since(connected))))); len(evs) != 0 {
		t.Fatalf("gw-a's connect, observed before the goodbye: %s, want none", describe(evs))
	}
	time.Sleep(60 * time.Millisecond)
	gwb.apply(0, covered(leased("gw-b", false)))
	gwa.apply(0, covered(leased("gw-a", false)))
	gwa.reap(0, 100)
	if evs := gwa.events(0); len(evs) != 1 {
		t.Fatalf("events: %s, want only gw-b's connect", describe(evs))
	}
	if info := gwa.device("mover"); info.State != gateway.Online {
		t.Fatalf("mover: %+v, want online", info)
	}
}

// A goodbye held while another gateway's coverage lags, on the real
// clock: its session ends as late as the leave may have been (A_SKEW),
// and the reap that ends it once gw-a covers it still names it a leave.
func TestHeldGoodbyeDatedLateIsStillALeave(t *testing.T) {
	srv := redistest.Start(t)
	open := movers(t)
	gwa, gwb := open(srv.Client(t)), open(srv.Client(t))
	gwb.apply(0, covered(leased("gw-b", false, write("quitter", "mqtt/b", gateway.Connect, 0))))
	for range 3 {
		gwa.apply(0, covered(leased("gw-a", false)))
		gwb.apply(0, covered(leased("gw-b", false)))
	}
	left := time.Now()
	time.Sleep(20 * time.Millisecond)
	if evs := gwb.apply(0, covered(leased("gw-b", false, write("quitter", "mqtt/b", gateway.Leave, time.Since(left))))); len(evs) != 0 {
		t.Fatalf("goodbye at gw-b while gw-a's coverage lags: %s, want it held", describe(evs))
	}
	// the goodbye is held until gw-a's coverage passes the latest it
	// may have been observed (A_SKEW after its date, the width of gw-b's
	// clock estimate: a few ms on a loopback, more on a loaded machine)
	var offs []gateway.Event
	for deadline := time.Now().Add(5 * time.Second); len(offs) == 0 && time.Now().Before(deadline); {
		time.Sleep(10 * time.Millisecond)
		gwa.apply(0, covered(leased("gw-a", false)))
		gwb.apply(0, covered(leased("gw-b", false)))
		offs = gwa.reap(0, 10).Offline
	}
	if len(offs) != 1 || offs[0].Reason != gateway.ReasonLeave {
		t.Fatalf("reap once gw-a covers the goodbye: %s, want quitter's offline (leave)", describe(offs))
	}
}
