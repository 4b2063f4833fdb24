package diskq

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/fleetgate/fleetgate/gateway"
)

// The crash child is this test binary run again with these variables:
// the queue's file, the round (its writers' names), the commit interval
// and the seed of its random choices.
const (
	envCrashDB    = "FLEETGATE_DISKQ_CRASH_DB"
	envCrashRound = "FLEETGATE_DISKQ_CRASH_ROUND"
	envCrashEvery = "FLEETGATE_DISKQ_CRASH_EVERY"
	envCrashSeed  = "FLEETGATE_DISKQ_CRASH_SEED"
	crashWriters  = 8
)

func TestMain(m *testing.M) {
	if path := os.Getenv(envCrashDB); path != "" {
		if err := crashChild(path); err != nil {
			fmt.Fprintln(os.Stderr, "crash child:", err)
			os.Exit(2)
		}
		os.Exit(0)
	}
	goleak.VerifyTestMain(m)
}

// crashChild puts batches of one to four messages from crashWriters
// goroutines, each writer's numbered in order (topic
// r<round>w<writer>/<n>), and prints "put <topic>" for each once its
// Put returned; one reader reads from the oldest and acknowledges about
// half of what it reads, printing "acking <topic>" before the Ack and
// "ack <topic>" once it returned. It runs until it is killed.
func crashChild(path string) error {
	round := os.Getenv(envCrashRound)
	every, err := time.ParseDuration(os.Getenv(envCrashEvery))
	if err != nil {
		return err
	}
	seed, err := strconv.ParseUint(os.Getenv(envCrashSeed), 10, 64)
	if err != nil {
		return err
	}
	q, err := Open(Options{Path: path, MaxBytes: 1 << 30, CommitInterval: every})
	if err != nil {
		return err
	}
	var out sync.Mutex
	say := func(verb string, topics []string) {
		var b strings.Builder
		for _, t := range topics {
			fmt.Fprintf(&b, "%s %s\n", verb, t)
		}
		out.Lock()
		defer out.Unlock()
		os.Stdout.WriteString(b.String())
	}
	ctx := context.Background()
	errs := make(chan error, crashWriters+1)
	for w := range crashWriters {
		go func() {
			rng := rand.New(rand.NewPCG(seed, uint64(w)))
			for n := 0; ; {
				batch := make([]gateway.Message, 1+rng.IntN(4))
				topics := make([]string, len(batch))
				for i := range batch {
					topics[i] = fmt.Sprintf("r%sw%d/%d", round, w, n)
					batch[i] = gateway.Message{Device: "dev-1", Topic: topics[i], Payload: make([]byte, rng.IntN(200)),
						QoS: 1, Received: time.Now(), Source: "mqtt"}
					n++
				}
				if _, err := q.Put(ctx, batch); err != nil {
					errs <- err
					return
				}
				say("put", topics)
			}
		}()
	}
	go func() {
		rng := rand.New(rand.NewPCG(seed, crashWriters))
		var after uint64
		for {
			got, err := q.Read(ctx, after, 1+rng.IntN(20))
			if err != nil {
				errs <- err
				return
			}
			var ids []uint64
			var topics []string
			for _, m := range got {
				if rng.IntN(2) == 0 {
					ids, topics = append(ids, m.ID), append(topics, m.Topic)
				}
				after = m.ID
			}
			say("acking", topics)
			if err := q.Ack(ids); err != nil {
				errs <- err
				return
			}
			say("ack", topics)
		}
	}()
	return <-errs
}

// TestCrash kills (SIGKILL) a child that puts and acknowledges in a
// loop, at a random point, reopens the file and checks that every
// message whose Put returned is there unless an Ack of it began, that
// none whose Ack returned is, that each writer's messages are in the order
// it put them, and that the IDs of a round are above those of the
// rounds before. Three rounds run on one file, with commit intervals 0,
// 2 ms and 0.
func TestCrash(t *testing.T) {
	path := filepath.Join(t.TempDir(), "bridge.db")
	seed := uint64(time.Now().UnixNano())
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(seed, 0))
	acked := map[string]bool{}
	acking := map[string]bool{}
	put := map[string]bool{}
	var lastID uint64
	for round, every := range []time.Duration{0, 2 * time.Millisecond, 0} {
		k := 200 + rng.IntN(1300)
		lines, stderr := runCrashChild(t, path, round, every, seed+uint64(round), k)
		puts := 0
		for _, l := range lines {
			verb, topic, _ := strings.Cut(l, " ")
			switch verb {
			case "put":
				put[topic] = true
				puts++
			case "acking":
				acking[topic] = true
			case "ack":
				acked[topic] = true
			default:
				t.Fatalf("round %d: child said %q\n%s", round, l, stderr)
			}
		}
		if puts < k {
			t.Fatalf("round %d: child stopped after %d of %d Puts:\n%s", round, puts, k, stderr)
		}
		q, err := Open(Options{Path: path, MaxBytes: 1 << 30})
		if err != nil {
			t.Fatal(err)
		}
		held, ids := readTopics(t, q)
		if err := q.Close(); err != nil {
			t.Fatal(err)
		}
		next := map[string]int{}
		for i, topic := range held {
			if acked[topic] {
				t.Errorf("round %d: %s acknowledged and read again after kill -9", round, topic)
			}
			writer, n, err := parseTopic(topic)
			if err != nil {
				t.Fatalf("round %d: read %q: %v", round, topic, err)
			}
			if n < next[writer] {
				t.Errorf("round %d: %s read after %s/%d", round, topic, writer, next[writer]-1)
			}
			next[writer] = n + 1
			if strings.HasPrefix(topic, fmt.Sprintf("r%dw", round)) && ids[i] <= lastID {
				t.Errorf("round %d: %s has ID %d, a round before handed out %d", round, topic, ids[i], lastID)
			}
		}
		missing := 0
		have := map[string]bool{}
		for _, topic := range held {
			have[topic] = true
		}
		for topic := range put {
			if !acking[topic] && !have[topic] {
				missing++
			}
		}
		if missing > 0 {
			t.Fatalf("round %d: %d messages whose Put returned are missing after kill -9", round, missing)
		}
		if len(ids) > 0 {
			lastID = max(lastID, ids[len(ids)-1])
		}
		t.Logf("round %d (commit interval %v): killed after %d Puts returned; %d messages put, %d acknowledged so far, %d held",
			round, every, puts, len(put), len(acked), len(held))
	}
}

// readTopics reads everything q holds: the topics and IDs in order.
func readTopics(t *testing.T, q *Queue) ([]string, []uint64) {
	t.Helper()
	var topics []string
	var ids []uint64
	var after uint64
	for {
		got, err := q.Read(done(), after, 1000)
		if len(got) == 0 {
			return topics, ids
		}
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range got {
			topics, ids = append(topics, m.Topic), append(ids, m.ID)
			after = m.ID
		}
	}
}

// parseTopic splits r<round>w<writer>/<n>.
func parseTopic(topic string) (string, int, error) {
	writer, num, ok := strings.Cut(topic, "/")
	n, err := strconv.Atoi(num)
	if !ok || err != nil {
		return "", 0, fmt.Errorf("not a crash child's topic")
	}
	return writer, n, nil
}

// runCrashChild starts the child on path, reads its lines until it has
// reported k Puts, kills it with SIGKILL, and returns every line it
// wrote (those after k too: each was written after its call returned)
// and its stderr.
func runCrashChild(t *testing.T, path string, round int, every time.Duration, seed uint64, k int) ([]string, string) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), envCrashDB+"="+path, envCrashRound+"="+strconv.Itoa(round),
		envCrashEvery+"="+every.String(), envCrashSeed+"="+strconv.FormatUint(seed, 10))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// A child that hangs is killed after two minutes, which ends the
	// reads.
	watchdog := time.AfterFunc(2*time.Minute, func() { cmd.Process.Kill() })
	defer watchdog.Stop()
	var lines []string
	puts := 0
	sc := bufio.NewScanner(out)
	for puts < k && sc.Scan() {
		lines = append(lines, sc.Text())
		if strings.HasPrefix(sc.Text(), "put ") {
			puts++
		}
	}
	if err := cmd.Process.Kill(); err != nil {
		t.Fatalf("kill child: %v", err)
	}
	for sc.Scan() {
		lines = append(lines, sc.Text())
	}
	err = cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ProcessState.Exited() {
		t.Fatalf("child was not killed: %v\n%s", err, stderr.String())
	}
	return lines, stderr.String()
}
