package admin_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
)

const testToken = "test-token-0123456789"

// fileCredentials is admin.Credentials over a devices file (auth.Edit),
// as the gateway's is, without its reload.
type fileCredentials struct{ path string }

func (c fileCredentials) PutCredentials(d gateway.DeviceID, req admin.CredentialRequest) (admin.CredentialResult, error) {
	s := auth.Secrets{PSK: req.PSK, PasswordHash: req.PasswordBcrypt, Lease: req.Lease}
	res := admin.CredentialResult{Device: d}
	if req.PSK == admin.GeneratePSK {
		s.PSK, _ = auth.GeneratePSK()
		res.PSK = s.PSK
	}
	_, err := auth.Edit(c.path, auth.Add, d, s, auth.LeaseBounds{})
	if res.Created = err == nil; err != nil && strings.Contains(err.Error(), auth.ErrExists.Error()) {
		_, err = auth.Edit(c.path, auth.Rotate, d, s, auth.LeaseBounds{})
	}
	return res, credentialsError(err)
}

func (c fileCredentials) DeleteCredentials(d gateway.DeviceID) error {
	_, err := auth.Edit(c.path, auth.Remove, d, auth.Secrets{}, auth.LeaseBounds{})
	return credentialsError(err)
}

// credentialsError wraps auth.Edit's errors in the ones admin answers by.
func credentialsError(err error) error {
	switch {
	case errors.Is(err, auth.ErrAbsent):
		return fmt.Errorf("%w: %w", admin.ErrNoCredentials, err)
	case errors.Is(err, auth.ErrInvalid):
		return fmt.Errorf("%w: %w", admin.ErrBadCredentials, err)
	}
	return err
}

// withCredentials gives the fixture a token and the credentials API over
// an empty devices file.
func withCredentials(t *testing.T, token string) func(*admin.Options) {
	path := filepath.Join(t.TempDir(), "devices.yaml")
	if err := os.WriteFile(path, []byte("devices: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return func(o *admin.Options) {
		o.Token, o.Credentials = token, fileCredentials{path}
	}
}

// call sends method path with body and token ("" for none) and returns
// the status and the body.
func (f *fixture) call(method, path, body, token string) (int, string) {
	f.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var r io.Reader
	if body != "" {
		r = strings.NewReader(body)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+f.srv.Addr().String()+path, r)
	if err != nil {
		f.t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestForgetNeedsToken: without a bearer token configured, DELETE
// /v1/devices/{id} is refused (403) and the device stays; the
// credentials API is not served at all unless configured.
func TestForgetNeedsToken(t *testing.T) {
	f := newFixture(t)
	f.connect("dev-1")
	if code, body := f.call(http.MethodDelete, "/v1/devices/dev-1", "", ""); code != http.StatusForbidden || !strings.Contains(body, "listen.admin.token_file") {
		t.Errorf("DELETE without a token configured: %d %s, want 403 naming token_file", code, body)
	}
	if code, _ := f.get("/v1/devices/dev-1"); code != http.StatusOK {
		t.Errorf("device after a refused forget: %d, want 200", code)
	}
	if code, _ := f.call(http.MethodPost, "/v1/credentials/dev-1", `{"psk":"generate"}`, ""); code != http.StatusMethodNotAllowed && code != http.StatusNotFound {
		t.Errorf("POST /v1/credentials without credentials_api: %d, want 404 or 405", code)
	}
}

// TestForgetAndCredentials: with a token, DELETE /v1/devices/{id} forgets
// the device (its removed event answered, 404 after), the credentials
// API adds (201, the generated key answered once), rotates (200) and
// removes (200, then 404) a device in the devices file, refuses bad
// bodies and keys (400), and every change needs the bearer token (401)
// and a loopback Host (421).
func TestForgetAndCredentials(t *testing.T) {
	f := newFixture(t, withCredentials(t, testToken))
	f.connect("dev-1")
	if code, _ := f.call(http.MethodDelete, "/v1/devices/dev-1", "", ""); code != http.StatusUnauthorized {
		t.Errorf("DELETE without the bearer: %d, want 401", code)
	}
	code, body := f.call(http.MethodDelete, "/v1/devices/dev-1", "", testToken)
	var env gateway.Envelope
	if err := json.Unmarshal([]byte(body), &env); code != http.StatusOK || err != nil || env.State != gateway.Removed || env.Reason != gateway.ReasonForget || env.Gateway != "gw-adm" {
		t.Fatalf("DELETE /v1/devices/dev-1: %d %s", code, body)
	}
	if code, _ := f.call(http.MethodGet, "/v1/devices/dev-1", "", testToken); code != http.StatusNotFound {
		t.Errorf("device after forget: %d, want 404", code)
	}
	if code, _ := f.call(http.MethodDelete, "/v1/devices/dev-1", "", testToken); code != http.StatusNotFound {
		t.Errorf("second forget: %d, want 404", code)
	}

	code, body = f.call(http.MethodPost, "/v1/credentials/dev-2", `{"psk":"generate"}`, testToken)
	var res admin.CredentialResult
	if err := json.Unmarshal([]byte(body), &res); code != http.StatusCreated || err != nil || !res.Created || !strings.HasPrefix(res.PSK, "hex:") || len(res.PSK) != 4+64 {
		t.Fatalf("POST generate: %d %s", code, body)
	}
	hash, err := auth.HashPassword([]byte("dev-2-password"), auth.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	code, body = f.call(http.MethodPost, "/v1/credentials/dev-2", `{"password_bcrypt":"`+hash+`"}`, testToken)
	res = admin.CredentialResult{}
	if err := json.Unmarshal([]byte(body), &res); code != http.StatusOK || err != nil || res.Created || res.PSK != "" {
		t.Errorf("POST rotate: %d %s", code, body)
	}
	// A lease alone changes a listed device's lease; it adds no device.
	if code, body := f.call(http.MethodPost, "/v1/credentials/dev-2", `{"lease":"none"}`, testToken); code != http.StatusOK {
		t.Errorf("POST a lease alone: %d %s", code, body)
	}
	if code, body := f.call(http.MethodPost, "/v1/credentials/dev-9", `{"lease":"2h"}`, testToken); code != http.StatusBadRequest || !strings.Contains(body, "no psk and no password") {
		t.Errorf("POST a lease alone for a new device: %d %s, want 400", code, body)
	}
	for _, bad := range []string{``, `{}`, `{"psk":"hex:00"}`, `{"psk":"generate","extra":1}`, `{"password":"a","password_bcrypt":"b"}`, `[1]`,
		`{"lease":"soon"}`, `{"lease":"0s"}`, `{"psk":"generate","lease":"-1h"}`, `{"lease":7200}`} {
		if code, body := f.call(http.MethodPost, "/v1/credentials/dev-3", bad, testToken); code != http.StatusBadRequest || strings.Contains(body, "hex:00") {
			t.Errorf("POST %q: %d %s, want 400 without the key", bad, code, body)
		}
	}
	// A lease is judged by the provisioner, with the devices file's rules.
	for _, bad := range []string{`{"lease":"soon"}`, `{"lease":"0s"}`, `{"psk":"generate","lease":"-1h"}`} {
		if code, body := f.call(http.MethodPost, "/v1/credentials/dev-2", bad, testToken); code != http.StatusBadRequest || !strings.Contains(body, "lease") {
			t.Errorf("POST %q: %d %s, want 400 naming the lease", bad, code, body)
		}
	}
	if code, _ := f.call(http.MethodPost, "/v1/credentials/bad%20id", `{"psk":"generate"}`, testToken); code != http.StatusBadRequest {
		t.Errorf("POST of a bad id: %d, want 400", code)
	}
	if code, body := f.call(http.MethodDelete, "/v1/credentials/dev-2", "", testToken); code != http.StatusOK || !strings.Contains(body, `"removed": true`) {
		t.Errorf("DELETE credentials: %d %s", code, body)
	}
	if code, _ := f.call(http.MethodDelete, "/v1/credentials/dev-2", "", testToken); code != http.StatusNotFound {
		t.Errorf("second DELETE credentials: %d, want 404", code)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.srv.Addr().String()+"/v1/credentials/dev-4", strings.NewReader(`{"psk":"generate"}`))
	req.Host = "evil.example"
	req.Header.Set("Authorization", "Bearer "+testToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMisdirectedRequest {
		t.Errorf("POST with a foreign Host: %d, want 421", resp.StatusCode)
	}
}

// FuzzDecodeCredentialRequest: the decoder never panics; a request it
// accepts has a secret, not both passwords, a password bcrypt takes;
// its errors never quote the psk or password sent. The seed corpus is
// testdata/fuzz/FuzzDecodeCredentialRequest.
func FuzzDecodeCredentialRequest(f *testing.F) {
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := admin.DecodeCredentialRequest(strings.NewReader(string(body)))
		if err != nil {
			var sent admin.CredentialRequest
			_ = json.Unmarshal(body, &sent)
			for _, secret := range []string{sent.PSK, sent.Password} {
				if len(secret) >= 8 && strings.Contains(err.Error(), secret) {
					t.Fatalf("error %q quotes a secret", err)
				}
			}
			return
		}
		switch {
		case req.PSK == "" && req.Password == "" && req.PasswordBcrypt == "" && req.Lease == "":
			t.Fatal("accepted a request without a secret or a lease")
		case req.Password != "" && req.PasswordBcrypt != "":
			t.Fatal("accepted both passwords")
		case len(req.Password) > auth.MaxPasswordLen: // admin's own limit is bcrypt's too
			t.Fatal("accepted a password bcrypt cannot take")
		}
	})
}
