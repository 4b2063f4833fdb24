package mqttpub_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"math/big"
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

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
)

// broker is a mosquitto process on a free loopback port, with a config
// written by the test: plain and anonymous, or TLS with a password file.
type broker struct {
	t    testing.TB
	dir  string
	port int
	tls  bool
	cmd  *exec.Cmd
	// user and password of the password file (TLS brokers only)
	user, pass string
	ca         *x509.CertPool
}

func startBroker(t testing.TB, withTLS bool) *broker {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mosquitto", "/usr/local/sbin/mosquitto"} {
			if _, serr := os.Stat(p); serr == nil {
				bin, err = p, nil
			}
		}
	}
	if err != nil {
		t.Fatalf("mosquitto not found (make test installs it: apt-get install -y mosquitto): %v", err)
	}
	b := &broker{t: t, dir: t.TempDir(), port: redistest.FreePort(t), tls: withTLS}
	conf := []string{
		fmt.Sprintf("listener %d 127.0.0.1", b.port),
		"persistence true",
		"persistence_location " + b.dir + "/",
		"log_dest file " + filepath.Join(b.dir, "mosquitto.log"),
		"max_queued_messages 100000",
		// as root, mosquitto would drop to the mosquitto user, which
		// cannot read the test's private directory
		"user " + currentUser(),
	}
	if withTLS {
		b.user, b.pass = "publisher", "s3cret-pass"
		pw := filepath.Join(b.dir, "passwd")
		if out, err := exec.Command("mosquitto_passwd", "-b", "-c", pw, b.user, b.pass).CombinedOutput(); err != nil {
			t.Fatalf("mosquitto_passwd: %v\n%s", err, out)
		}
		cert, key := b.writeCert()
		conf = append(conf, "certfile "+cert, "keyfile "+key, "password_file "+pw, "allow_anonymous false")
	} else {
		conf = append(conf, "allow_anonymous true")
	}
	if err := os.WriteFile(filepath.Join(b.dir, "mosquitto.conf"), []byte(strings.Join(conf, "\n")+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	b.start(bin)
	t.Cleanup(b.kill)
	return b
}

func currentUser() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	if os.Geteuid() == 0 {
		return "root"
	}
	return "mosquitto"
}

func (b *broker) start(bin string) {
	b.t.Helper()
	b.cmd = exec.Command(bin, "-c", filepath.Join(b.dir, "mosquitto.conf"))
	b.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := b.cmd.Start(); err != nil {
		b.t.Fatalf("start mosquitto: %v", err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c, err := net.DialTimeout("tcp", b.addr(), 100*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	b.t.Fatalf("mosquitto not listening on %s after 10s:\n%s", b.addr(), b.log())
}

// stop ends the broker cleanly (it saves its retained messages).
func (b *broker) stop() {
	if b.cmd == nil {
		return
	}
	_ = b.cmd.Process.Signal(syscall.SIGTERM)
	_ = b.cmd.Wait()
	b.cmd = nil
}

func (b *broker) restart() {
	b.t.Helper()
	b.stop()
	b.start(b.cmdPath())
}

func (b *broker) cmdPath() string {
	p, err := exec.LookPath("mosquitto")
	if err != nil {
		return "/usr/sbin/mosquitto"
	}
	return p
}

func (b *broker) kill() {
	if b.cmd != nil {
		_ = b.cmd.Process.Kill()
		_ = b.cmd.Wait()
		b.cmd = nil
	}
}

func (b *broker) log() string {
	out, _ := os.ReadFile(filepath.Join(b.dir, "mosquitto.log"))
	return string(out)
}

func (b *broker) addr() string { return fmt.Sprintf("127.0.0.1:%d", b.port) }

func (b *broker) url() string {
	if b.tls {
		return "mqtts://" + b.addr()
	}
	return "mqtt://" + b.addr()
}

func (b *broker) tlsConfig() *tls.Config {
	if !b.tls {
		return nil
	}
	return &tls.Config{RootCAs: b.ca, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12}
}

// writeCert makes a self-signed certificate for 127.0.0.1.
func (b *broker) writeCert() (certFile, keyFile string) {
	b.t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		b.t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		b.t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	b.ca = x509.NewCertPool()
	b.ca.AddCert(cert)
	kb, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		b.t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(b.dir, "cert.pem"), filepath.Join(b.dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		b.t.Fatal(err)
	}
	return certFile, keyFile
}

// received is one message a subscriber got.
type received struct {
	topic    string
	retained bool
	env      gateway.Envelope
}

// subscriber is a paho.golang client subscribed to <prefix>/#.
type subscriber struct {
	mu   sync.Mutex
	msgs []received
	cm   *autopaho.ConnectionManager
}

func subscribe(t testing.TB, b *broker, prefix, topic string) *subscriber {
	t.Helper()
	s := &subscriber{}
	u, _ := url.Parse(strings.Replace(b.url(), "mqtts://", "tls://", 1))
	ctx, cancel := context.WithCancel(context.Background())
	subscribed := make(chan error, 1)
	cfg := autopaho.ClientConfig{
		ServerUrls: []*url.URL{u}, TlsCfg: b.tlsConfig(), KeepAlive: 30,
		CleanStartOnInitialConnection: false, SessionExpiryInterval: 600,
		ConnectRetryDelay: 100 * time.Millisecond,
		ConnectUsername:   b.user, ConnectPassword: []byte(b.pass),
		OnConnectionUp: func(cm *autopaho.ConnectionManager, _ *paho.Connack) {
			go func() {
				_, err := cm.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: prefix + "/" + topic, QoS: 1}}})
				select {
				case subscribed <- err:
				default:
				}
			}()
		},
		ClientConfig: paho.ClientConfig{
			ClientID: fmt.Sprintf("sub-%d", time.Now().UnixNano()),
			OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
				var env gateway.Envelope
				if err := json.Unmarshal(pr.Packet.Payload, &env); err != nil {
					t.Errorf("message on %s: %v: %q", pr.Packet.Topic, err, pr.Packet.Payload)
				}
				s.mu.Lock()
				s.msgs = append(s.msgs, received{topic: pr.Packet.Topic, retained: pr.Packet.Retain, env: env})
				s.mu.Unlock()
				return true, nil
			}},
		},
	}
	cm, err := autopaho.NewConnection(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.cm = cm
	t.Cleanup(func() {
		dctx, dc := context.WithTimeout(context.Background(), time.Second)
		defer dc()
		_ = cm.Disconnect(dctx)
		cancel()
	})
	select {
	case err := <-subscribed:
		if err != nil {
			t.Fatalf("subscribe: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("subscriber not subscribed after 10s:\n%s", b.log())
	}
	return s
}

func (s *subscriber) snapshot() []received {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]received(nil), s.msgs...)
}

// await waits (bounded) until cond holds over the messages received.
func (s *subscriber) await(t testing.TB, limit time.Duration, what string, cond func([]received) bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		if cond(s.snapshot()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s; received %d messages", limit, what, len(s.snapshot()))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
