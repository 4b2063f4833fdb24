package admin_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/internal/testcert"
)

// selfSigned returns a server TLS config for 127.0.0.1 and a client
// config that trusts it.
func selfSigned(t *testing.T) (server, client *tls.Config) {
	c := testcert.New(t)
	return c.Server, c.Client
}

func serveSecure(t *testing.T, token string, tc *tls.Config) *admin.Server {
	t.Helper()
	return serveAdminWith(t, admin.Options{Token: token, TLS: tc, Status: func() admin.Status { return admin.Status{Gateway: "gw-sec"} }})
}

// With a token, every path but the probes needs it, over HTTPS when
// configured; the query client sends it.
func TestAdminTokenAndTLS(t *testing.T) {
	const token = "0123456789abcdef-token"
	srvTLS, cliTLS := selfSigned(t)
	srv := serveSecure(t, token, srvTLS)
	base := "https://" + srv.Addr().String()
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: cliTLS}, Timeout: 5 * time.Second}
	get := func(path, auth string) int {
		t.Helper()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503, "/metrics": 401, "/v1/status": 401, "/v1/devices": 401} {
		if got := get(path, ""); got != want {
			t.Errorf("%s without a token: %d, want %d", path, got, want)
		}
	}
	for _, bad := range []string{"Bearer wrong", "Bearer " + token + "x", token, "Basic " + token} {
		if got := get("/v1/status", bad); got != 401 {
			t.Errorf("Authorization %q: %d, want 401", bad, got)
		}
	}
	if got := get("/v1/status", "Bearer "+token); got != 200 {
		t.Errorf("with the token: %d", got)
	}
	if got := get("/metrics", "Bearer "+token); got != 200 {
		t.Errorf("/metrics with the token: %d", got)
	}
	// Plain HTTP on the TLS port gets nowhere.
	if resp, err := http.Get("http://" + srv.Addr().String() + "/v1/status"); err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP answered on the TLS port")
		}
	}
	// The query client.
	var st map[string]any
	c := admin.NewClient(srv.Addr().String()).WithAuth(token, cliTLS)
	if err := c.Status(context.Background(), &st); err != nil || st["gateway"] != "gw-sec" {
		t.Fatalf("client with the token: %v %v", st, err)
	}
	var ae *admin.Error
	if err := admin.NewClient(srv.Addr().String()).WithAuth("", cliTLS).Status(context.Background(), &st); !errors.As(err, &ae) || ae.Code != 401 {
		t.Fatalf("client without the token: %v", err)
	}
}

// A client that opens a connection and sends nothing is cut off by the
// read timeouts instead of holding the connection for ever.
func TestAdminSlowClientCutOff(t *testing.T) {
	srv := serveSecure(t, "", nil)
	c, err := net.Dial("tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if _, err := c.Write([]byte("GET /healthz HTTP/1.1\r\nHost: x\r\n")); err != nil { // never ends the headers
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(15 * time.Second))
	start := time.Now()
	_, err = c.Read(make([]byte, 512))
	if took := time.Since(start); err == nil && took > 12*time.Second {
		t.Fatalf("connection still open after %v", took)
	}
	if took := time.Since(start); took > 12*time.Second {
		t.Fatalf("cut off after %v, want about the 5 s header timeout", took)
	}
}

// On a loopback address the API answers only requests whose Host names
// a loopback address and its port: a web page that reaches it through a
// name rebound to 127.0.0.1 sends that name and gets 421, probes and
// metrics included, token or not. No answer carries a CORS header, and
// a preflight is refused.
func TestAdminHostCheck(t *testing.T) {
	for _, token := range []string{"", "0123456789abcdef-token"} {
		srv := serveSecure(t, token, nil)
		_, port, _ := net.SplitHostPort(srv.Addr().String())
		do := func(method, path, host string) int {
			t.Helper()
			req, _ := http.NewRequest(method, "http://"+srv.Addr().String()+path, nil)
			req.Host = host
			req.Header.Set("Origin", "https://page.example")
			req.Header.Set("Access-Control-Request-Method", http.MethodGet)
			if token != "" && method == http.MethodGet {
				req.Header.Set("Authorization", "Bearer "+token)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatalf("%s %s (Host %s): %v", method, path, host, err)
			}
			resp.Body.Close()
			for k := range resp.Header {
				if strings.HasPrefix(k, "Access-Control-") {
					t.Errorf("%s %s: CORS header %s: %v", method, path, k, resp.Header[k])
				}
			}
			return resp.StatusCode
		}
		get := func(path, host string) int { t.Helper(); return do(http.MethodGet, path, host) }
		if code := do(http.MethodOptions, "/v1/status", "127.0.0.1:"+port); code/100 == 2 {
			t.Errorf("token %q: preflight answered %d", token, code)
		}
		for _, host := range []string{"rebind.example:" + port, "rebind.example", "127.0.0.1:1", "10.1.2.3:" + port} {
			for _, path := range []string{"/healthz", "/metrics", "/v1/status"} {
				if got := get(path, host); got != http.StatusMisdirectedRequest {
					t.Errorf("token %q: %s with Host %s: %d, want 421", token, path, host, got)
				}
			}
		}
		for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "[::1]:" + port} {
			if got := get("/v1/status", host); got != http.StatusOK {
				t.Errorf("token %q: Host %s: %d, want 200", token, host, got)
			}
		}
	}
}
