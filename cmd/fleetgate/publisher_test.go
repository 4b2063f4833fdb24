package main

import (
	"context"
	"fmt"
	"net"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// startMosquitto runs an anonymous mosquitto on a free loopback port
// until the test ends and returns its address.
func startMosquitto(t *testing.T) string {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		bin = "/usr/sbin/mosquitto"
	}
	dir := t.TempDir()
	addr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	_, port, _ := net.SplitHostPort(addr)
	user := "mosquitto"
	if os.Geteuid() == 0 {
		user = "root" // as root it would drop to a user that cannot read dir
	}
	conf := fmt.Sprintf("listener %s 127.0.0.1\nallow_anonymous true\nuser %s\nlog_dest file %s\n", port, user, filepath.Join(dir, "log"))
	if err := os.WriteFile(filepath.Join(dir, "m.conf"), []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "-c", filepath.Join(dir, "m.conf"))
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatalf("mosquitto (make test installs it): %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	waitFor(t, 10*time.Second, "mosquitto listening", func() bool {
		c, err := net.DialTimeout("tcp", addr, 100*time.Millisecond)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return addr
}

// A gateway with events.mqtt publishes its devices' presence, retained,
// to the broker.
func TestGatewayPublishesToBroker(t *testing.T) {
	t.Parallel()
	srv := redistest.Start(t)
	broker := startMosquitto(t)
	gw := newGateway(t, "gw-p", srv.Addr, fastTiming)
	f, err := os.OpenFile(gw.config, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(f, "events:\n  mqtt: { url: \"mqtt://%s\", topic_prefix: site-p }\n", broker)
	f.Close()
	gw.start()
	device{t: t, id: "dev-p"}.heartbeat(gw.coapAddr)

	var mu sync.Mutex
	got := map[string]string{}
	u, _ := url.Parse("mqtt://" + broker)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	cm, err := autopaho.NewConnection(ctx, autopaho.ClientConfig{
		ServerUrls: []*url.URL{u}, KeepAlive: 30, CleanStartOnInitialConnection: true,
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: "site-p/presence/+", QoS: 1}}})
		},
		ClientConfig: paho.ClientConfig{ClientID: "e2e-sub", OnPublishReceived: []func(paho.PublishReceived) (bool, error){
			func(pr paho.PublishReceived) (bool, error) {
				mu.Lock()
				got[pr.Packet.Topic] = string(pr.Packet.Payload)
				mu.Unlock()
				return true, nil
			}}},
	})
	if err != nil {
		t.Fatal(err)
	}
	defer cm.Disconnect(context.Background())
	waitFor(t, 20*time.Second, "dev-p's presence on the broker", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return strings.Contains(got["site-p/presence/dev-p"], `"state":"online"`)
	})
	code, out, _ := runCLI(t, "status", "--addr", gw.admin, "--json")
	if code != 0 || !strings.Contains(out, `"publisher"`) || !strings.Contains(out, `"connected": true`) {
		t.Errorf("status shows no connected publisher:\n%s", out)
	}
}
