package auth_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
	"golang.org/x/crypto/bcrypt"
)

var update = flag.Bool("update", false, "rewrite testdata/bad/*.err from the current errors")

// secretRE finds the secrets written in a test file, to check that no
// error repeats them.
var secretRE = regexp.MustCompile(`(?m)^\s*-?\s*(?:psk|password_bcrypt|password):\s*"?([^"\n]+)"?\s*$`)

// Every file in testdata/bad fails to load with exactly the text of the
// .err file next to it, and the error repeats none of its secrets.
func TestBadFiles(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) < 15 {
		t.Fatalf("found %d bad files, want at least 15", len(files))
	}
	for _, f := range files {
		t.Run(strings.TrimSuffix(filepath.Base(f), ".yaml"), func(t *testing.T) {
			d, err := auth.Load(f)
			if err == nil {
				t.Fatalf("%s loaded %d devices without error", f, d.Len())
			}
			if d != nil {
				t.Errorf("Load returned a set with its error")
			}
			golden := strings.TrimSuffix(f, ".yaml") + ".err"
			if *update {
				if err := os.WriteFile(golden, []byte(err.Error()+"\n"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, rerr := os.ReadFile(golden)
			if rerr != nil {
				t.Fatal(rerr)
			}
			if got := err.Error() + "\n"; got != string(want) {
				t.Errorf("error:\n%s\nwant (%s):\n%s", got, golden, want)
			}
			data, rerr := os.ReadFile(f)
			if rerr != nil {
				t.Fatal(rerr)
			}
			for _, m := range secretRE.FindAllSubmatch(data, -1) {
				secret := string(m[1])
				if len(secret) >= 8 && strings.Contains(err.Error(), secret) {
					t.Errorf("the error repeats the secret %q", secret)
				}
			}
		})
	}
}

func TestLoadMissingFile(t *testing.T) {
	_, err := auth.Load(filepath.Join(t.TempDir(), "devices.yaml"))
	if !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("got %v, want a wrapped os.ErrNotExist", err)
	}
}

// The example file shipped for operators loads, and its documented
// secrets work.
func TestExampleFile(t *testing.T) {
	d, err := auth.Load("testdata/devices.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if got, want := d.IDs(), []gateway.DeviceID{"gw.bridge_40", "meter:0042", "sensor-17"}; !slices.Equal(got, want) {
		t.Fatalf("IDs %v, want %v", got, want)
	}
	id, key, err := d.PSK([]byte("sensor-17"))
	if err != nil || id != "sensor-17" || hex.EncodeToString(key) != "5065ce2dc59914bc4d80b9f640723c9bb69471e3dc887dcaa7358ecf9a54370a" {
		t.Fatalf("PSK(sensor-17) = %q, %x, %v", id, key, err)
	}
	if _, key, err := d.PSK([]byte("meter:0042")); err != nil || len(key) != 16 {
		t.Fatalf("PSK(meter:0042) = %x, %v", key, err)
	}
	if err := d.CheckPassword("sensor-17", []byte("example-password-17")); err != nil {
		t.Fatalf("CheckPassword(sensor-17): %v", err)
	}
	if err := d.CheckPassword("gw.bridge_40", []byte("example-password-17")); !errors.Is(err, gateway.ErrUnauthorized) {
		t.Fatalf("another device's password: %v", err)
	}
}

// hash4 returns a bcrypt hash of password at the lowest cost, to keep the
// tests fast.
func hash4(t testing.TB, password string) string {
	t.Helper()
	h, err := auth.HashPassword([]byte(password), auth.MinCost)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

const (
	keyBoth = "00112233445566778899aabbccddeeff"
	keyPSK  = "ffeeddccbbaa9988776655443322110000112233445566778899aabbccddeeff"
)

func testSet(t *testing.T) *auth.Devices {
	t.Helper()
	file := fmt.Sprintf(`devices:
  - id: both
    psk: "hex:%s"
    password_bcrypt: %q
  - id: psk-only
    psk: "hex:%s"
  - id: mqtt-only
    password_bcrypt: %q
`, keyBoth, hash4(t, "both-password"), keyPSK, hash4(t, "mqtt-password"))
	d, err := auth.Parse("devices.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	return d
}

func TestCheckPassword(t *testing.T) {
	d := testSet(t)
	long := []byte(strings.Repeat("x", auth.MaxPasswordLen+1))
	refused := []struct {
		name     string
		device   gateway.DeviceID
		password []byte
	}{
		{"wrong password", "both", []byte("both-passwore")},
		{"another device's password", "both", []byte("mqtt-password")},
		{"empty password", "both", nil},
		{"unknown device", "nobody", []byte("both-password")},
		{"device without a password", "psk-only", []byte("")},
		{"device without a password, its key as password", "psk-only", []byte(keyPSK)},
		{"overlong password", "mqtt-only", long},
	}
	var texts []string
	for _, c := range refused {
		err := d.CheckPassword(c.device, c.password)
		if !errors.Is(err, gateway.ErrUnauthorized) {
			t.Errorf("%s: got %v, want ErrUnauthorized", c.name, err)
			continue
		}
		texts = append(texts, err.Error())
	}
	// One text for every refusal: it never says which part was wrong.
	if len(slices.Compact(slices.Clone(texts))) != 1 {
		t.Errorf("refusals differ: %q", texts)
	}
	// A fresh set: after the failures above, "both" is in its backoff.
	d = testSet(t)
	for device, password := range map[gateway.DeviceID]string{"both": "both-password", "mqtt-only": "mqtt-password"} {
		if err := d.CheckPassword(device, []byte(password)); err != nil {
			t.Errorf("CheckPassword(%s): %v", device, err)
		}
	}
}

// bcrypt ignores bytes after the 72nd; CheckPassword refuses a longer
// password even when its first 72 bytes are right.
func TestCheckPasswordOverlongPrefix(t *testing.T) {
	password := strings.Repeat("y", auth.MaxPasswordLen)
	file := fmt.Sprintf("devices:\n  - id: d\n    password_bcrypt: %q\n", hash4(t, password))
	d, err := auth.Parse("devices.yaml", []byte(file))
	if err != nil {
		t.Fatal(err)
	}
	if err := d.CheckPassword("d", []byte(password)); err != nil {
		t.Fatalf("72-byte password: %v", err)
	}
	if err := d.CheckPassword("d", []byte(password+"z")); !errors.Is(err, gateway.ErrUnauthorized) {
		t.Fatalf("73-byte password: %v", err)
	}
}

func TestPSK(t *testing.T) {
	d := testSet(t)
	for identity, want := range map[string]string{"both": keyBoth, "psk-only": keyPSK} {
		id, key, err := d.PSK([]byte(identity))
		if err != nil || string(id) != identity || hex.EncodeToString(key) != want {
			t.Errorf("PSK(%s) = %q, %x, %v", identity, id, key, err)
		}
	}
	var texts []string
	for _, identity := range []string{"mqtt-only", "nobody", "", "both ", "b\x00oth", strings.Repeat("a", 200)} {
		id, key, err := d.PSK([]byte(identity))
		if !errors.Is(err, gateway.ErrUnauthorized) || id != "" || key != nil {
			t.Errorf("PSK(%q) = %q, %x, %v; want ErrUnauthorized", identity, id, key, err)
			continue
		}
		texts = append(texts, err.Error())
	}
	if len(slices.Compact(slices.Clone(texts))) != 1 {
		t.Errorf("refusals differ: %q", texts)
	}
}

// A caller that scribbles on a returned key does not change the set.
func TestPSKReturnsACopy(t *testing.T) {
	d := testSet(t)
	_, key, err := d.PSK([]byte("both"))
	if err != nil {
		t.Fatal(err)
	}
	clear(key)
	_, again, err := d.PSK([]byte("both"))
	if err != nil || hex.EncodeToString(again) != keyBoth {
		t.Fatalf("after changing a returned key: %x, %v", again, err)
	}
}

func TestParseAccepts(t *testing.T) {
	h := hash4(t, "pw")
	cases := []struct {
		name string
		yml  string
		ids  []gateway.DeviceID
	}{
		{"empty list", "devices: []\n", nil},
		{"null list", "devices:\n", nil},
		{"every entry commented out", "devices:\n  # - id: old\n  #   psk: \"hex:00\"\n", nil},
		{"flow style", `{devices: [{id: a, psk: "base64:AAECAwQFBgcICQoLDA0ODw=="}]}`, []gateway.DeviceID{"a"}},
		{"numeric-looking id", "devices:\n  - id: 0042\n    psk: \"hex:" + keyBoth + "\"\n", []gateway.DeviceID{"0042"}},
		{"upper-case hex", "devices:\n  - id: a\n    psk: \"hex:" + strings.ToUpper(keyBoth) + "\"\n", []gateway.DeviceID{"a"}},
		{"64-byte key", "devices:\n  - id: a\n    psk: hex:" + keyPSK + "\n", []gateway.DeviceID{"a"}},
		{"text key", "devices:\n  - id: a\n    psk: \"text:3f9c2a0b7d4e1f6a8c5b2d9e0f1a3b4c\"\n", []gateway.DeviceID{"a"}},
		{"2b and 2y hashes", "devices:\n  - id: b\n    password_bcrypt: \"$2b" + h[3:] + "\"\n  - id: y\n    password_bcrypt: \"$2y" + h[3:] + "\"\n", []gateway.DeviceID{"b", "y"}},
		{"aliased key", "devices:\n  - id: a\n    psk: &k \"hex:" + keyBoth + "\"\n  - id: b\n    psk: *k\n", []gateway.DeviceID{"a", "b"}},
		{"longest id", "devices:\n  - id: " + strings.Repeat("z", 128) + "\n    password_bcrypt: '" + h + "'\n", []gateway.DeviceID{gateway.DeviceID(strings.Repeat("z", 128))}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			d, err := auth.Parse("devices.yaml", []byte(c.yml))
			if err != nil {
				t.Fatal(err)
			}
			if got := d.IDs(); !slices.Equal(got, c.ids) || d.Len() != len(c.ids) {
				t.Fatalf("IDs %v (Len %d), want %v", got, d.Len(), c.ids)
			}
		})
	}
}

// The 2b and 2y spellings of a hash check like the 2a one.
func TestHashVersions(t *testing.T) {
	h := hash4(t, "pw")
	for _, v := range []string{"$2a", "$2b", "$2y"} {
		file := fmt.Sprintf("devices:\n  - id: d\n    password_bcrypt: %q\n", v+h[3:])
		d, err := auth.Parse("devices.yaml", []byte(file))
		if err != nil {
			t.Fatal(err)
		}
		if err := d.CheckPassword("d", []byte("pw")); err != nil {
			t.Errorf("%s: %v", v, err)
		}
	}
}

func TestHashPassword(t *testing.T) {
	h, err := auth.HashPassword([]byte("pw"), 5)
	if err != nil {
		t.Fatal(err)
	}
	if cost, err := bcrypt.Cost([]byte(h)); err != nil || cost != 5 {
		t.Fatalf("cost %d, %v; want 5", cost, err)
	}
	if err := bcrypt.CompareHashAndPassword([]byte(h), []byte("pw")); err != nil {
		t.Fatal(err)
	}
	other, err := auth.HashPassword([]byte("pw"), 5)
	if err != nil || other == h {
		t.Fatalf("a second hash of the same password is %q, %v: want a new salt", other, err)
	}
	for _, c := range []struct {
		password string
		cost     int
		want     string
	}{
		{"", 10, "hash password: the password is empty"},
		{strings.Repeat("s", 73), 10, "hash password: the password is 73 bytes, bcrypt takes at most 72"},
		{"pw", 3, "hash password: cost 3 is not in 4..31"},
		{"pw", 32, "hash password: cost 32 is not in 4..31"},
		{"pw", -1, "hash password: cost -1 is not in 4..31"},
	} {
		h, err := auth.HashPassword([]byte(c.password), c.cost)
		if err == nil || err.Error() != c.want {
			t.Errorf("HashPassword(%d bytes, %d) = %q, %v; want %q", len(c.password), c.cost, h, err, c.want)
		}
	}
}

// Errors never carry a secret, whichever field held it.
func TestErrorsHideSecrets(t *testing.T) {
	const secret = "Tr0ub4dor&3-this-is-a-secret"
	for _, yml := range []string{
		"devices:\n  - id: a\n    psk: \"hex:" + secret + "\"\n",
		"devices:\n  - id: a\n    psk: \"base64:" + secret + "\"\n",
		"devices:\n  - id: a\n    psk: \"" + secret + "\"\n",
		"devices:\n  - id: a\n    password_bcrypt: \"" + secret + "\"\n",
		"devices:\n  - id: a\n    password_bcrypt: \"$2a$10$" + secret + "\"\n",
		"devices:\n  - id: a\n    psk: [\"" + secret + "\"]\n",
		"devices:\n  - \"" + secret + "\"\n",
		"devices: \"" + secret + "\"\n",
	} {
		_, err := auth.Parse("devices.yaml", []byte(yml))
		if err == nil {
			t.Fatalf("accepted:\n%s", yml)
		}
		if strings.Contains(err.Error(), "Tr0ub4dor") {
			t.Errorf("error repeats the secret: %v", err)
		}
	}
}

// Every line of a multi-error report names the file.
func TestErrorLinesNameTheFile(t *testing.T) {
	data, err := os.ReadFile("testdata/bad/too_many_errors.yaml")
	if err != nil {
		t.Fatal(err)
	}
	_, err = auth.Parse("x.yaml", data)
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != 21 {
		t.Fatalf("%d lines, want 20 errors and a too-many line:\n%v", len(lines), err)
	}
	for _, l := range lines {
		if !strings.HasPrefix(l, "x.yaml:") {
			t.Errorf("line %q does not name the file", l)
		}
	}
	if !bytes.HasPrefix(data, []byte("devices:")) {
		t.Fatal("unexpected test file")
	}
}
