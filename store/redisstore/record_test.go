package redisstore

import (
	"fmt"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/fleetgate/fleetgate/internal/redistest"
)

// recordReadsLua builds records with lua/record.lua's encode and reads
// them with its byte-level readers (isonline, steadyref through owner,
// believer), next to what decode says of the same record.
const recordReadsLua = `
local function steady(ver, ref, ep, sid)
  return {on = true, ver = ver, since = 1893456000000, lastgw = ref, lastsid = sid,
    sess = {{gw = ref, ep = ep, dl = 1893456090000, sid = sid}}, tombs = {}}
end
local cases = {
  steady(1, 1, 1, 'coap/default'),
  steady(1893456000000, 300, 70000, 'gw-a/70000/12'),
  {on = true, ver = 5, since = 1893456000000, lastgw = 2, lastsid = 's1',
    sess = {{gw = 2, ep = 1, dl = 1893456090000, sid = 's1'}, {gw = 3, ep = 1, dl = 1893456080000, sid = 's2'}}, tombs = {}},
  {on = true, ver = 5, since = 1893456000000, lastgw = 4, lastsid = 'other',
    sess = {{gw = 2, ep = 1, dl = 1893456090000, sid = 's1'}}, tombs = {}},
  {on = false, ver = 200, since = 1893456000000, lastgw = 9, lastsid = 'coap/x', sess = {}, tombs = {}},
}
local out = {}
for _, r in ipairs(cases) do
  local p = encode(r)
  local d = decode(p, 1893456090000)
  out[#out + 1] = {isonline(p) and 1 or 0, d.on and 1 or 0, owner(p) or -1, believer(p) or -1, steadysid(d, d.lastgw, 70000) or steadysid(d, d.lastgw, 1) or ''}
end
return out
`

// The byte-level readers of the packed record agree with decode: online,
// the owner of a steady record (one online session, the last one written;
// multi-byte ver, gateway ref and epoch included), the believer of an
// offline one, and none for the others.
func TestRecordByteReaders(t *testing.T) {
	c := redistest.Start(t).Client(t)
	keys := []string{"{r}:exp", "{r}:dev", "{r}:events", "{r}:epochs", "{r}:inv", "{r}:held", "{r}:gateways"}
	res, err := redis.NewScript(recordLua+recordReadsLua).Run(t.Context(), c, keys).Slice()
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"[1 1 1 1 coap/default]",
		"[1 1 300 300 gw-a/70000/12]",
		"[1 1 -1 -1 ]",
		"[1 1 -1 -1 ]",
		"[0 0 -1 9 ]",
	}
	if len(res) != len(want) {
		t.Fatalf("%d results, want %d: %v", len(res), len(want), res)
	}
	for i, r := range res {
		if got := fmt.Sprint(r); got != want[i] {
			t.Errorf("case %d: isonline, decode's on, owner, believer, steady sid = %s, want %s", i+1, got, want[i])
		}
	}
}
