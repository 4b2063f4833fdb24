package admin

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"sync/atomic"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// The client side of /v1/snapshot and /v1/watch.

// ErrResync is returned by Watch when the cursor can no longer be served
// (410, or a resync message on the stream); it wraps
// gateway.ErrResyncRequired and names the reason.
type ErrResync struct{ ResyncBody }

func (e *ErrResync) Error() string {
	return fmt.Sprintf("admin api: resync required: shard %d: %s", e.Shard, e.Reason)
}

func (e *ErrResync) Unwrap() error { return gateway.ErrResyncRequired }

// Snapshot reads one page of /v1/snapshot (page "" for the first).
func (c *Client) Snapshot(ctx context.Context, state, page string, limit int) (SnapshotBody, error) {
	var b SnapshotBody
	err := c.get(ctx, "/v1/snapshot", pageQuery(state, "page", page, limit), &b)
	return b, err
}

// SnapshotAll reads every page of /v1/snapshot, handing each device to
// fn, and returns the snapshot's cursor.
func (c *Client) SnapshotAll(ctx context.Context, fn func(gateway.Envelope)) (string, error) {
	page, cursor := "", ""
	for {
		b, err := c.Snapshot(ctx, "", page, 10000)
		if err != nil {
			return "", err
		}
		for _, d := range b.Devices {
			fn(d)
		}
		cursor = b.Cursor
		if page = b.Next; page == "" {
			return cursor, nil
		}
	}
}

// Watch streams /v1/watch (JSON lines) after cursor ("" for now), handing
// every event to fn until ctx ends (nil), fn fails (its error), the
// cursor cannot be served (*ErrResync) or the stream breaks. keepAlive
// is the server's keep-alive interval (0 for its default); a stream
// silent for three of them is treated as broken.
func (c *Client) Watch(ctx context.Context, cursor string, keepAlive time.Duration, fn func(gateway.Envelope) error) error {
	q := url.Values{"format": {"jsonl"}}
	if cursor != "" {
		q.Set("cursor", cursor)
	}
	if keepAlive > 0 {
		q.Set("keepalive", keepAlive.String())
	} else {
		keepAlive = defaultKeepAlive
	}
	parent := ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req, err := c.request(ctx, c.Base+"/v1/watch?"+q.Encode())
	if err != nil {
		return err
	}
	hc := &http.Client{Transport: c.HTTP.Transport} // no overall timeout: a stream
	resp, err := hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("admin api %s: %w (is the gateway running?)", c.Base, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
		if resp.StatusCode == http.StatusGone {
			var rb ResyncBody
			if json.Unmarshal(body, &rb) == nil && rb.Error == "resync_required" {
				return &ErrResync{rb}
			}
		}
		return c.apiError(resp.StatusCode, body)
	}
	// a watchdog ends a stream that stays silent past three keep-alives
	alive := make(chan struct{}, 1)
	var stalled atomic.Bool
	go func() {
		t := time.NewTimer(3 * keepAlive)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-alive:
				t.Reset(3 * keepAlive)
			case <-t.C:
				stalled.Store(true)
				cancel()
				return
			}
		}
	}()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		select {
		case alive <- struct{}{}:
		default:
		}
		line := sc.Bytes()
		if bytes.HasPrefix(line, []byte(`{"keepalive"`)) {
			continue
		}
		if bytes.HasPrefix(line, []byte(`{"error"`)) {
			var rb ResyncBody
			if err := json.Unmarshal(line, &rb); err != nil {
				return fmt.Errorf("admin api: watch: bad line %.80q: %w", line, err)
			}
			if rb.Error == "resync_required" {
				return &ErrResync{rb}
			}
			return fmt.Errorf("admin api: watch: %s", rb.Error)
		}
		var env gateway.Envelope
		if err := json.Unmarshal(line, &env); err != nil {
			return fmt.Errorf("admin api: watch: bad line %.80q: %w", line, err)
		}
		if err := fn(env); err != nil {
			return err
		}
	}
	switch {
	case parent.Err() != nil:
		return nil
	case stalled.Load():
		return fmt.Errorf("admin api: watch: no keep-alive for %v", 3*keepAlive)
	case sc.Err() != nil:
		return fmt.Errorf("admin api: watch: %w", sc.Err())
	}
	return errors.New("admin api: watch: stream ended")
}
