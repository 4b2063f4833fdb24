package adapter

import (
	"context"
	"reflect"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	pb "github.com/fleetgate/fleetgate/plugins/proto"
)

// Command delivery bounds.
const (
	// CommandRetry is how long a refused or failed command waits before
	// the host delivers it again (it stays pending meanwhile, until it
	// expires).
	CommandRetry = 10 * time.Second
	// DeliverTimeout bounds one Deliver call.
	DeliverTimeout = 10 * time.Second
	// MaxWatched bounds the devices whose commands the host waits for
	// (gateway.Commands.Wait, one select over them all) per adapter; the
	// pending commands of the live devices beyond it are looked for every
	// CommandRetry.
	MaxWatched = 4096
	// commandBatch is how many of a device's pending commands one look
	// takes.
	commandBatch = 16
)

// commandCounts are an adapter's command counters.
type commandCounts struct {
	delivered, refused, failed atomic.Uint64
}

// reach is the set of devices an adapter's commands go to: those with a
// live session of the adapter (its sessions report them: set) and the
// exact IDs of its Spec.Devices. It outlives the adapter's restarts, as
// its sessions do.
type reach struct {
	mu      sync.Mutex
	static  map[gateway.DeviceID]struct{}
	live    map[gateway.DeviceID]struct{}
	changed chan struct{} // a signal: the set changed
}

func newReach(devices []string) *reach {
	r := &reach{static: make(map[gateway.DeviceID]struct{}), live: make(map[gateway.DeviceID]struct{}), changed: make(chan struct{}, 1)}
	for _, d := range devices {
		if !strings.HasSuffix(d, "*") {
			r.static[gateway.DeviceID(d)] = struct{}{}
		}
	}
	return r
}

// set records that device came to life or died.
func (r *reach) set(device gateway.DeviceID, live bool) {
	r.mu.Lock()
	if live {
		r.live[device] = struct{}{}
	} else {
		delete(r.live, device)
	}
	r.mu.Unlock()
	notify(r.changed)
}

// devices returns the set: the static IDs and the live devices.
func (r *reach) devices() map[gateway.DeviceID]struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make(map[gateway.DeviceID]struct{}, len(r.static)+len(r.live))
	for d := range r.static {
		out[d] = struct{}{}
	}
	for d := range r.live {
		out[d] = struct{}{}
	}
	return out
}

func notify(c chan struct{}) {
	select {
	case c <- struct{}{}:
	default:
	}
}

// watch is the delivery state of one device.
type watch struct {
	// ready is Commands.Wait's channel; nil for a device beyond
	// MaxWatched, looked at every CommandRetry instead.
	ready <-chan struct{}
	// retry is when to look again (a command was refused or failed);
	// zero when nothing waits.
	retry time.Time
}

// deliverCommands delivers the pending commands of the adapter's
// devices (reach) to client until ctx ends: at once for each device as it
// comes to life and whenever Commands.Wait says a command was submitted
// for it, again CommandRetry after a refusal or failure. One goroutine
// per adapter process: it waits on all the devices' Wait channels in one
// reflect.Select (then looks at each channel, to serve all that fired),
// and delivers one command at a time.
func (p *proc) deliverCommands(ctx context.Context, client pb.AdapterClient) {
	cmds := p.h.o.Commands
	clock := p.h.o.Clock
	watched := make(map[gateway.DeviceID]*watch)
	waiting := 0 // watched devices with a Wait channel
	// cases are ctx, reach.changed, the retry timer, then devs' Wait
	// channels.
	const fixed = 3
	var (
		cases  []reflect.SelectCase
		devs   []gateway.DeviceID
		dirty  = true
		timer  gateway.Timer
		pollAt time.Time // when to look at the devices beyond MaxWatched
	)
	defer func() {
		if timer != nil {
			timer.Stop()
		}
	}()
	sync := func() {
		live := p.reach.devices()
		for d, w := range watched {
			if _, ok := live[d]; !ok {
				if w.ready != nil {
					waiting--
				}
				delete(watched, d)
				dirty = true
			}
		}
		for d := range live {
			if _, ok := watched[d]; ok {
				continue
			}
			w := &watch{}
			if waiting < MaxWatched {
				w.ready = cmds.Wait(d)
				waiting++
			}
			watched[d] = w
			dirty = true
			p.deliverTo(ctx, client, d, w)
		}
	}
	sync()
	for ctx.Err() == nil {
		if dirty {
			cases = append(cases[:0],
				reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(ctx.Done())},
				reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(p.reach.changed)},
				reflect.SelectCase{Dir: reflect.SelectRecv})
			devs = devs[:0]
			for d, w := range watched {
				if w.ready != nil {
					cases = append(cases, reflect.SelectCase{Dir: reflect.SelectRecv, Chan: reflect.ValueOf(w.ready)})
					devs = append(devs, d)
				}
			}
			dirty = false
		}
		// The retry timer: the earliest retry, and every CommandRetry a
		// look at the devices beyond MaxWatched.
		next := pollAt
		if len(watched) > waiting && next.IsZero() {
			pollAt = clock.Now().Add(CommandRetry)
			next = pollAt
		}
		for _, w := range watched {
			if !w.retry.IsZero() && (next.IsZero() || w.retry.Before(next)) {
				next = w.retry
			}
		}
		if timer != nil {
			timer.Stop()
			timer = nil
		}
		cases[2].Chan = reflect.Value{}
		if !next.IsZero() {
			timer = clock.NewTimer(max(0, next.Sub(clock.Now())))
			cases[2].Chan = reflect.ValueOf(timer.C())
		}
		chosen, _, _ := reflect.Select(cases)
		switch chosen {
		case 0:
			return
		case 1:
			sync()
		case 2:
			timer = nil
			now := clock.Now()
			poll := !pollAt.IsZero() && !pollAt.After(now)
			if poll {
				pollAt = time.Time{}
			}
			for d, w := range watched {
				if (poll && w.ready == nil) || (!w.retry.IsZero() && !w.retry.After(now)) {
					w.retry = time.Time{}
					p.deliverTo(ctx, client, d, w)
				}
			}
		default:
			// Every device whose channel has fired, not only the chosen
			// one: a burst of submits costs one select over all the
			// channels, not one each.
			for i, d := range devs {
				w := watched[d]
				select {
				case <-w.ready:
				default:
					continue
				}
				w.ready = cmds.Wait(d) // before Pending: a submit in between is not missed
				cases[i+fixed].Chan = reflect.ValueOf(w.ready)
				p.deliverTo(ctx, client, d, w)
			}
		}
	}
}

// deliverTo delivers device's pending commands, oldest first, until one
// is refused or fails (then w.retry is set: a device's commands go in
// order) or none is left. A device of the devices file gets none (no
// adapter speaks for it).
func (p *proc) deliverTo(ctx context.Context, client pb.AdapterClient, device gateway.DeviceID, w *watch) {
	if c := p.h.credentials(); c != nil && c.Revision(device) != "" {
		return
	}
	cmds := p.h.o.Commands
	m := p.h.metrics.of(p.spec.Name)
	for ctx.Err() == nil {
		now := p.h.o.Clock.Now()
		pending := cmds.Pending(device, now, commandBatch)
		for _, c := range pending {
			dctx, cancel := context.WithTimeout(ctx, DeliverTimeout)
			res, err := client.Deliver(dctx, commandMessage(c))
			cancel()
			if ctx.Err() != nil {
				return
			}
			switch {
			case err != nil:
				p.cmds.failed.Add(1)
				m.commandsFailed.Inc()
				p.log.Warn("command not delivered; trying again later", "device", device, "command", c.ID, "retry_in", CommandRetry, "err", err)
			case !res.GetAccepted():
				p.cmds.refused.Add(1)
				m.commandsRefused.Inc()
				p.log.Info("command refused by the adapter; trying again later", "device", device, "command", c.ID, "retry_in", CommandRetry, "reason", res.GetReason())
			default:
				p.cmds.delivered.Add(1)
				m.commandsDelivered.Inc()
				if err := cmds.Ack(device, c.ID); err != nil {
					p.log.Warn("command delivered but not acknowledged; it may be delivered again", "device", device, "command", c.ID, "err", err)
				}
				continue
			}
			w.retry = now.Add(CommandRetry)
			return
		}
		if len(pending) < commandBatch {
			return
		}
	}
}

// commandMessage is c as the contract's Command.
func commandMessage(c gateway.Command) *pb.Command {
	out := &pb.Command{Id: c.ID, Device: string(c.Device), Topic: c.Topic, Payload: c.Payload, ContentType: c.ContentType}
	if !c.Expires.IsZero() {
		out.ExpiresUnixMs = c.Expires.UnixMilli()
	}
	for _, pr := range c.Properties {
		out.Properties = append(out.Properties, &pb.Property{Key: pr.Key, Value: pr.Value})
	}
	return out
}
