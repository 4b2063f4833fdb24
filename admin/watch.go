package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// The consumers' API (docs/events.md): GET /v1/snapshot pages through
// every device's state with the cursor it was taken at, GET /v1/watch
// streams the events after a cursor.

const (
	// keepAlive is how often an idle watch stream sends a keep-alive; it
	// is also how long one store read waits.
	defaultKeepAlive = 15 * time.Second
	// watchBatch is the events read from a shard at once.
	watchBatch = 1000
)

// SnapshotBody is one page of GET /v1/snapshot: devices as envelopes
// (reason "snapshot"), the cursor the snapshot is at (the same on every
// page) and the next page ("" after the last).
type SnapshotBody struct {
	Devices []gateway.Envelope `json:"devices"`
	Cursor  string             `json:"cursor"`
	Next    string             `json:"next"`
}

// ResyncBody is the 410 answer (and the last message of a stream) when a
// cursor can no longer be served.
type ResyncBody struct {
	Error  string `json:"error"` // "resync_required"
	Reason string `json:"reason"`
	Shard  int    `json:"shard"`
}

// snapshotPage is the page token of /v1/snapshot:
// "<shard>~<store page>~<cursor>".
type snapshotPage struct {
	shard  int
	page   string
	cursor string
}

func (p snapshotPage) String() string {
	return strconv.Itoa(p.shard) + "~" + p.page + "~" + p.cursor
}

func parseSnapshotPage(s string, shards int) (snapshotPage, error) {
	parts := strings.SplitN(s, "~", 3)
	if len(parts) == 3 {
		n, err := strconv.Atoi(parts[0])
		if _, cerr := gateway.ParseCursor(parts[2], shards); err == nil && cerr == nil && n >= 0 && n < shards {
			return snapshotPage{shard: n, page: parts[1], cursor: parts[2]}, nil
		}
	}
	return snapshotPage{}, fmt.Errorf("page %.80q: not a page of /v1/snapshot", s)
}

// snapshot serves GET /v1/snapshot?state=&limit=&page=. The first page
// reads every shard's position (the cursor), then pages through the
// shards' devices, each page read at a position no earlier than the
// cursor. A consumer merges the events after the cursor, applying an
// event only when its ver is greater than the ver it holds.
func (s *Server) snapshot(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	want := gateway.State(q.Get("state"))
	switch want {
	case "", gateway.Online, gateway.Offline:
	default:
		writeError(w, http.StatusBadRequest, fmt.Errorf("state %q: want online or offline", want))
		return
	}
	limit, err := intParam(q.Get("limit"), 1000, 1, 10000)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	st := s.o.Store
	shards := st.Shards()
	var p snapshotPage
	if v := q.Get("page"); v != "" {
		if p, err = parseSnapshotPage(v, shards); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
	} else {
		cur, err := currentCursor(r.Context(), st)
		if err != nil {
			writeError(w, http.StatusBadGateway, err)
			return
		}
		p.cursor = cur.String()
	}
	out := SnapshotBody{Devices: []gateway.Envelope{}, Cursor: p.cursor}
	for calls := 0; calls < 64 && len(out.Devices) < limit; calls++ {
		page, err := st.SnapshotShard(r.Context(), p.shard, p.page, limit-len(out.Devices))
		if err != nil {
			writeError(w, http.StatusBadGateway, err)
			return
		}
		for _, d := range page.Devices {
			if want == "" || d.State == want {
				out.Devices = append(out.Devices, gateway.SnapshotEnvelope(d))
			}
		}
		p.page = page.Next
		if p.page == "" {
			if p.shard+1 == shards {
				writeJSON(w, http.StatusOK, out)
				return
			}
			p.shard++
		}
	}
	out.Next = p.String()
	writeJSON(w, http.StatusOK, out)
}

// currentCursor reads every shard's position.
func currentCursor(ctx context.Context, st gateway.EventLog) (gateway.Cursor, error) {
	c := make(gateway.Cursor, st.Shards())
	for i := range c {
		p, err := st.SnapshotShard(ctx, i, "", 0)
		if err != nil {
			return nil, err
		}
		c[i] = p.At
	}
	return c, nil
}

// endStreams ends the watch streams when the server shuts down
// (http.Server.Shutdown waits for requests but does not cancel them).
func (s *Server) endStreams() { s.closeOnce.Do(func() { close(s.closing) }) }

// shardRead is what the reader hands the stream writer: a batch of one
// shard, or the error that ends the stream (shard -1: a failed wait).
type shardRead struct {
	shard int
	evs   []gateway.Event
	err   error
}

// watch serves GET /v1/watch?cursor=C (the Last-Event-ID header of a
// reconnecting EventSource wins; no cursor starts at the current position):
// Server-Sent Events, or JSON lines with ?format=jsonl or Accept:
// application/x-ndjson. Every event carries the cursor after it; an idle
// stream sends a keep-alive every keepalive (default 15s, ?keepalive=).
// A cursor that cannot be served is answered 410 resync_required before
// the stream starts, or by a resync message that ends it.
func (s *Server) watch(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	st := s.o.Store
	shards := st.Shards()
	jsonl := q.Get("format") == "jsonl" || strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
	if f := q.Get("format"); f != "" && f != "jsonl" && f != "sse" {
		writeError(w, http.StatusBadRequest, fmt.Errorf("format %q: want sse or jsonl", f))
		return
	}
	keepAlive := defaultKeepAlive
	if v := q.Get("keepalive"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < 100*time.Millisecond || d > 10*time.Minute {
			writeError(w, http.StatusBadRequest, fmt.Errorf("keepalive %q: want a duration from 100ms to 10m", v))
			return
		}
		keepAlive = d
	}
	raw := resumeCursor(q.Get("cursor"), r.Header.Get("Last-Event-ID"))
	var cur gateway.Cursor
	var err error
	if raw == "" {
		cur, err = currentCursor(r.Context(), st)
		if err != nil {
			writeError(w, http.StatusBadGateway, err)
			return
		}
	} else if cur, err = gateway.ParseCursor(raw, shards); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	// A first read of every shard before the headers: a cursor that
	// cannot be served gets a plain 410.
	first := make([][]gateway.Event, shards)
	for i := range shards {
		first[i], err = st.ReadEvents(r.Context(), i, cur[i], watchBatch, 0)
		if err != nil {
			var re *gateway.ResyncError
			if errors.As(err, &re) {
				writeJSON(w, http.StatusGone, ResyncBody{Error: "resync_required", Reason: re.Reason, Shard: re.Shard})
				return
			}
			writeError(w, http.StatusBadGateway, err)
			return
		}
	}
	// Is the store able to hold this stream's wait? One that cannot
	// (every reader connection taken) gets a plain 503.
	if _, err := st.WaitEvents(r.Context(), cur, 0); err != nil {
		if errors.Is(err, gateway.ErrBusy) {
			w.Header().Set("Retry-After", "5")
			writeError(w, http.StatusServiceUnavailable, err)
			return
		}
		writeError(w, http.StatusBadGateway, err)
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	reads := make(chan shardRead, shards)
	if jsonl {
		w.Header().Set("Content-Type", "application/x-ndjson")
	} else {
		w.Header().Set("Content-Type", "text/event-stream")
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	out := deadlineWriter{w: w, rc: http.NewResponseController(w), timeout: s.o.WriteTimeout}
	// the end of the answer, written after the handler returns, gets its
	// own deadline too
	defer func() { _ = out.arm() }()
	sw := &streamWriter{w: bufio.NewWriterSize(out, 64<<10), out: out, jsonl: jsonl, pos: make([]string, shards)}
	for i, p := range cur {
		sw.pos[i] = p.String()
	}
	pending := make([]bool, shards)
	for i := range shards {
		if !sw.events(cur, i, first[i]) {
			return
		}
		pending[i] = len(first[i]) == watchBatch
	}
	// the stream's reads end with it (a wait in Redis is unblocked), so
	// that none outlives the request
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		readShards(ctx, st, slices.Clone(cur), pending, keepAlive, reads)
	}()
	defer func() {
		cancel()
		<-readDone
	}()
	if !sw.flush() {
		return
	}
	idle := time.NewTimer(keepAlive)
	defer idle.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-s.closing:
			return
		case <-idle.C:
			if !sw.keepAlive() {
				return
			}
			idle.Reset(keepAlive)
		case rd := <-reads:
			if rd.err != nil {
				var re *gateway.ResyncError
				if errors.As(rd.err, &re) {
					sw.resync(re)
				} else if ctx.Err() == nil {
					s.o.Logger.Warn("watch: store read failed; ending the stream", "shard", rd.shard, "err", rd.err)
					sw.failed(rd.err)
				}
				return
			}
			if !sw.events(cur, rd.shard, rd.evs) || !sw.flush() {
				return
			}
			if len(rd.evs) > 0 {
				idle.Reset(keepAlive)
			}
		}
	}
}

// resumeCursor is where a watch starts: after the Last-Event-ID header
// when there is one, else after the cursor query. An EventSource
// reconnects to the URL it was opened with (the cursor of the snapshot
// it started from) and names the last event it got in the header: the
// header is the newer position, and the query's may be trimmed since.
func resumeCursor(query, lastEventID string) string {
	if lastEventID != "" {
		return lastEventID
	}
	return query
}

// readShards reads every shard from pos on, handing each batch to the
// writer. The shards with events pending (the last batch was full) are
// read in turn; with none pending, one WaitEvents over every position
// waits up to wait and names the shards to read, so that an idle stream
// holds one wait of the store (one Redis connection on a standalone
// server). A wait that names none is followed by a read of every shard:
// ReadEvents checks each position (a store restarted or failed over
// shows there), so that a stream learns it within wait. One batch per
// shard waits in out while the next is read, so memory per stream stays
// bounded and reads overlap writes.
func readShards(ctx context.Context, st gateway.EventLog, pos gateway.Cursor, pending []bool, wait time.Duration, out chan<- shardRead) {
	send := func(rd shardRead) bool {
		select {
		case out <- rd:
			return true
		case <-ctx.Done():
			return false
		}
	}
	all := make([]int, len(pos))
	for i := range all {
		all[i] = i
	}
	for {
		var ready []int
		for i, p := range pending {
			if p {
				ready = append(ready, i)
			}
		}
		if len(ready) == 0 {
			named, err := st.WaitEvents(ctx, pos, wait)
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				send(shardRead{shard: -1, err: err})
				return
			}
			ready = named
			if len(ready) == 0 {
				ready = all
			}
		}
		for _, i := range ready {
			evs, err := st.ReadEvents(ctx, i, pos[i], watchBatch, 0)
			if ctx.Err() != nil {
				return
			}
			if (err != nil || len(evs) > 0) && !send(shardRead{shard: i, evs: evs, err: err}) {
				return
			}
			if err != nil {
				return
			}
			pending[i] = len(evs) == watchBatch
			if len(evs) > 0 {
				pos[i].ID = evs[len(evs)-1].ID
			}
		}
	}
}

// deadlineWriter is what a stream's buffer writes to: every write and
// every flush must end within timeout of its start. It replaces the
// server's write timeout, which bounds a whole answer and would cut a
// stream that lives longer; a client that stops reading is still cut
// off, one timeout into the write it blocks.
type deadlineWriter struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
}

var _ io.Writer = deadlineWriter{}

var _ io.Writer = deadlineWriter{}

func (d deadlineWriter) arm() error { return d.rc.SetWriteDeadline(time.Now().Add(d.timeout)) }

func (d deadlineWriter) Write(b []byte) (int, error) {
	if err := d.arm(); err != nil {
		return 0, err
	}
	return d.w.Write(b)
}

func (d deadlineWriter) Flush() error {
	if err := d.arm(); err != nil {
		return err
	}
	return d.rc.Flush()
}

// streamWriter writes one watch stream.
type streamWriter struct {
	w     *bufio.Writer
	out   deadlineWriter
	jsonl bool
	pos   []string // each shard's position, encoded
	buf   []byte
	err   error
}

// events writes the events of shard, moving cur past each.
func (sw *streamWriter) events(cur gateway.Cursor, shard int, evs []gateway.Event) bool {
	for _, e := range evs {
		cur[shard].ID = e.ID
		sw.pos[shard] = cur[shard].String()
		cursor := "v1:" + strings.Join(sw.pos, ",")
		sw.buf = sw.buf[:0]
		if !sw.jsonl {
			sw.buf = append(sw.buf, "id: "...)
			sw.buf = append(sw.buf, cursor...)
			if e.IsGateway() {
				sw.buf = append(sw.buf, "\nevent: gateway\ndata: "...)
			} else {
				sw.buf = append(sw.buf, "\nevent: presence\ndata: "...)
			}
		}
		sw.buf = appendEnvelope(sw.buf, gateway.EnvelopeOf(e), cursor)
		sw.buf = append(sw.buf, '\n')
		if !sw.jsonl {
			sw.buf = append(sw.buf, '\n')
		}
		if _, err := sw.w.Write(sw.buf); err != nil {
			sw.err = err
		}
		if sw.err != nil {
			return false
		}
	}
	return true
}

// appendEnvelope appends the JSON of e with its cursor: the bytes
// json.Marshal writes (checked by a test), without its reflection.
func appendEnvelope(b []byte, e gateway.Envelope, cursor string) []byte {
	b = append(b, '{')
	if e.Device != "" {
		b = append(b, `"device":`...)
		b = appendJSONString(b, string(e.Device))
		b = append(b, ',')
	}
	b = append(b, `"state":`...)
	b = appendJSONString(b, string(e.State))
	b = append(b, `,"ver":`...)
	b = strconv.AppendUint(b, e.Ver, 10)
	b = append(b, `,"at":`...)
	b = appendJSONTime(b, e.At)
	if e.Reason != "" {
		b = append(b, `,"reason":`...)
		b = appendJSONString(b, string(e.Reason))
	}
	b = append(b, `,"gateway":`...)
	b = appendJSONString(b, e.Gateway)
	if e.Session != "" {
		b = append(b, `,"session":`...)
		b = appendJSONString(b, string(e.Session))
	}
	if !e.Deadline.IsZero() {
		b = append(b, `,"deadline":`...)
		b = appendJSONTime(b, e.Deadline)
	}
	if !e.Contact.IsZero() {
		b = append(b, `,"contact":`...)
		b = appendJSONTime(b, e.Contact)
	}
	if cursor != "" {
		b = append(b, `,"cursor":`...)
		b = appendJSONString(b, cursor)
	}
	return append(b, '}')
}

func appendJSONTime(b []byte, t time.Time) []byte {
	mb, err := t.MarshalJSON()
	if err != nil {
		return append(b, "null"...)
	}
	return append(b, mb...)
}

// appendJSONString appends s quoted as encoding/json does: plain ASCII
// as is, the rest through json.Marshal.
func appendJSONString(b []byte, s string) []byte {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			q, _ := json.Marshal(s)
			return append(b, q...)
		}
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

func (sw *streamWriter) write(b []byte, tail ...byte) {
	if sw.err != nil {
		return
	}
	if _, err := sw.w.Write(b); err != nil {
		sw.err = err
		return
	}
	_, sw.err = sw.w.Write(tail)
}

func (sw *streamWriter) writeString(s string) {
	if sw.err == nil {
		_, sw.err = sw.w.WriteString(s)
	}
}

func (sw *streamWriter) flush() bool {
	if sw.err == nil {
		sw.err = sw.w.Flush()
	}
	if sw.err == nil {
		sw.err = sw.out.Flush()
	}
	return sw.err == nil
}

func (sw *streamWriter) keepAlive() bool {
	if sw.jsonl {
		sw.writeString("{\"keepalive\":true}\n")
	} else {
		sw.writeString(": keep-alive\n\n")
	}
	return sw.flush()
}

// resync ends the stream with a resync_required message.
func (sw *streamWriter) resync(re *gateway.ResyncError) {
	b, _ := json.Marshal(ResyncBody{Error: "resync_required", Reason: re.Reason, Shard: re.Shard})
	sw.message("resync", b)
}

// failed ends the stream with an error message.
func (sw *streamWriter) failed(err error) {
	b, _ := json.Marshal(apiError{Error: err.Error()})
	sw.message("error", b)
}

func (sw *streamWriter) message(event string, b []byte) {
	if sw.jsonl {
		sw.write(b, '\n')
	} else {
		sw.writeString("event: " + event + "\ndata: ")
		sw.write(b, '\n', '\n')
	}
	sw.flush()
}
