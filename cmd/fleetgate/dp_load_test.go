package main

import (
	"bufio"
	"context"
	wire "encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/mosquittotest"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// The data path's load: devices (rawMQTT) publishing numbered,
// timestamped messages to a gateway (fleetgate, or a mosquitto with a
// bridge), and a subscriber on the upstream broker that counts what
// arrives, per device, in order, with its latency.

// dpPayload is message seq of a device: the send time (Unix ns) and seq
// in its first 16 bytes, padded to size.
func dpPayload(seq uint64, size int) []byte {
	p := make([]byte, max(size, 16))
	wire.BigEndian.PutUint64(p, uint64(time.Now().UnixNano()))
	wire.BigEndian.PutUint64(p[8:], seq)
	for i := 16; i < len(p); i++ {
		p[i] = 'x'
	}
	return p
}

// dpDeviceIDs are n device IDs, dp0000...
func dpDeviceIDs(n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("dp%04d", i)
	}
	return ids
}

// dpIndex is the index of device ID dpNNNN in a topic
// ".../devices/dpNNNN/...", -1 if none.
func dpIndex(topic string) int {
	_, rest, ok := strings.Cut(topic, "/devices/dp")
	if !ok {
		return -1
	}
	id, _, _ := strings.Cut(rest, "/")
	n, err := strconv.Atoi(id)
	if err != nil {
		return -1
	}
	return n
}

// upCounter subscribes on the upstream broker and counts the messages
// of the devices: arrivals, first occurrences, duplicates, and first
// occurrences out of order per device; and the latency of each first
// occurrence (arrival − the send time in its payload) while recording.
type upCounter struct {
	mu        sync.Mutex
	devs      []upDevice
	arrivals  int64
	unique    int64
	dups      int64
	reordered int64
	lat       []int64 // ns
	recording bool
	// reorders keeps the first few out-of-order arrivals, for the log.
	reorders []string
	connects int
	lastErr  error
	done     chan struct{}
}

type upDevice struct {
	seen []bool
	last int64 // seq of the last first occurrence, -1 none
	dups int64
}

// counterLimit bounds an upCounter's life.
const counterLimit = 20 * time.Minute

// maxLatencySamples bounds the latencies kept (the counts go on).
const maxLatencySamples = 4 << 20

// countUpstream subscribes filter at qos on the broker at addr as
// clientID (a persistent session when persistent, so that a broker
// restarted from its save keeps queueing for it) and counts until ctx
// ends; it reconnects (every 50 ms) while the broker is away. It returns
// once the first subscription is acknowledged.
func countUpstream(t testing.TB, ctx context.Context, addr, clientID, filter string, qos byte, devices int, persistent bool) *upCounter {
	t.Helper()
	u := &upCounter{devs: make([]upDevice, devices), done: make(chan struct{})}
	ctx, cancel := context.WithTimeout(ctx, counterLimit)
	for i := range u.devs {
		u.devs[i].last = -1
	}
	first := make(chan error, 1)
	go func() {
		defer cancel()
		defer close(u.done)
		once := sync.Once{}
		report := func(err error) { once.Do(func() { first <- err }) }
		for ctx.Err() == nil {
			c, err := dialRaw(addr, clientID, rawOptions{persistent: persistent, sessionExpiry: 3600, timeout: 2 * time.Second})
			if err == nil {
				err = c.subscribe(filter, qos)
				if err != nil {
					c.close()
				}
			}
			if err != nil {
				u.mu.Lock()
				u.lastErr = err
				u.mu.Unlock()
				select {
				case <-ctx.Done():
				case <-time.After(50 * time.Millisecond):
				}
				continue
			}
			u.mu.Lock()
			u.connects++
			u.mu.Unlock()
			report(nil)
			stop := context.AfterFunc(ctx, c.close)
			err = u.read(c)
			stop()
			c.close()
			u.mu.Lock()
			u.lastErr = err
			u.mu.Unlock()
		}
		report(ctx.Err())
	}()
	select {
	case err := <-first:
		if err != nil {
			t.Fatalf("upstream subscriber: %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatalf("upstream subscriber not subscribed after 15s: %v", u.err())
	}
	return u
}

func (u *upCounter) err() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.lastErr
}

// read counts what c delivers until it fails.
func (u *upCounter) read(c *rawMQTT) error {
	for {
		first, b, err := c.read()
		if err != nil {
			return err
		}
		if first>>4 != 3 {
			continue
		}
		now := time.Now().UnixNano()
		topic, qos, id, payload, err := parsePublish(first, b)
		if err != nil {
			return err
		}
		if qos > 0 {
			if err := c.puback(id); err != nil {
				return err
			}
		}
		u.add(topic, payload, now)
	}
}

func (u *upCounter) add(topic string, payload []byte, now int64) {
	i := dpIndex(topic)
	u.mu.Lock()
	defer u.mu.Unlock()
	u.arrivals++
	if i < 0 || i >= len(u.devs) || len(payload) < 16 {
		return
	}
	sent := int64(wire.BigEndian.Uint64(payload))
	seq := int64(wire.BigEndian.Uint64(payload[8:]))
	d := &u.devs[i]
	if seq >= int64(len(d.seen)) {
		d.seen = slices.Grow(d.seen, int(seq)+1-len(d.seen))[:seq+1]
	}
	if d.seen[seq] {
		u.dups++
		d.dups++
		return
	}
	d.seen[seq] = true
	u.unique++
	if seq < d.last {
		u.reordered++
		if len(u.reorders) < 10 {
			u.reorders = append(u.reorders, fmt.Sprintf("dp%04d: %d after %d", i, seq, d.last))
		}
	}
	d.last = seq
	if u.recording && len(u.lat) < maxLatencySamples {
		u.lat = append(u.lat, now-sent)
	}
}

// upCounts is a snapshot of an upCounter.
type upCounts struct{ arrivals, unique, dups, reordered int64 }

func (u *upCounter) counts() upCounts {
	u.mu.Lock()
	defer u.mu.Unlock()
	return upCounts{u.arrivals, u.unique, u.dups, u.reordered}
}

// record starts (or stops) keeping latencies, dropping those kept.
func (u *upCounter) record(on bool) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.recording = on
	if on {
		u.lat = u.lat[:0]
	}
}

// latencies returns the latencies kept, sorted.
func (u *upCounter) latencies() []time.Duration {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := make([]time.Duration, len(u.lat))
	for i, l := range u.lat {
		out[i] = time.Duration(l)
	}
	slices.Sort(out)
	return out
}

// missing returns, for each device, the seqs below upTo[i] that never
// arrived.
func (u *upCounter) missing(upTo []int64) map[int][]int64 {
	u.mu.Lock()
	defer u.mu.Unlock()
	out := map[int][]int64{}
	for i, n := range upTo {
		for s := int64(0); s < n; s++ {
			if s >= int64(len(u.devs[i].seen)) || !u.devs[i].seen[s] {
				out[i] = append(out[i], s)
			}
		}
	}
	return out
}

// awaitUnique waits until at least n distinct messages arrived, or
// limit passed; it returns whether they did.
func (u *upCounter) awaitUnique(n int64, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for u.counts().unique < n {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
	return true
}

// quantile is the q-quantile of sorted (nearest rank).
func quantile(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// fleet is a set of devices publishing numbered messages to a gateway
// on a schedule: device i sends message k at start + i×every/n +
// k×every (at once when behind), one in flight: at QoS 1 the next only
// after the PUBACK. A device whose connection fails reconnects (every
// 100 ms) and sends the message not acknowledged again.
type fleet struct {
	ids   []string
	addr  func() string
	conns []*rawMQTT
	// ackedUpTo[i]: device i's messages 0..ackedUpTo[i]-1 were
	// acknowledged (QoS 1) or written (QoS 0).
	ackedUpTo  []atomic.Int64
	sent       atomic.Int64
	refused    atomic.Int64 // PUBACK reason ≥ 0x80
	reconnects atomic.Int64
	failures   atomic.Int64 // publishes that failed (then sent again)
	pings      atomic.Int64
	mu         sync.Mutex
	errs       []string // the first few failures
	// ackLat keeps, while recording, each QoS 1 message's time from
	// its PUBLISH written to its PUBACK read.
	recording atomic.Bool
	ackLat    []time.Duration
}

// recordAcks starts keeping PUBACK latencies, dropping those kept.
func (f *fleet) recordAcks() {
	f.mu.Lock()
	f.ackLat = f.ackLat[:0]
	f.mu.Unlock()
	f.recording.Store(true)
}

// ackLatencies stops keeping them and returns them, sorted.
func (f *fleet) ackLatencies() []time.Duration {
	f.recording.Store(false)
	f.mu.Lock()
	defer f.mu.Unlock()
	out := slices.Clone(f.ackLat)
	slices.Sort(out)
	return out
}

// connectFleet connects the devices ids to addr(), 32 at a time,
// trying each again (every 100 ms) for up to 30 s.
func connectFleet(t testing.TB, addr func() string, ids []string) *fleet {
	t.Helper()
	f := &fleet{ids: ids, addr: addr, conns: make([]*rawMQTT, len(ids)), ackedUpTo: make([]atomic.Int64, len(ids))}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 32)
	var failed atomic.Value
	for i, id := range ids {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c, err := f.dial(id, time.Now().Add(30*time.Second))
			if err != nil {
				failed.Store(fmt.Errorf("device %s: %w", id, err))
				return
			}
			f.conns[i] = c
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		f.close()
		t.Fatalf("connect the fleet: %v", err)
	}
	t.Cleanup(f.close)
	return f
}

func (f *fleet) dial(id string, deadline time.Time) (*rawMQTT, error) {
	for {
		c, err := dialRaw(f.addr(), id, rawOptions{keepAlive: 60, timeout: 5 * time.Second})
		if err == nil {
			return c, nil
		}
		if time.Now().After(deadline) {
			return nil, err
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (f *fleet) close() {
	for _, c := range f.conns {
		if c != nil {
			c.close()
		}
	}
}

// disconnect ends every device's connection with a normal DISCONNECT
// (a leave).
func (f *fleet) disconnect() {
	for i, c := range f.conns {
		if c != nil {
			c.disconnect()
			f.conns[i] = nil
		}
	}
}

func (f *fleet) failure(err error) {
	f.failures.Add(1)
	f.mu.Lock()
	if len(f.errs) < 10 {
		f.errs = append(f.errs, err.Error())
	}
	f.mu.Unlock()
}

// acked is the messages acknowledged (written at QoS 0) in all.
func (f *fleet) acked() int64 {
	var n int64
	for i := range f.ackedUpTo {
		n += f.ackedUpTo[i].Load()
	}
	return n
}

func (f *fleet) ackedSnapshot() []int64 {
	out := make([]int64, len(f.ackedUpTo))
	for i := range out {
		out[i] = f.ackedUpTo[i].Load()
	}
	return out
}

// dpLoad is one run of a fleet: count messages per device (from each
// device's next seq), every apart, from start; size-byte payloads on
// <prefix>/<id>/t. It stops early at deadline or when stop is closed.
type dpLoad struct {
	qos      byte
	every    time.Duration
	count    int
	size     int
	prefix   string
	start    time.Time
	deadline time.Time
	stop     <-chan struct{}
}

// run plays l on every device and returns when all are done.
func (f *fleet) run(l dpLoad) {
	var wg sync.WaitGroup
	for i := range f.ids {
		wg.Go(func() { f.runDevice(i, l) })
	}
	wg.Wait()
}

func (f *fleet) runDevice(i int, l dpLoad) {
	topic := l.prefix + "/" + f.ids[i] + "/t"
	offset := l.every * time.Duration(i) / time.Duration(len(f.ids))
	first := f.ackedUpTo[i].Load()
	for k := 0; k < l.count; {
		if time.Now().After(l.deadline) || stopped(l.stop) {
			return
		}
		if f.conns[i] == nil {
			c, err := f.dial(f.ids[i], l.deadline)
			if err != nil {
				f.failure(fmt.Errorf("%s: reconnect: %w", f.ids[i], err))
				return
			}
			f.conns[i] = c
			f.reconnects.Add(1)
		}
		if d := time.Until(l.start.Add(offset + time.Duration(k)*l.every)); d > 0 {
			select {
			case <-time.After(d):
			case <-l.stop:
				return
			}
		}
		c := f.conns[i]
		seq := first + int64(k)
		sentAt := time.Now()
		id, err := c.publish(topic, l.qos, dpPayload(uint64(seq), l.size))
		f.sent.Add(1)
		var reason byte
		if err == nil && l.qos == 1 {
			reason, err = c.awaitPuback(id, 20*time.Second)
			if err == nil && f.recording.Load() {
				d := time.Since(sentAt)
				f.mu.Lock()
				if len(f.ackLat) < maxLatencySamples {
					f.ackLat = append(f.ackLat, d)
				}
				f.mu.Unlock()
			}
		}
		if err != nil {
			f.failure(fmt.Errorf("%s seq %d: %w", f.ids[i], seq, err))
			c.close()
			f.conns[i] = nil
			time.Sleep(100 * time.Millisecond)
			continue // the same seq again
		}
		if reason >= 0x80 {
			f.refused.Add(1)
			f.failure(fmt.Errorf("%s seq %d: puback reason 0x%02x", f.ids[i], seq, reason))
		}
		f.ackedUpTo[i].Store(seq + 1)
		k++
	}
}

// idle keeps every device's connection alive with a PINGREQ every
// interval (spread), reading the PINGRESPs, until stop is closed (at
// most for idleLimit).
func (f *fleet) idle(every time.Duration, stop <-chan struct{}) {
	var wg sync.WaitGroup
	start := time.Now()
	for i := range f.ids {
		wg.Go(func() {
			offset := every * time.Duration(i) / time.Duration(len(f.ids))
			for k := 0; time.Since(start) < idleLimit; k++ {
				select {
				case <-time.After(time.Until(start.Add(offset + time.Duration(k)*every))):
				case <-stop:
					return
				}
				c := f.conns[i]
				if c == nil {
					return
				}
				err := c.ping()
				if err == nil {
					_ = c.c.SetReadDeadline(time.Now().Add(10 * time.Second))
					var first byte
					first, _, err = c.read()
					_ = c.c.SetReadDeadline(time.Time{})
					if err == nil && first>>4 != 13 {
						err = fmt.Errorf("packet type %d, want PINGRESP", first>>4)
					}
				}
				if err != nil {
					f.failure(fmt.Errorf("%s ping: %w", f.ids[i], err))
					return
				}
				f.pings.Add(1)
			}
		})
	}
	wg.Wait()
}

// idleLimit bounds fleet.idle.
const idleLimit = 10 * time.Minute

func stopped(c <-chan struct{}) bool {
	select {
	case <-c:
		return true
	default:
		return false
	}
}

// procTicks is a process's CPU (utime + stime) in clock ticks (100 a
// second on Linux).
func procTicks(t testing.TB, pid int) int64 {
	t.Helper()
	n, err := redistest.ProcStat(pid)
	if err != nil {
		t.Fatalf("cpu of pid %d: %v", pid, err)
	}
	return n
}

const ticksPerSecond = 100

// brokerPid finds a mosquitto's process by the configuration file on its
// command line (mosquittotest does not export it).
func brokerPid(t testing.TB, b *mosquittotest.Broker) int {
	t.Helper()
	conf := filepath.Join(b.Dir, "mosquitto.conf")
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if err != nil {
			continue
		}
		if slices.Contains(strings.Split(string(cmd), "\x00"), conf) {
			return pid
		}
	}
	t.Fatalf("no process runs mosquitto -c %s", conf)
	return 0
}

// bridgeGateway makes a gateway (not started) that forwards to
// upstream (a host:port), with queue (more keys of bridge.queue, YAML
// flow after a comma, "" for none; commit_interval is the shipped 10ms
// unless queue sets it), log level info and the anonymous limits opened
// for a fleet of loopback devices.
func bridgeGateway(t testing.TB, id, upstream, queue string, tm e2eTiming) *gatewayProc {
	t.Helper()
	g := newGateway(t, id, "", tm)
	b, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), "log: { level: debug }", "log: { level: info }", 1)
	if !strings.Contains(queue, "commit_interval") {
		queue = ", commit_interval: 10ms" + queue // the shipped one
	}
	cfg += fmt.Sprintf("bridge: { mqtt: { url: \"mqtt://%s\" }, queue: { %s } }\n", upstream, strings.TrimPrefix(queue, ", "))
	cfg += "limits: { anonymous_max_devices: 100000, anonymous_connects_per_second: 100000 }\n"
	if err := os.WriteFile(g.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	return g
}

// mosquittoBridge starts a local mosquitto (persistence true) bridged to
// upstream: devices/# out at QoS 1 as fleetgate/<name>/devices/#, MQTT
// 5, a persistent bridge session; queues unbounded, so that it drops
// nothing the counts would miss.
func mosquittoBridge(t testing.TB, name, upstream string) *mosquittotest.Broker {
	t.Helper()
	return mosquittotest.Start(t, mosquittotest.Options{Config: []string{
		"max_queued_messages 0",
		"connection " + name,
		"address " + upstream,
		"bridge_protocol_version mqttv50",
		"cleansession false",
		"remote_clientid " + name + "-bridge",
		`topic devices/# out 1 "" fleetgate/` + name + "/",
	}})
}

// upstreamBroker starts the upstream mosquitto; autosave > 0 saves its
// state every that many seconds (a kill -9 then keeps the sessions).
func upstreamBroker(t testing.TB, autosave int) *mosquittotest.Broker {
	t.Helper()
	conf := []string{"max_queued_messages 0"}
	if v := os.Getenv("DPBENCH_UPSTREAM_CONF"); v != "" {
		conf = append(conf, strings.Split(v, ";")...)
	}
	if autosave > 0 {
		conf = append(conf, "autosave_on_changes false", fmt.Sprintf("autosave_interval %d", autosave))
	}
	return mosquittotest.Start(t, mosquittotest.Options{Config: conf})
}

// promSample is one line of a Prometheus text exposition.
type promSample struct {
	name   string
	labels string // as printed, without braces
	value  float64
}

// scrape reads every sample of url.
func scrape(t testing.TB, url string) []promSample {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []promSample
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		if i < 0 {
			continue
		}
		v, err := strconv.ParseFloat(line[i+1:], 64)
		if err != nil {
			continue
		}
		s := promSample{name: line[:i], value: v}
		if j := strings.IndexByte(s.name, '{'); j >= 0 {
			s.name, s.labels = s.name[:j], strings.TrimSuffix(s.name[j+1:], "}")
		}
		out = append(out, s)
	}
	if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) {
		t.Fatal(err)
	}
	return out
}

// metric sums the samples of name whose labels include every pair of
// want (`queue="durable"`).
func metric(samples []promSample, name string, want ...string) float64 {
	var v float64
	for _, s := range samples {
		if s.name != name {
			continue
		}
		ok := true
		for _, w := range want {
			if !strings.Contains(","+s.labels+",", ","+w+",") {
				ok = false
			}
		}
		if ok {
			v += s.value
		}
	}
	return v
}

// histogram is a Prometheus histogram's cumulative buckets, sum and
// count.
type histogram struct {
	le     []float64
	counts []float64
	sum    float64
	count  float64
}

func readHistogram(samples []promSample, name string) histogram {
	var h histogram
	for _, s := range samples {
		switch s.name {
		case name + "_bucket":
			le, _ := strings.CutPrefix(s.labels, `le="`)
			le = strings.TrimSuffix(le, `"`)
			v, err := strconv.ParseFloat(le, 64)
			if err != nil {
				continue
			}
			h.le, h.counts = append(h.le, v), append(h.counts, s.value)
		case name + "_sum":
			h.sum = s.value
		case name + "_count":
			h.count = s.value
		}
	}
	return h
}

// minus is h − o (the observations between two scrapes).
func (h histogram) minus(o histogram) histogram {
	d := histogram{le: h.le, counts: make([]float64, len(h.counts)), sum: h.sum - o.sum, count: h.count - o.count}
	for i := range h.counts {
		d.counts[i] = h.counts[i]
		if i < len(o.counts) {
			d.counts[i] -= o.counts[i]
		}
	}
	return d
}

func (h histogram) mean() float64 {
	if h.count == 0 {
		return 0
	}
	return h.sum / h.count
}

// quantile interpolates linearly inside the bucket holding the q-th
// observation, as PromQL's histogram_quantile does.
func (h histogram) quantile(q float64) float64 {
	if h.count == 0 {
		return 0
	}
	rank := q * h.count
	lower, below := 0.0, 0.0
	for i, c := range h.counts {
		if c >= rank {
			if math.IsInf(h.le[i], 1) {
				return lower
			}
			if c == below {
				return h.le[i]
			}
			return lower + (h.le[i]-lower)*(rank-below)/(c-below)
		}
		lower, below = h.le[i], c
	}
	return lower
}
