package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// coapDTLSClient is libcoap's coap-client built with OpenSSL (DTLS).
func coapDTLSClient(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("coap-client-openssl")
	if err != nil {
		t.Fatal("coap-client-openssl missing: run 'make deps' (apt-get install -y libcoap3-bin)")
	}
	return p
}

// The documented first secure devices, with the real tools from key to
// "online": a key from openssl rand for a CoAP device over DTLS
// (coap-client -u ID -k KEY), a password hashed by fleetgate
// hash-password for an MQTT device over TLS (mosquitto_pub --cafile with
// the certificate fleetgate gen-cert wrote, -u ID -P PASSWORD and no
// client ID), both listed online by fleetgate devices list.
func TestFirstSecureDevices(t *testing.T) {
	dir := t.TempDir()
	key := strings.TrimSpace(runTool(t, "openssl", "rand", "-hex", "16"))
	password := strings.TrimSpace(runTool(t, "openssl", "rand", "-base64", "18"))
	hash := exec.Command(binary, "hash-password", "--cost", "4")
	hash.Stdin = strings.NewReader(password + "\n")
	h, err := hash.Output()
	if err != nil {
		t.Fatalf("hash-password: %v", err)
	}
	devices := filepath.Join(dir, "devices.yaml")
	body := fmt.Sprintf("devices:\n  - id: sensor-0001\n    psk: \"text:%s\"\n  - id: meter-0002\n    password_bcrypt: %q\n", key, strings.TrimSpace(string(h)))
	if err := os.WriteFile(devices, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	cert, certKey := filepath.Join(dir, "mqtt.crt"), filepath.Join(dir, "mqtt.key")
	out := runTool(t, binary, "gen-cert", "--cert", cert, "--key", certKey)
	fp := regexp.MustCompile(`(?m)^SHA-256 fingerprint: ([0-9A-F:]{95})$`).FindStringSubmatch(out)
	if fp == nil {
		t.Fatalf("gen-cert printed no fingerprint:\n%s", out)
	}
	if o := runTool(t, "openssl", "x509", "-in", cert, "-noout", "-fingerprint", "-sha256"); !strings.Contains(o, fp[1]) {
		t.Fatalf("openssl's fingerprint %s, gen-cert's %s", o, fp[1])
	}

	g := newGateway(t, "gw-secure", "", visitTiming)
	g.useDevicesFile(devices)
	tlsAddr := fmt.Sprintf("127.0.0.1:%d", redistest.FreePort(t))
	b, err := os.ReadFile(g.config)
	if err != nil {
		t.Fatal(err)
	}
	cfg := strings.Replace(string(b), fmt.Sprintf("mqtt: { tcp: %q }", g.mqttAddr),
		fmt.Sprintf("mqtt: { tcp: %q, tls: %q, cert_file: %q, key_file: %q }", g.mqttAddr, tlsAddr, cert, certKey), 1)
	if err := os.WriteFile(g.config, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	g.start()

	if o := runTool(t, coapDTLSClient(t), "-m", "post", "-B", "5", "-u", "sensor-0001", "-k", key, "coaps://"+g.dtlsAddr+"/hb"); strings.Contains(o, "4.") {
		t.Fatalf("coap-client over DTLS:\n%s", o)
	}
	// mosquitto_pub -l stays connected while its input is open.
	_, port, _ := strings.Cut(tlsAddr, ":")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pub := exec.CommandContext(ctx, "mosquitto_pub", "--cafile", cert, "-h", "localhost", "-p", port,
		"-u", "meter-0002", "-P", password, "-t", "devices/meter-0002/hello", "-l")
	in, err := pub.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	var pubOut syncBuffer
	pub.Stdout, pub.Stderr = &pubOut, &pubOut
	if err := pub.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { in.Close(); _ = pub.Wait() }()
	if _, err := in.Write([]byte("hello\n")); err != nil {
		t.Fatal(err)
	}

	var list string
	waitFor(t, 15*time.Second, "both devices online in fleetgate devices list", func() bool {
		o, err := exec.Command(binary, "devices", "list", "--addr", g.admin, "--state", "online").CombinedOutput()
		list = string(o)
		return err == nil && strings.Contains(list, "sensor-0001") && strings.Contains(list, "meter-0002")
	})
	if !strings.Contains(list, "2 devices: 2 online") {
		t.Fatalf("devices list:\n%s\nmosquitto_pub: %s", list, pubOut.String())
	}
}
