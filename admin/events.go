package admin

import (
	"fmt"
	"net/http"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
)

// EventPage is the body of GET /v1/events: events of all shards merged in
// time order, and the cursor to ask for the ones after them.
type EventPage struct {
	Events []gateway.Event `json:"events"`
	Cursor string          `json:"cursor"`
}

// events serves GET /v1/events?cursor=C&since=D&limit=N. Without a
// cursor it starts at the store's now minus since (default 0: only new
// events), using the fact that log positions are "<ms>-<seq>" on the
// store clock. The cursor holds one position per shard.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	limit, err := intParam(q.Get("limit"), 100, 1, 10000)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	shards := s.o.Store.Shards()
	var pos []string
	if c := q.Get("cursor"); c != "" {
		pos = strings.Split(c, ",")
		if len(pos) != shards {
			writeError(w, http.StatusBadRequest, fmt.Errorf("cursor has %d positions, the store has %d shards", len(pos), shards))
			return
		}
		for i, p := range pos {
			if !validEventID(p) {
				writeError(w, http.StatusBadRequest, fmt.Errorf("cursor position %d %q: want <ms>-<seq>", i, p))
				return
			}
		}
	} else {
		var since time.Duration
		if v := q.Get("since"); v != "" {
			if since, err = time.ParseDuration(v); err != nil || since < 0 {
				writeError(w, http.StatusBadRequest, fmt.Errorf("since %q: want a duration like 10m", v))
				return
			}
		}
		now, err := s.o.Store.Now(r.Context())
		if err != nil {
			writeError(w, http.StatusBadGateway, err)
			return
		}
		start := strconv.FormatInt(now.Add(-since).UnixMilli(), 10) + "-0"
		pos = make([]string, shards)
		for i := range pos {
			pos[i] = start
		}
	}
	perShard := make([][]gateway.Event, shards)
	var all []gateway.Event
	for shard := range shards {
		evs, err := s.o.Store.Events(r.Context(), shard, pos[shard], limit)
		if err != nil {
			writeError(w, http.StatusBadGateway, err)
			return
		}
		perShard[shard] = evs
		all = append(all, evs...)
	}
	// Keep the earliest `limit` events overall, but as a prefix of each
	// shard's log so that the cursor never skips one.
	sort.SliceStable(all, func(i, j int) bool { return all[i].At.Before(all[j].At) })
	keep := make([]int, shards)
	for _, e := range all[:min(limit, len(all))] {
		keep[e.Shard]++
	}
	all = all[:0]
	for shard, n := range keep {
		if n > 0 {
			all = append(all, perShard[shard][:n]...)
			pos[shard] = perShard[shard][n-1].ID
		}
	}
	sort.SliceStable(all, func(i, j int) bool { return all[i].At.Before(all[j].At) })
	writeJSON(w, http.StatusOK, EventPage{Events: append([]gateway.Event{}, all...), Cursor: strings.Join(pos, ",")})
}

// validEventID reports whether id is a position of /v1/events: "" or
// "0" (the start of the log) or an event ID "<ms>-<seq>".
func validEventID(id string) bool {
	if id == "" || id == "0" {
		return true
	}
	ms, seq, ok := strings.Cut(id, "-")
	return ok && digits(ms) && digits(seq)
}

func digits(s string) bool {
	return s != "" && len(s) <= 20 && strings.Trim(s, "0123456789") == ""
}
