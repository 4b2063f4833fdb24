package auth_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
)

// NewPasswords checks a local client's password as the devices file
// checks a device's: the right one passes, a wrong one and an unknown
// name get the same refusal, and no name has a PSK.
func TestNewPasswordsChecks(t *testing.T) {
	p, err := auth.NewPasswords(map[string]string{"node-red": hash4(t, "nr-secret"), "telegraf": hash4(t, "tg-secret")})
	if err != nil {
		t.Fatal(err)
	}
	if err := p.CheckPassword("node-red", []byte("nr-secret")); err != nil {
		t.Fatalf("right password: %v", err)
	}
	for _, c := range []struct{ name, password string }{
		{"node-red", "tg-secret"},
		{"telegraf", "nr-secret"},
		{"grafana", "nr-secret"},
	} {
		if err := p.CheckPassword(gateway.DeviceID(c.name), []byte(c.password)); !errors.Is(err, gateway.ErrUnauthorized) {
			t.Errorf("%s with a wrong password: %v, want ErrUnauthorized", c.name, err)
		}
	}
	if _, _, err := p.PSK([]byte("node-red")); !errors.Is(err, gateway.ErrUnauthorized) {
		t.Errorf("PSK of a password-only name: %v", err)
	}
	if p.Revision("node-red") == "" || p.Revision("grafana") != "" {
		t.Errorf("revisions: listed %q, unlisted %q", p.Revision("node-red"), p.Revision("grafana"))
	}
}

func TestNewPasswordsRefuses(t *testing.T) {
	good := hash4(t, "pw")
	for _, c := range []struct {
		name    string
		hashes  map[string]string
		want    string
		secrets []string
	}{
		{"bad name", map[string]string{"node red": good}, `password of "node red": name: invalid device id`, nil},
		{"not a hash", map[string]string{"nr": "plaintext-password"}, `password of "nr": not a bcrypt hash`, []string{"plaintext-password"}},
		{"cost too high", map[string]string{"nr": "$2a$32$" + strings.Repeat("a", 53)}, `password of "nr": bcrypt cost 32 is not in 4..31`, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := auth.NewPasswords(c.hashes)
			if err == nil || !strings.HasPrefix(err.Error(), c.want) {
				t.Fatalf("error %v, want prefix %q", err, c.want)
			}
			for _, s := range c.secrets {
				if strings.Contains(err.Error(), s) {
					t.Fatalf("the error quotes the hash: %v", err)
				}
			}
		})
	}
	if err := auth.CheckHash(good); err != nil {
		t.Errorf("CheckHash of a good hash: %v", err)
	}
	if err := auth.CheckHash("x"); err == nil {
		t.Error("CheckHash took \"x\"")
	}
}

// Set swaps the set of a Reloadable: a changed hash changes the name's
// revision and its password, a removed name is refused.
func TestReloadableSet(t *testing.T) {
	first, err := auth.NewPasswords(map[string]string{"nr": hash4(t, "one"), "tg": hash4(t, "tg")})
	if err != nil {
		t.Fatal(err)
	}
	r := auth.NewReloadable(first)
	if err := r.CheckPassword("nr", []byte("one")); err != nil {
		t.Fatal(err)
	}
	rev := r.Revision("nr")
	second, err := auth.NewPasswords(map[string]string{"nr": hash4(t, "two")})
	if err != nil {
		t.Fatal(err)
	}
	r.Set(second)
	if r.Current() != second || r.Revision("nr") == rev {
		t.Fatal("Set did not replace the set")
	}
	// The new password first: a wrong one would hold the name in backoff.
	if err := r.CheckPassword("nr", []byte("two")); err != nil {
		t.Errorf("the new password after Set: %v", err)
	}
	if err := r.CheckPassword("nr", []byte("one")); !errors.Is(err, gateway.ErrUnauthorized) {
		t.Errorf("the old password after Set: %v", err)
	}
	if err := r.CheckPassword("tg", []byte("tg")); !errors.Is(err, gateway.ErrUnauthorized) {
		t.Errorf("a removed name after Set: %v", err)
	}
}
