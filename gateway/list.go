package gateway

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"
)

// ErrBadQuery: a List query the store cannot answer as asked (an
// unknown order or state filter, a prefix with OrderChanged, a cursor
// that is not one of that order's). The admin API answers it 400.
var ErrBadQuery = errors.New("bad query")

// ListOrder is the order of Store.List.
type ListOrder string

const (
	// OrderID lists devices by ID, in byte order (the default).
	OrderID ListOrder = "id"
	// OrderChanged lists devices by their last change (DeviceInfo.Since,
	// the store time the current state began), newest first; devices
	// whose state began in the same millisecond by ID, descending.
	OrderChanged ListOrder = "changed"
)

// ListKey is a device's place in a List order: its ID and, for
// OrderChanged, its last change in ms on the store clock.
type ListKey struct {
	Since  int64
	Device DeviceID
}

// KeyOf is the place of d in order o.
func (o ListOrder) KeyOf(d DeviceInfo) ListKey {
	k := ListKey{Device: d.Device}
	if o == OrderChanged {
		k.Since = d.Since.UnixMilli()
	}
	return k
}

// Compare orders two keys as o lists them: < 0 when a comes first.
func (o ListOrder) Compare(a, b ListKey) int {
	if o == OrderChanged {
		return cmp.Or(cmp.Compare(b.Since, a.Since), strings.Compare(string(b.Device), string(a.Device)))
	}
	return strings.Compare(string(a.Device), string(b.Device))
}

// Check validates q and returns its order ("" made OrderID), its
// limit bounded to [1, maxLimit] (≤ 0 made 100 first) and the key its
// cursor resumes after (nil to start). Its errors wrap ErrBadQuery.
func (q ListQuery) Check(maxLimit int) (ListOrder, int, *ListKey, error) {
	o := cmp.Or(q.Order, OrderID)
	switch o {
	case OrderID, OrderChanged:
	default:
		return "", 0, nil, fmt.Errorf("order %q: want %s or %s: %w", q.Order, OrderID, OrderChanged, ErrBadQuery)
	}
	switch q.State {
	case "", Online, Offline:
	default:
		return "", 0, nil, fmt.Errorf("state filter %q: the store knows online and offline only: %w", q.State, ErrBadQuery)
	}
	if q.Prefix != "" {
		if o != OrderID {
			return "", 0, nil, fmt.Errorf("prefix %q: a prefix lists by ID, not by %s: %w", q.Prefix, o, ErrBadQuery)
		}
		if _, err := ParseDeviceID(q.Prefix); err != nil {
			return "", 0, nil, fmt.Errorf("prefix: %w: %w", err, ErrBadQuery)
		}
	}
	limit := q.Limit
	if limit <= 0 {
		limit = 100
	}
	limit = min(limit, maxLimit)
	if q.Cursor == "" {
		return o, limit, nil, nil
	}
	k, err := ParseListCursor(o, q.Cursor)
	if err != nil {
		return "", 0, nil, err
	}
	return o, limit, &k, nil
}

// Cursor is the List cursor that resumes after k in order o:
// "id:<device>" or "changed:<ms>:<device>".
func (o ListOrder) Cursor(k ListKey) string {
	if o == OrderChanged {
		return "changed:" + strconv.FormatInt(k.Since, 10) + ":" + string(k.Device)
	}
	return "id:" + string(k.Device)
}

// ParseListCursor reads a cursor of order o, as ListOrder.Cursor writes
// it (and only so: a cursor it accepts is written back the same); its
// errors wrap ErrBadQuery.
func ParseListCursor(o ListOrder, s string) (ListKey, error) {
	bad := fmt.Errorf("cursor %q: not a cursor of the order %s: %w", s, o, ErrBadQuery)
	var k ListKey
	rest, ok := strings.CutPrefix(s, string(o)+":")
	if !ok {
		return k, bad
	}
	if o == OrderChanged {
		ms, dev, ok := strings.Cut(rest, ":")
		n, err := strconv.ParseInt(ms, 10, 64)
		if !ok || err != nil || n < 0 || strconv.FormatInt(n, 10) != ms {
			return k, bad
		}
		k.Since, rest = n, dev
	}
	d, err := ParseDeviceID(rest)
	if err != nil {
		return k, bad
	}
	k.Device = d
	return k, nil
}

// ListRun is what one source of a List page (a shard, or one state of
// a shard) read, in the order: its keys after the cursor, and, when it
// stopped before its end (it read the limit, or the budget of records
// it may look at ran out), More and Bound, the last key it looked at
// (its last key or beyond it): what comes after Bound it did not read.
type ListRun struct {
	Keys  []ListKey
	More  bool
	Bound ListKey
}

// MergeListRuns merges the runs of one List call in order o into the
// page's keys, at most limit, and the cursor key of the next page (nil
// after the last): the page holds only keys that no run can have
// missed, those up to the earliest Bound of a run that has More, so a
// run that stopped early (its budget spent on filtered-out devices) may
// leave the page short of limit while a next page remains.
func MergeListRuns(o ListOrder, runs []ListRun, limit int) ([]ListKey, *ListKey) {
	var bound *ListKey
	var keys []ListKey
	for _, r := range runs {
		keys = append(keys, r.Keys...)
		if r.More && (bound == nil || o.Compare(r.Bound, *bound) < 0) {
			bound = &r.Bound
		}
	}
	slices.SortFunc(keys, o.Compare)
	if bound != nil {
		n, _ := slices.BinarySearchFunc(keys, *bound, o.Compare)
		for n < len(keys) && o.Compare(keys[n], *bound) == 0 {
			n++
		}
		keys = keys[:n]
	}
	if len(keys) > limit {
		keys = keys[:limit]
		next := keys[limit-1]
		return keys, &next
	}
	if bound != nil {
		next := *bound
		return keys, &next
	}
	return keys, nil
}

// SuspectWindow is how far ahead of now the deadline of a suspect
// device lies at most: lease − suspectAfter, 0 when suspectAfter ≥ lease
// (then no device is suspect). A device whose deadline d is in
// (now, now + window] is suspect by DeriveState; Reader.Counts counts
// those.
func SuspectWindow(lease, suspectAfter time.Duration) time.Duration {
	return max(0, lease-suspectAfter)
}
