package embedded

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	bolt "go.etcd.io/bbolt"

	"github.com/fleetgate/fleetgate/gateway"
)

// The crash child is this test binary re-executed with these variables:
// the bbolt file to write and the seed of its random batches.
const (
	crashDBEnv   = "FLEETGATE_EMBEDDED_CRASH_DB"
	crashSeedEnv = "FLEETGATE_EMBEDDED_CRASH_SEED"
	crashShards  = 4
	crashDevices = 12 // per shard
	crashLease   = 40 * time.Millisecond
)

func crashDevicesOf(shard int) []gateway.DeviceID {
	ds := make([]gateway.DeviceID, crashDevices)
	for i := range ds {
		ds[i] = deviceIn("crash", shard, crashShards, i)
	}
	return ds
}

// TestCrash kills a child process that applies and reaps batches in a
// loop at a random moment (SIGKILL), then checks that the file is
// consistent: every device's events alternate with ver +1 and match its
// record, the deadline index matches the records, and the store opens
// and keeps counting. Three rounds run on the same file.
func TestCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "crash.db")
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 0))
	for round := range 3 {
		k := 20 + rng.IntN(200)
		n, stderr := runCrashChild(t, path, seed+int64(round), k)
		if n < k {
			t.Fatalf("round %d: child stopped after %d of %d batches:\n%s", round, n, k, stderr)
		}
		db := openDB(t, path)
		checkConsistent(t, db, crashShards, true)
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
	}

	// The store opens on the file, and every device's ver continues.
	db := openDB(t, path)
	defer db.Close()
	s, err := Open(db, Options{Shards: crashShards})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for shard := range crashShards {
		b := gateway.Batch{Gateway: "gw-after", Epoch: 1, Lease: time.Hour}
		for _, d := range crashDevicesOf(shard) {
			b.Writes = append(b.Writes, connect(d, "after", 0))
		}
		if _, err := s.Apply(ctx, shard, b); err != nil {
			t.Fatal(err)
		}
	}
	checkConsistent(t, db, crashShards, true)
}

// runCrashChild starts the child on path, reads its progress until it has
// committed k batches (or ends), kills it with SIGKILL and reaps it. It
// returns the batches seen and the child's stderr.
func runCrashChild(t *testing.T, path string, seed int64, k int) (int, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), crashDBEnv+"="+path, crashSeedEnv+"="+strconv.FormatInt(seed, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A child that hangs is killed after a minute, which ends the read loop.
	watchdog := time.AfterFunc(time.Minute, func() { cmd.Process.Kill() })
	defer watchdog.Stop()
	n := 0
	for sc := bufio.NewScanner(out); n < k && sc.Scan(); {
		if strings.HasPrefix(sc.Text(), "batch ") {
			n++
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("kill child: %v", err)
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); n >= k && (!ok || ee.ProcessState.Exited()) {
		t.Fatalf("child was not killed: %v", err)
	}
	return n, stderr.String()
}

// TestCrashChild is the child process of TestCrash; it does nothing unless
// TestCrash started it.
func TestCrashChild(t *testing.T) {
	path := os.Getenv(crashDBEnv)
	if path == "" {
		return
	}
	seed, err := strconv.ParseInt(os.Getenv(crashSeedEnv), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	db := openDB(t, path)
	s, err := Open(db, Options{Shards: crashShards, EventsMaxLen: 1 << 40})
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(uint64(seed), 1))
	devices := make([][]gateway.DeviceID, crashShards)
	for shard := range devices {
		devices[shard] = crashDevicesOf(shard)
	}
	kinds := []gateway.Kind{gateway.Connect, gateway.Renew, gateway.Renew, gateway.Leave}
	sessions := []gateway.SessionID{"a", "b", "c"}
	ctx := context.Background()
	end := time.Now().Add(2 * time.Minute)
	for i := 0; i < 1_000_000 && time.Now().Before(end); i++ {
		shard := rng.IntN(crashShards)
		b := gateway.Batch{Gateway: fmt.Sprintf("gw-%d", rng.IntN(2)), Epoch: 1, Lease: crashLease, Replay: rng.IntN(4) == 0}
		for range 1 + rng.IntN(40) {
			b.Writes = append(b.Writes, gateway.Write{
				Device:  devices[shard][rng.IntN(crashDevices)],
				Session: sessions[rng.IntN(len(sessions))],
				Kind:    kinds[rng.IntN(len(kinds))],
				Age:     time.Duration(rng.IntN(int(crashLease * 5 / 4))),
			})
		}
		if _, err := s.Apply(ctx, shard, b); err != nil {
			t.Fatal(err)
		}
		if rng.IntN(3) == 0 {
			if _, err := s.Reap(ctx, rng.IntN(crashShards), 1+rng.IntN(8)); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Printf("batch %d\n", i)
	}
}

// TestCheckerDetects shows that the consistency check used after a crash
// fails on each kind of damage a torn write would leave.
func TestCheckerDetects(t *testing.T) {
	d := gateway.DeviceID("dev-9")
	for name, damage := range map[string]func(sh shard) error{
		"event without its state change": func(sh shard) error {
			e := gateway.Event{Device: d, State: gateway.Offline, Ver: 2, At: t0, Reason: gateway.ReasonLeave}
			return sh.ev.Put(eventID{ms: uint64(t0.UnixMilli()) + 1}.key(), encodeEvent(&e))
		},
		"state change without its event": func(sh shard) error {
			r, _, err := sh.record(d)
			if err != nil {
				return err
			}
			r.online, r.sessions = false, nil
			return sh.dev.Put([]byte(d), encodeRecord(&r))
		},
		"missing index entry": func(sh shard) error {
			k, _ := sh.exp.Cursor().First()
			return sh.exp.Delete(k)
		},
		"stray index entry": func(sh shard) error {
			return sh.exp.Put(expKey(1, "ghost"), nil)
		},
	} {
		t.Run(name, func(t *testing.T) {
			f := newFixture(t, Options{Shards: 1})
			f.apply(0, batch("gw", 1, connect(d, "a", 0)))
			checkConsistent(t, f.db, 1, true)
			err := f.db.Update(func(tx *bolt.Tx) error {
				sh, err := openShard(tx, 0)
				if err != nil {
					return err
				}
				if err := damage(sh); err != nil {
					return err
				}
				if err := checkShard(sh, true); err == nil {
					return errors.New("damage not detected")
				}
				return nil
			})
			if err != nil {
				t.Fatal(err)
			}
		})
	}
}
