package admin_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/fleetgate/fleetgate/admin"
	"github.com/fleetgate/fleetgate/gateway"
)

// A watch stream lives longer than the server's write timeout: that
// timeout bounds each write of a stream, not the whole answer. With a
// write timeout of 500 ms the stream stays open for three times as long,
// sends its keep-alives, and then still delivers an event.
func TestWatchOutlivesWriteTimeout(t *testing.T) {
	const writeTimeout = 500 * time.Millisecond
	store := embeddedStore(t, 0)
	srv := serveAdminWith(t, admin.Options{Store: store, WriteTimeout: writeTimeout})
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+srv.Addr().String()+"/v1/watch?format=jsonl&keepalive=100ms", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	start := time.Now()
	lines := make(chan string, 1000)
	ended := make(chan error, 1)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			lines <- sc.Text()
		}
		ended <- errors.Join(sc.Err(), io.EOF)
	}()
	keepAlives := 0
	for time.Since(start) < 3*writeTimeout {
		select {
		case l := <-lines:
			if l != `{"keepalive":true}` {
				t.Fatalf("unexpected line %q", l)
			}
			keepAlives++
		case err := <-ended:
			t.Fatalf("stream ended after %v (%d keep-alives): %v", time.Since(start).Round(time.Millisecond), keepAlives, err)
		case <-time.After(5 * time.Second):
			t.Fatalf("no keep-alive for 5s")
		}
	}
	connect(t, store, "gw", "late")
	for {
		select {
		case l := <-lines:
			if strings.HasPrefix(l, `{"device":"late"`) {
				t.Logf("event after %v, %d keep-alives before it", time.Since(start).Round(time.Millisecond), keepAlives)
				return
			}
		case err := <-ended:
			t.Fatalf("stream ended after %v before the event: %v", time.Since(start).Round(time.Millisecond), err)
		case <-ctx.Done():
			t.Fatal("no event within 20s")
		}
	}
}

// A consumer that stops reading is cut off: each write of a stream must
// end within the write timeout, so a stream whose client reads nothing
// ends instead of holding its goroutine, its store reads and its
// connection for ever.
func TestWatchCutsOffAReaderThatStops(t *testing.T) {
	const writeTimeout = 500 * time.Millisecond
	store := embeddedStore(t, 0)
	// about 14 MB of events: far more than the socket buffers of both
	// ends hold (4 MB at most on the sender)
	for i := range 20 {
		connect(t, store, "gw", ids(fmt.Sprintf("stall%d", i), 3000)...)
	}
	srv := serveAdminWith(t, admin.Options{Store: store, WriteTimeout: writeTimeout})
	d := net.Dialer{Control: func(_, _ string, c syscall.RawConn) error {
		var serr error
		err := c.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096) })
		return errors.Join(err, serr)
	}}
	conn, err := d.DialContext(t.Context(), "tcp", srv.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	// from the start of the logs, so that the stream has all of them to send
	cur := make(gateway.Cursor, shards)
	for i := range cur {
		cur[i].ID = "0"
	}
	if _, err := fmt.Fprintf(conn, "GET /v1/watch?format=jsonl&cursor=%s HTTP/1.1\r\nHost: %s\r\n\r\n", cur.String(), srv.Addr()); err != nil {
		t.Fatal(err)
	}
	// read nothing for 3 write timeouts, then everything there is
	time.Sleep(3 * writeTimeout)
	_ = conn.SetReadDeadline(time.Now().Add(15 * time.Second))
	n, err := io.Copy(io.Discard, conn)
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		t.Fatalf("the stream still ran 15s after its reader stalled (%d bytes read)", n)
	case n > 8<<20:
		t.Fatalf("%d bytes read after the stall: the stream was not cut off", n)
	}
	t.Logf("%d bytes read after the stall, then %v", n, err)
}
