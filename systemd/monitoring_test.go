package systemd

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/testcert"
)

const (
	dashboardFile = "../docs/grafana/fleetgate.json"
	alertsFile    = "../docs/prometheus/alerts.yml"
	scrapeFile    = "../docs/prometheus/prometheus.yml"
)

func TestAlertRules(t *testing.T) {
	if out, err := run(t, "promtool", "check", "rules", alertsFile); err != nil {
		t.Fatalf("promtool check rules: %v\n%s", err, out)
	}
	if out, err := run(t, "promtool", "test", "rules", "testdata/alerts_test.yml"); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
	if out, err := run(t, "promtool", "check", "config", scrapeFile); err != nil {
		t.Fatalf("promtool check config %s: %v\n%s", scrapeFile, err, out)
	}
}

// dashboard is the part of a Grafana dashboard the tests read.
type dashboard struct {
	UID    string `json:"uid"`
	Title  string `json:"title"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr       string `json:"expr"`
			Datasource struct {
				UID string `json:"uid"`
			} `json:"datasource"`
		} `json:"targets"`
	} `json:"panels"`
	Templating struct {
		List []struct {
			Definition string `json:"definition"`
		} `json:"list"`
	} `json:"templating"`
}

func readDashboard(t *testing.T) dashboard {
	t.Helper()
	b, err := os.ReadFile(dashboardFile)
	if err != nil {
		t.Fatal(err)
	}
	var d dashboard
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("%s: %v", dashboardFile, err)
	}
	return d
}

func TestDashboardShape(t *testing.T) {
	d := readDashboard(t)
	if d.UID != "fleetgate" || d.Title == "" {
		t.Fatalf("uid %q title %q", d.UID, d.Title)
	}
	ids := map[int]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, q := range p.Targets {
			if q.Datasource.UID != "${datasource}" || q.Expr == "" {
				t.Errorf("panel %q: query %q on data source %q, want the ${datasource} variable", p.Title, q.Expr, q.Datasource.UID)
			}
		}
	}
}

// metricNames returns the fleetgate, process and Go runtime metric names
// named in exprs.
func metricNames(exprs []string) []string {
	re := regexp.MustCompile(`\b(?:fleetgate|process|go)_[a-z0-9_]+`)
	set := map[string]bool{}
	for _, e := range exprs {
		for _, m := range re.FindAllString(e, -1) {
			set[m] = true
		}
	}
	var out []string
	for m := range set {
		out = append(out, m)
	}
	sort.Strings(out)
	return out
}

// Every metric the dashboard (its panels and its variables) and the
// alerts query is exported by the /metrics of a running gateway (embedded
// store, runner on, CoAP and MQTT listening, MQTT over TLS, the events
// publisher configured, the canary on, the shipped udpline adapter
// running).
func TestDashboardAndAlertsQueryExportedMetrics(t *testing.T) {
	var exprs []string
	d := readDashboard(t)
	for _, p := range d.Panels {
		for _, q := range p.Targets {
			exprs = append(exprs, q.Expr)
		}
	}
	for _, v := range d.Templating.List {
		exprs = append(exprs, v.Definition)
	}
	alerts, err := os.ReadFile(alertsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(alerts), "\n") {
		if s := strings.TrimSpace(l); strings.HasPrefix(s, "expr:") {
			exprs = append(exprs, s)
		}
	}
	exported := scrape(t)
	names := metricNames(exprs)
	if len(names) < 15 {
		t.Fatalf("only %d metric names found in the queries: %v", len(names), names)
	}
	for _, n := range names {
		base := n
		for _, suf := range []string{"_bucket", "_sum", "_count"} {
			if exported[strings.TrimSuffix(n, suf)] == "histogram" {
				base = strings.TrimSuffix(n, suf)
			}
		}
		if exported[base] == "" {
			t.Errorf("%s is queried but not exported by /metrics", n)
		}
	}
}

func freePort(t *testing.T, network string) int {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// scrape runs a gateway and returns its /metrics families by name, with
// their types.
func scrape(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	admin := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp"))
	certFile, keyFile := testcert.New(t).Write(t, dir)
	cfg := fmt.Sprintf(`gateway: { id: gw-metrics, state_dir: %q }
store: { backend: embedded }
runner: { enabled: true }
events: { mqtt: { url: "mqtt://127.0.0.1:%d" } }
canary: { enabled: true }
listen:
  coap: { udp: "127.0.0.1:%d" }
  mqtt: { tcp: "127.0.0.1:%d", tls: "127.0.0.1:%d", cert_file: %q, key_file: %q }
  admin: { http: %q }
auth: { allow_anonymous: true, devices_file: "" }
plugins:
  adapters:
    - { name: line, path: %q, config: { listen: "127.0.0.1:%d" } }
`, filepath.Join(dir, "state"), freePort(t, "tcp"), freePort(t, "udp"), freePort(t, "tcp"), freePort(t, "tcp"), certFile, keyFile, admin, udpline, freePort(t, "udp"))
	path := filepath.Join(dir, "fleetgate.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(binary, "run", "-c", path)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("gateway log:\n%s", logs.String())
		}
	}()
	var body []byte
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get("http://" + admin + "/metrics")
		if err == nil {
			body, err = io.ReadAll(resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode == http.StatusOK && strings.Contains(string(body), "fleetgate_runner_") &&
				strings.Contains(string(body), `fleetgate_adapter_up{adapter="line"} 1`) {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no /metrics with the runner's and the running adapter's metrics at %s within 30s: %v", admin, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	families := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(string(body)))
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 4 && f[0] == "#" && f[1] == "TYPE" {
			families[f[2]] = f[3]
		}
	}
	return families
}
