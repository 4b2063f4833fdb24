package main

import (
	"bufio"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// monitorLine is one command MONITOR reported: the client's address
// ("lua" for a command run by a script) and the command's arguments.
type monitorLine struct {
	client string
	name   string
	args   int
	key    string // an EVAL or EVALSHA's first key
}

// monitorLog records every command a redis-server runs, from MONITOR.
type monitorLog struct {
	mu    sync.Mutex
	lines []monitorLine
	conn  net.Conn
	done  chan struct{}
}

var monitorRE = regexp.MustCompile(`^\+\d+\.\d+ \[\d+ ([^\]]+)\] "([A-Za-z]+)"(?: "[^"]*" "[1-9]\d*" "([^"]*)")?`)

// startMonitor runs MONITOR on a connection of its own and returns once
// the server logs every command.
func startMonitor(t testing.TB, addr string) *monitorLog {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	m := &monitorLog{conn: c, done: make(chan struct{})}
	if _, err := c.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	// +OK: the server logs every command from now on
	r := bufio.NewReader(c)
	if ok, err := r.ReadString('\n'); err != nil || ok != "+OK\r\n" {
		t.Fatalf("MONITOR answered %q, %v", ok, err)
	}
	go func() {
		defer close(m.done)
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 1<<20), 1<<24)
		for sc.Scan() {
			f := monitorRE.FindStringSubmatch(sc.Text())
			if f == nil {
				continue
			}
			l := monitorLine{client: f[1], name: strings.ToUpper(f[2]), args: strings.Count(sc.Text(), `" "`) + 1, key: f[3]}
			m.mu.Lock()
			m.lines = append(m.lines, l)
			m.mu.Unlock()
		}
	}()
	t.Cleanup(m.stop)
	return m
}

func (m *monitorLog) stop() {
	m.conn.Close()
	<-m.done
}

func (m *monitorLog) snapshot() []monitorLine {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]monitorLine(nil), m.lines...)
}

// applyRuns groups the apply script calls (EVALSHA or EVAL with the
// apply script's many arguments; a reap has 11) into runs: calls of one
// client that Redis ran one after the other, with nothing but the
// scripts' own commands in between. A pipeline that arrives in one read
// is one run.
//
// A pipeline larger than Redis's read (16 KB) is read in parts, and the
// commands of other clients run between them, so it may count as
// several runs: the runs are an upper bound of the round trips, exact
// for small pipelines (see pipelines).
func applyRuns(lines []monitorLine) [][]monitorLine {
	var runs [][]monitorLine
	var cur []monitorLine
	flush := func() {
		if len(cur) > 0 {
			runs = append(runs, cur)
			cur = nil
		}
	}
	for _, l := range lines {
		switch {
		case l.client == "lua":
		case isApply(l):
			if len(cur) > 0 && cur[0].client != l.client {
				flush()
			}
			cur = append(cur, l)
		default:
			flush()
		}
	}
	flush()
	return runs
}

// isApply tells the apply script calls (EVALSHA or EVAL with the apply
// script's many arguments; a reap has 20 with its 7 keys) from other
// commands.
func isApply(l monitorLine) bool {
	const applyMinArgs = 26 // EVALSHA sha 7 keys..7 + 20 header arguments: 30
	return (l.name == "EVALSHA" || l.name == "EVAL") && l.args >= applyMinArgs
}

// pipelines groups the apply script calls into the pipelines they came
// in, joining the parts of a pipeline that Redis read in several reads:
// a client's apply calls belong together, whatever other clients ran
// between them, until that client runs another command or an apply call
// on a shard (its first key) already in the group, which starts the next
// store call. Two calls of one connection with nothing else from it in
// between and no shard in common count as one, so this is a lower bound
// of the round trips, and applyRuns an upper one.
func pipelines(lines []monitorLine) [][]monitorLine {
	open := map[string][]monitorLine{} // by client
	var out [][]monitorLine
	end := func(client string) {
		if g := open[client]; len(g) > 0 {
			out = append(out, g)
		}
		delete(open, client)
	}
	for _, l := range lines {
		switch {
		case l.client == "lua":
		case isApply(l):
			if slices.ContainsFunc(open[l.client], func(o monitorLine) bool { return o.key == l.key }) {
				end(l.client)
			}
			open[l.client] = append(open[l.client], l)
		default:
			end(l.client)
		}
	}
	clients := slices.Sorted(maps.Keys(open))
	for _, c := range clients {
		end(c)
	}
	return out
}

// scrapeCounter reads one counter from a Prometheus text exposition.
func scrapeCounter(t testing.TB, url, name string) float64 {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(body), "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
			if err != nil {
				t.Fatalf("%s: %v", line, err)
			}
			return f
		}
	}
	t.Fatalf("%s: no %s", url, name)
	return 0
}

// devicesPerShard returns n device IDs for each of shards shards.
func devicesPerShard(prefix string, shards, n int) []string {
	var out []string
	count := make([]int, shards)
	for i := 0; len(out) < shards*n && i < 100*shards*n; i++ {
		id := fmt.Sprintf("%s-%d", prefix, i)
		s := gateway.ShardOf(gateway.DeviceID(id), shards)
		if count[s] < n {
			count[s]++
			out = append(out, id)
		}
	}
	return out
}

// Every flush of `fleetgate run` reaches Redis as one pipeline on one
// connection, seen from the server: the uplink's store calls (its
// fleetgate_store_calls_total) and the runs of apply script calls in
// MONITOR are as many, and the first flush, which also records the epoch
// on every shard, carries all 16 shards in its one run.
func TestFlushIsOnePipeline(t *testing.T) {
	t.Parallel()
	const shards = 16
	srv := redistest.Start(t)
	mon := startMonitor(t, srv.Addr)
	tm := fastTiming
	tm.shards = shards
	tm.flush = 300 * time.Millisecond
	g := newGateway(t, "gw-pipe", srv.Addr, tm)
	g.start()

	for round, prefix := range []string{"first", "second", "third"} {
		for _, id := range devicesPerShard(prefix, shards, 1) {
			device{t, id}.heartbeat(g.coapAddr)
			time.Sleep(60 * time.Millisecond) // below limits.coap_requests_per_second
		}
		want := float64(round + 1)
		waitFor(t, 10*time.Second, fmt.Sprintf("flush %d", round+1), func() bool {
			return scrapeCounter(t, "http://"+g.admin+"/metrics", "fleetgate_store_calls_total") >= want
		})
	}
	// Compare at a moment when no call is in flight: the counter the same
	// before and after reading MONITOR (a call shows in MONITOR when Redis
	// runs it, in the counter when its reply is back; the keep-alive makes
	// calls all along). A call split over several runs never matches, and
	// fails below with the runs listed.
	var (
		calls float64
		runs  [][]monitorLine
	)
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		before := scrapeCounter(t, "http://"+g.admin+"/metrics", "fleetgate_store_calls_total")
		runs = applyRuns(mon.snapshot())
		calls = scrapeCounter(t, "http://"+g.admin+"/metrics", "fleetgate_store_calls_total")
		if before == calls && float64(len(runs)) == calls {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if float64(len(runs)) != calls {
		for i, r := range runs {
			t.Logf("run %d: %d calls from %s", i, len(r), r[0].client)
		}
		t.Fatalf("%d runs of apply calls on the server for %v uplink store calls; want one run (one pipeline) per call", len(runs), calls)
	}
	if len(runs) < 3 {
		t.Fatalf("%d runs, want at least the 3 flushes", len(runs))
	}
	if n := len(runs[0]); n != shards {
		t.Fatalf("first flush: %d script calls in its pipeline, want %d (every shard: writes or the epoch)", n, shards)
	}
	t.Logf("%d flushes, each one pipeline; first %d calls, then %d and %d", len(runs), len(runs[0]), len(runs[1]), len(runs[2]))
}

// What MONITOR shows of large pipelines, against a real server: a
// pipeline of 16 apply-sized calls, 75 KB, is read by Redis in parts
// with another client's commands run between them, so applyRuns may
// count it as several runs; pipelines joins the parts into one group of
// 16 per pipeline.
func TestMonitorJoinsTheReadsOfAPipeline(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	ctx := t.Context()
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, PoolSize: 1})
	t.Cleanup(func() { c.Close() })
	other := srv.Client(t)
	sc := redis.NewScript("return 1")
	if err := sc.Load(ctx, c).Err(); err != nil {
		t.Fatal(err)
	}
	stop := make(chan struct{})
	busy := make(chan struct{})
	go func() {
		defer close(busy)
		for i := 0; i < 1_000_000; i++ {
			select {
			case <-stop:
				return
			default:
			}
			other.Get(ctx, "x")
		}
	}()
	defer func() { close(stop); <-busy }()
	arg := strings.Repeat("a", 200) // 16 calls × 24 args: 75 KB
	call := func(r redis.Scripter, shard int) {
		args := make([]any, 24)
		for i := range args {
			args[i] = arg
		}
		sc.EvalSha(ctx, r, []string{fmt.Sprintf("{p:%d}:exp", shard)}, args...)
	}
	const n = 20
	mon := startMonitor(t, srv.Addr)
	for range n {
		p := c.Pipeline()
		for s := range 16 {
			call(p, s)
		}
		if _, err := p.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
	}
	var runs, piped [][]monitorLine
	waitFor(t, 10*time.Second, "MONITOR shows every call", func() bool {
		lines := mon.snapshot()
		runs, piped = applyRuns(lines), pipelines(lines)
		calls := 0
		for _, l := range lines {
			if isApply(l) {
				calls++
			}
		}
		return calls == n*16
	})
	if len(piped) != n {
		t.Errorf("pipelines: %d groups, want the %d pipelines", len(piped), n)
	}
	for i, g := range piped {
		if len(g) != 16 {
			t.Errorf("pipeline %d: %d calls, want 16", i, len(g))
		}
	}
	if len(runs) < n {
		t.Errorf("applyRuns: %d runs, fewer than the %d pipelines", len(runs), n)
	}
	t.Logf("%d pipelines of 16 calls (75 KB), another client busy: %d runs (applyRuns), %d pipelines", n, len(runs), len(piped))
}
