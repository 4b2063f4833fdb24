package admin_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/gateway/clocktest"
	"github.com/fleetgate/fleetgate/store/embedded"
	"github.com/fleetgate/fleetgate/uplink"
)

const (
	lease   = 90 * time.Second
	suspect = 45 * time.Second
	shards  = 3
)

// fixture is an admin server over a real embedded store and a real
// session table, on a manual clock.
type fixture struct {
	t      *testing.T
	clock  *clocktest.Clock
	store  *embedded.Store
	table  *gateway.Table
	srv    *admin.Server
	client *admin.Client
}

// newFixture serves the API over an embedded store and a session table;
// opts change its options.
func newFixture(t *testing.T, opts ...func(*admin.Options)) *fixture {
	t.Helper()
	db, err := bolt.Open(filepath.Join(t.TempDir(), "state.db"), 0o600, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	clock := clocktest.New(time.UnixMilli(1_893_456_000_000))
	store, err := embedded.Open(db, embedded.Options{Shards: shards, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ob, err := uplink.OpenOutbox(db, uplink.OutboxOptions{Shards: shards})
	if err != nil {
		t.Fatal(err)
	}
	up := uplink.New(store, ob, uplink.Options{Gateway: "gw-adm", Epoch: 1, Lease: lease, Clock: clock})
	table := gateway.NewTable(up, gateway.TableOptions{Lease: lease, RenewEvery: 20 * time.Second, Clock: clock})
	reg := prometheus.NewRegistry()
	reg.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "fleetgate_test_total", Help: "test"}))
	o := admin.Options{
		Addr: "127.0.0.1:0", Store: store, Sessions: table, Gatherer: reg,
		Status: func() admin.Status { return admin.Status{Gateway: "gw-adm", Shards: shards, Sessions: table.Len()} },
		Timing: func() (time.Duration, time.Duration) { return lease, suspect },
		Forget: store, GatewayID: "gw-adm",
	}
	for _, opt := range opts {
		opt(&o)
	}
	srv, err := admin.Listen(o)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- srv.Serve() }()
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		srv.Shutdown(ctx)
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	return &fixture{t: t, clock: clock, store: store, table: table, srv: srv, client: admin.NewClient(srv.Addr().String())}
}

// connect writes a connect of dev straight into the store at the clock's now.
func (f *fixture) connect(dev string) {
	f.t.Helper()
	d := gateway.DeviceID(dev)
	b := gateway.Batch{Gateway: "gw-adm", Epoch: 1, Lease: lease, Writes: []gateway.Write{{Device: d, Session: "coap/default", Kind: gateway.Connect}}}
	if _, err := f.store.Apply(context.Background(), gateway.ShardOf(d, shards), b); err != nil {
		f.t.Fatal(err)
	}
}

func (f *fixture) get(path string) (int, string) {
	f.t.Helper()
	resp, err := http.Get("http://" + f.srv.Addr().String() + path)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

func TestHealthReadinessMetrics(t *testing.T) {
	f := newFixture(t)
	if code, body := f.get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, _ := f.get("/readyz"); code != http.StatusServiceUnavailable {
		t.Fatalf("/readyz before SetReady: %d, want 503", code)
	}
	f.srv.SetReady(true)
	if code, _ := f.get("/readyz"); code != 200 {
		t.Fatalf("/readyz after SetReady: %d, want 200", code)
	}
	if code, body := f.get("/metrics"); code != 200 || !strings.Contains(body, "fleetgate_test_total 0") {
		t.Fatalf("/metrics: %d\n%s", code, body)
	}
	if code, body := f.get("/v1/status"); code != 200 || !strings.Contains(body, `"gateway": "gw-adm"`) {
		t.Fatalf("/v1/status: %d\n%s", code, body)
	}
	if code, _ := f.get("/v1/devices/x"); code != http.StatusNotFound {
		t.Fatalf("/v1/devices/x (never seen): %d, want 404", code)
	}
}

// The API derives online, suspect and offline at the store's now.
func TestDeviceStates(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.connect("dev-a")
	f.clock.Advance(suspect - time.Second)
	f.connect("dev-b")
	f.clock.Advance(2 * time.Second) // dev-a has been quiet for suspect+1s

	states := map[string]gateway.State{}
	for _, id := range []string{"dev-a", "dev-b"} {
		raw, err := f.client.Device(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		var d admin.Device
		if err := json.Unmarshal(raw, &d); err != nil {
			t.Fatal(err)
		}
		states[id] = d.State
	}
	if states["dev-a"] != gateway.Suspect || states["dev-b"] != gateway.Online {
		t.Fatalf("states %v, want dev-a suspect and dev-b online", states)
	}
	page, err := f.client.Devices(ctx, admin.DeviceQuery{State: "suspect", Limit: 10})
	if err != nil || len(page.Devices) != 1 || page.Devices[0].Device != "dev-a" {
		t.Fatalf("list suspect: %+v %v, want dev-a alone", page, err)
	}
	f.clock.Advance(lease)
	raw, err := f.client.Device(ctx, "dev-b")
	if err != nil || !strings.Contains(string(raw), `"state": "offline"`) {
		t.Fatalf("dev-b after its lease: %s %v, want offline", raw, err)
	}
	for _, bad := range []string{"/v1/devices/bad%20id", "/v1/devices?state=gone", "/v1/devices?limit=0", "/v1/events?since=-1s", "/v1/events?cursor=1-0", "/v1/events?cursor=1-0,x-1,0", "/v1/events?cursor=1-0,1-,0"} {
		if code, body := f.get(bad); code != http.StatusBadRequest || !strings.Contains(body, `"error"`) {
			t.Fatalf("%s: %d %s, want 400 with an error", bad, code, body)
		}
	}
}

// Paging /v1/events with a small limit returns every event once, in time
// order, across shards.
func TestEventsCursorNeverSkips(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	start := f.clock.Now()
	const n = 30
	for i := range n {
		f.connect(fmt.Sprintf("dev-%02d", i))
		f.clock.Advance(time.Millisecond * time.Duration(1+i%3))
	}
	var got []string
	cursor := ""
	since := f.clock.Now().Sub(start) + time.Second
	for page := 0; page < 100; page++ {
		p, err := f.client.Events(ctx, cursor, since, 4)
		if err != nil {
			t.Fatal(err)
		}
		if len(p.Events) > 4 {
			t.Fatalf("page of %d events, limit 4", len(p.Events))
		}
		for i, e := range p.Events {
			if i > 0 && e.At.Before(p.Events[i-1].At) {
				t.Fatalf("page out of time order: %+v", p.Events)
			}
			got = append(got, string(e.Device))
		}
		cursor = p.Cursor
		if len(p.Events) == 0 {
			break
		}
	}
	if len(got) != n {
		t.Fatalf("paged %d events, want %d: %v", len(got), n, got)
	}
	seen := map[string]bool{}
	for _, d := range got {
		if seen[d] {
			t.Fatalf("event of %s returned twice: %v", d, got)
		}
		seen[d] = true
	}
}

func TestSessionsPage(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	for i := range 5 {
		ev := gateway.Evidence{Device: gateway.DeviceID(fmt.Sprintf("dev-%d", i)), Session: "coap/default", Kind: gateway.Renew, ObservedAt: f.clock.Now(), Protocol: "coap"}
		if err := f.table.Observe(ctx, ev); err != nil {
			t.Fatal(err)
		}
	}
	var page admin.SessionPage
	code, body := f.get("/v1/sessions?limit=2")
	if err := json.Unmarshal([]byte(body), &page); code != 200 || err != nil || page.Total != 5 || len(page.Sessions) != 2 {
		t.Fatalf("/v1/sessions?limit=2: %d %s", code, body)
	}
}

// write writes one write of dev straight into the store, through gateway
// gw, at the clock's now.
func (f *fixture) write(gw, dev string, session gateway.SessionID, kind gateway.Kind) {
	f.t.Helper()
	d := gateway.DeviceID(dev)
	b := gateway.Batch{Gateway: gw, Epoch: 1, Lease: lease, Writes: []gateway.Write{{Device: d, Session: session, Kind: kind}}}
	if _, err := f.store.Apply(context.Background(), gateway.ShardOf(d, shards), b); err != nil {
		f.t.Fatal(err)
	}
}

// GET /v1/devices lists by ID, of a prefix, or by last change (newest
// first), filters by the protocol of each device's last session, and
// refuses what the store cannot answer with 400; /v1/status counts the
// suspect devices of the fleet, /v1/gateways the sessions of each
// gateway.
func TestDevicesOrdersAndFilters(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	f.write("gw-adm", "pump-2", "coap/default", gateway.Connect)
	f.clock.Advance(time.Second)
	f.write("gw-adm", "pump-1", "gw-adm/1/1", gateway.Connect)
	f.clock.Advance(time.Second)
	f.write("gw-b", "valve-1", "lorawan/default", gateway.Connect)
	f.clock.Advance(time.Second)
	f.write("gw-adm", "pump-3", "gw-adm/mqtt", gateway.Connect)
	f.clock.Advance(suspect - 2500*time.Millisecond) // pump-2 is suspect, 45.5 s after its connect
	ids := func(q admin.DeviceQuery) []string {
		t.Helper()
		var out []string
		for range 20 {
			p, err := f.client.Devices(ctx, q)
			if err != nil {
				t.Fatalf("%+v: %v", q, err)
			}
			for _, d := range p.Devices {
				out = append(out, string(d.Device))
			}
			if p.Next == "" {
				return out
			}
			q.Cursor = p.Next
		}
		t.Fatalf("%+v: no end", q)
		return nil
	}
	for _, c := range []struct {
		q    admin.DeviceQuery
		want string
	}{
		{admin.DeviceQuery{}, "pump-1 pump-2 pump-3 valve-1"},
		{admin.DeviceQuery{Limit: 1}, "pump-1 pump-2 pump-3 valve-1"},
		{admin.DeviceQuery{Order: "changed", Limit: 2}, "pump-3 valve-1 pump-1 pump-2"},
		{admin.DeviceQuery{Prefix: "pump", Limit: 2}, "pump-1 pump-2 pump-3"},
		{admin.DeviceQuery{Prefix: "valve-"}, "valve-1"},
		{admin.DeviceQuery{Protocol: "mqtt", Limit: 1}, "pump-1 pump-3"},
		{admin.DeviceQuery{Protocol: "coap"}, "pump-2"},
		{admin.DeviceQuery{Protocol: "lorawan", Order: "changed"}, "valve-1"},
		{admin.DeviceQuery{State: "suspect", Order: "changed"}, "pump-2"},
		{admin.DeviceQuery{State: "offline"}, ""},
	} {
		if got := strings.Join(ids(c.q), " "); got != c.want {
			t.Errorf("%+v: %q, want %q", c.q, got, c.want)
		}
	}
	for _, bad := range []string{"/v1/devices?order=size", "/v1/devices?order=changed&prefix=pump", "/v1/devices?prefix=a%2Fb",
		"/v1/devices?protocol=a%2Fb", "/v1/devices?cursor=nonsense", "/v1/devices?order=changed&cursor=id:pump-1"} {
		if code, body := f.get(bad); code != http.StatusBadRequest || !strings.Contains(body, `"error"`) {
			t.Errorf("%s: %d %s, want 400 with an error", bad, code, body)
		}
	}

	var st struct {
		Fleet gateway.Counts `json:"fleet"`
	}
	if err := f.client.Status(ctx, &st); err != nil {
		t.Fatal(err)
	}
	if st.Fleet != (gateway.Counts{Online: 4, Suspect: 1}) {
		t.Errorf("/v1/status fleet %+v, want 4 online of which 1 suspect", st.Fleet)
	}
	l, err := f.client.Gateways(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int64{}
	for _, g := range l.Gateways {
		got[g.ID] = g.Sessions
	}
	if len(got) != 2 || got["gw-adm"] != 3 || got["gw-b"] != 1 {
		t.Errorf("/v1/gateways sessions %v, want gw-adm 3 and gw-b 1", got)
	}
}
