package uplink

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/internal/statefile"

	"github.com/redis/go-redis/v9"
	bolt "go.etcd.io/bbolt"
	"go.uber.org/goleak"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/redistest"
	"github.com/fleetgate/fleetgate/store/redisstore"
)

// The crash test re-executes the test binary as a gateway that writes to
// its outbox while Redis is down; these variables tell the child what to
// do.
const (
	envCrashState  = "UPLINK_CRASH_STATE"
	envCrashRedis  = "UPLINK_CRASH_REDIS"
	envCrashPrefix = "UPLINK_CRASH_PREFIX"
	crashPerRound  = 20
)

func TestMain(m *testing.M) {
	if path := os.Getenv(envCrashState); path != "" {
		if err := crashChild(path, os.Getenv(envCrashRedis), os.Getenv(envCrashPrefix)); err != nil {
			fmt.Fprintln(os.Stderr, "crash child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// crashChild opens the state file and the Redis store, says "ready",
// waits for a line on stdin (the parent kills Redis meanwhile), then
// flushes rounds of new sessions plus renewals of older ones into the
// outbox, printing "acked <n>" once sessions prefix-0 .. prefix-(n-1)
// are committed. It runs until it is killed.
func crashChild(path, addr, prefix string) error {
	log := slog.New(slog.NewTextHandler(os.Stderr, nil))
	db, err := statefile.Open(path, log, Migrations)
	if err != nil {
		return err
	}
	ob, err := OpenOutbox(db, OutboxOptions{Shards: testShards, Logger: log})
	if err != nil {
		return err
	}
	ctx := context.Background()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond})
	store, err := redisstore.Open(ctx, c, redisstore.Options{Prefix: "crash", Shards: testShards, Logger: log})
	if err != nil {
		return err
	}
	u := New(store, ob, Options{Gateway: "gw-crash", Epoch: 1, MaxBatch: 100, Timeout: time.Second, Logger: log})
	fmt.Println("ready")
	if _, err := bufio.NewReader(os.Stdin).ReadString('\n'); err != nil {
		return err
	}
	for r := 0; r < 100_000; r++ {
		for i := range crashPerRound {
			d := gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, r*crashPerRound+i))
			if err := u.Enqueue(ctx, evidence(d, gateway.Connect, time.Now())); err != nil {
				return err
			}
		}
		old := gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, rand.IntN((r+1)*crashPerRound)))
		if err := u.Enqueue(ctx, evidence(old, gateway.Renew, time.Now())); err != nil {
			return err
		}
		if err := u.Flush(ctx); err != nil {
			return err
		}
		if st := u.Status(); st.Pending != 0 || st.OutboxSessions < (r+1)*crashPerRound {
			return fmt.Errorf("flush with Redis down left status %+v", st)
		}
		fmt.Printf("acked %d\n", (r+1)*crashPerRound)
	}
	return fmt.Errorf("not killed")
}

// TestOutboxSurvivesKill9 kills (SIGKILL) a child gateway while it writes
// its outbox during an outage, at a random point, several times over the
// same file: every session the child had acknowledged is in the outbox
// afterwards, the file passes its check, and nothing is moved aside.
func TestOutboxSurvivesKill9(t *testing.T) {
	srv := redistest.Start(t)
	dir := t.TempDir()
	path := filepath.Join(dir, "state.db")
	total := 0
	for round := range 3 {
		srv.Restart()
		prefix := fmt.Sprintf("r%d", round)
		acked := runCrashChild(t, srv, path, prefix, 3+rand.IntN(25))

		var logs bytes.Buffer
		db, err := statefile.Open(path, slog.New(slog.NewTextHandler(&logs, nil)), Migrations)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(logs.String(), "checked after an unclean stop") {
			t.Errorf("round %d: no check after kill -9; log: %s", round, logs.String())
		}
		ob, err := OpenOutbox(db, OutboxOptions{Shards: testShards})
		if err != nil {
			t.Fatal(err)
		}
		missing := 0
		err = db.View(func(tx *bolt.Tx) error {
			sb := tx.Bucket(bucketSessions)
			for i := range acked {
				k := key{gateway.DeviceID(fmt.Sprintf("%s-%d", prefix, i)), "coap/default"}
				v := sb.Get(sessionKey(k))
				if v == nil {
					missing++
					continue
				}
				if _, err := decodeRecord(sessionKey(k), v); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if missing > 0 {
			t.Fatalf("round %d: %d of %d acknowledged sessions missing after kill -9", round, missing, acked)
		}
		total += acked
		if ob.Len() < total {
			t.Fatalf("round %d: outbox holds %d sessions, %d were acknowledged", round, ob.Len(), total)
		}
		if err := db.Close(); err != nil {
			t.Fatal(err)
		}
		t.Logf("round %d: killed after %d acknowledged sessions, outbox holds %d", round, acked, ob.Len())
	}
	if aside, _ := filepath.Glob(path + ".corrupt-*"); len(aside) != 0 {
		t.Fatalf("state file moved aside after kill -9: %v", aside)
	}
}

// runCrashChild runs one child until it has acknowledged kills rounds,
// kills it with SIGKILL and returns the sessions it had acknowledged.
func runCrashChild(t *testing.T, srv *redistest.Server, path, prefix string, kills int) int {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashState+"="+path, envCrashRedis+"="+srv.Addr, envCrashPrefix+"="+prefix)
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	killed := false
	defer func() {
		if !killed {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
		}
	}()
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	next := func() string {
		select {
		case l, ok := <-lines:
			if !ok {
				t.Fatalf("child exited early; stderr:\n%s", stderr.String())
			}
			return l
		case <-time.After(30 * time.Second):
			t.Fatalf("child silent for 30s; stderr:\n%s", stderr.String())
		}
		return ""
	}
	if l := next(); l != "ready" {
		t.Fatalf("child said %q, want ready; stderr:\n%s", l, stderr.String())
	}
	srv.Kill()
	if _, err := io.WriteString(stdin, "go\n"); err != nil {
		t.Fatal(err)
	}
	acked := 0
	for range kills {
		if _, err := fmt.Sscanf(next(), "acked %d", &acked); err != nil {
			t.Fatalf("child output: %v; stderr:\n%s", err, stderr.String())
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	killed = true
	_ = cmd.Wait()
	// Drain what the child printed after the last line read (committed
	// too, but only the count read is asserted) so the reader ends.
	for range lines {
	}
	return acked
}

// lockedBuffer is a bytes.Buffer safe for a child's writer goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}
