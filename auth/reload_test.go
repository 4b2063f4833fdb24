package auth_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/fleetgate/fleetgate/auth"
	"github.com/fleetgate/fleetgate/gateway"
)

const (
	keyA = "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
	keyB = "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"
)

// setFile is a devices file with the device "common" keyed key, a device
// only it has, and "mqtt" with password "pw" (hash).
func setFile(name, key, hash string) string {
	return fmt.Sprintf("devices:\n  - id: common\n    psk: \"hex:%s\"\n  - id: only-%s\n    psk: \"hex:%s\"\n  - id: mqtt\n    password_bcrypt: %q\n", key, name, key, hash)
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestReloadKeepsTheOldSetOnAnInvalidFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devices.yaml")
	hash := hash4(t, "pw")
	writeFile(t, path, setFile("a", keyA, hash))
	d, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	r := auth.NewReloadable(d)

	writeFile(t, path, setFile("a", keyA, hash)+"  - id: broken\n")
	err = r.Reload(path, auth.LeaseBounds{})
	want := "devices file not reloaded, keeping the 3 devices in use:\n" + path + ":8:5: devices[3]: device \"broken\" has neither psk nor password_bcrypt"
	if err == nil || err.Error() != want {
		t.Fatalf("Reload of an invalid file: %v\nwant: %s", err, want)
	}
	if r.Current() != d {
		t.Fatal("an invalid file replaced the set")
	}
	if _, _, err := r.PSK([]byte("only-a")); err != nil {
		t.Fatalf("the kept set lost a device: %v", err)
	}

	if err := r.Reload(filepath.Join(t.TempDir(), "missing.yaml"), auth.LeaseBounds{}); !errors.Is(err, os.ErrNotExist) || r.Current() != d {
		t.Fatalf("Reload of a missing file: %v (set replaced: %v)", err, r.Current() != d)
	}

	writeFile(t, path, setFile("b", keyB, hash))
	if err := r.Reload(path, auth.LeaseBounds{}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := r.PSK([]byte("only-a")); !errors.Is(err, gateway.ErrUnauthorized) {
		t.Fatalf("a device removed from the file still has its key: %v", err)
	}
	if _, key, err := r.PSK([]byte("common")); err != nil || fmt.Sprintf("%x", key) != keyB {
		t.Fatalf("PSK(common) after the reload = %x, %v; want the new key", key, err)
	}
	if err := r.CheckPassword("mqtt", []byte("pw")); err != nil {
		t.Fatal(err)
	}
}

// Readers never see a half-swapped set or an invalid file's contents
// while the file is reloaded under them (run with -race).
func TestReloadConcurrent(t *testing.T) {
	path := filepath.Join(t.TempDir(), "devices.yaml")
	hash := hash4(t, "pw")
	files := []string{
		setFile("a", keyA, hash),
		setFile("b", keyB, hash),
		setFile("a", keyA, hash) + "  - id: common\n    psk: \"hex:" + keyB + "\"\n", // invalid: duplicate
	}
	writeFile(t, path, files[0])
	d, err := auth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	r := auth.NewReloadable(d)

	const readers, maxReads = 4, 200_000
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range readers {
		wg.Go(func() {
			for i := range maxReads {
				select {
				case <-stop:
					return
				default:
				}
				checkSnapshot(t, r.Current())
				if _, _, err := r.PSK([]byte("common")); err != nil {
					t.Errorf("PSK(common): %v", err)
					return
				}
				if i%500 == 0 {
					if err := r.CheckPassword("mqtt", []byte("pw")); err != nil {
						t.Errorf("CheckPassword: %v", err)
						return
					}
				}
			}
		})
	}
	for i := range 90 {
		f := i % len(files)
		before := r.Current()
		writeFile(t, path, files[f])
		err := r.Reload(path, auth.LeaseBounds{})
		switch {
		case f == 2 && (err == nil || r.Current() != before):
			t.Errorf("reload %d of an invalid file: %v, set replaced: %v", i, err, r.Current() != before)
		case f != 2 && err != nil:
			t.Errorf("reload %d: %v", i, err)
		}
	}
	close(stop)
	wg.Wait()
}

// checkSnapshot checks that d is wholly set a or wholly set b.
func checkSnapshot(t *testing.T, d *auth.Devices) {
	t.Helper()
	_, key, err := d.PSK([]byte("common"))
	if err != nil {
		t.Errorf("PSK(common): %v", err)
		return
	}
	want := map[string]string{keyA: "only-a", keyB: "only-b"}[fmt.Sprintf("%x", key)]
	ids := d.IDs()
	if want == "" || len(ids) != 3 || !strings.Contains(fmt.Sprint(ids), want) {
		t.Errorf("inconsistent set: common has key %x, devices %v", key, ids)
	}
}

func TestNewReloadableNil(t *testing.T) {
	defer func() {
		if recover() == nil {
			t.Fatal("NewReloadable(nil) did not panic")
		}
	}()
	auth.NewReloadable(nil)
}
