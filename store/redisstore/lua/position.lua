-- The position of one shard's event log (Store.SnapshotShard and
-- Store.ReadEvents; the Go side runs it in one MULTI with the read it
-- positions, so both see the same instant).
-- KEYS[1] {P:s}:events, KEYS[2] {P:s}:epochs, KEYS[3] {P:s}:dev (record.lua).
-- ARGV[1]: the position a read starts after, or "" for a snapshot.
-- Returns {incarnation, last generated ID, first entry ID, removed}: the
-- incarnation is the "~" token of the epochs and device hashes (created
-- anew here when either lacks it, as record.lua's incarnation does) and
-- the server's
-- replication ID; removed is how many entries were ever trimmed from the
-- stream (entries-added - length; trimming does not set
-- max-deleted-entry-id). For a stream that does not exist: "0-0", "", 0.
-- A read after a position at or past the first entry cannot have lost
-- anything to trimming: then the counters are not read, removed is 0
-- and the last ID "" (unknown).
local inc = redis.call('HGET', KEYS[2], '~')
if not inc or inc ~= redis.call('HGET', KEYS[3], '~') then
  local t = redis.call('TIME')
  inc = t[1] .. '.' .. t[2]
  redis.call('HSET', KEYS[2], '~', inc)
  redis.call('HSET', KEYS[3], '~', inc)
end
inc = inc .. '/' .. (string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or '')
-- idlt reports whether stream ID a is before b ("<ms>-<seq>", or "0").
local function idlt(a, b)
  local am, as = string.match(a, '^(%d+)-?(%d*)$')
  local bm, bs = string.match(b, '^(%d+)-?(%d*)$')
  am, bm = tonumber(am), tonumber(bm)
  if am ~= bm then return am < bm end
  return (tonumber(as) or 0) < (tonumber(bs) or 0)
end

local last, first, removed = '0-0', '', 0
local head = redis.call('XRANGE', KEYS[1], '-', '+', 'COUNT', 1)
if head[1] then first = head[1][1] end
-- Only a reader before the first entry can have lost events to trimming:
-- then (and for a snapshot's position) read the stream's counters.
if ARGV[1] == '' or first == '' or idlt(ARGV[1], first) then
  if redis.call('EXISTS', KEYS[1]) == 1 then
    local info = redis.call('XINFO', 'STREAM', KEYS[1])
    local added, length = 0, 0
    for i = 1, #info, 2 do
      local k, v = info[i], info[i + 1]
      if k == 'last-generated-id' then
        last = v
      elseif k == 'entries-added' then
        added = v
      elseif k == 'length' then
        length = v
      end
    end
    removed = added - length
  end
else
  last = ''
end
return {inc, last, first, removed}
