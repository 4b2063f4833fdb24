-- The position of one shard's event log (Store.SnapshotShard and
-- Store.ReadEvents; the Go side runs it in one MULTI with the read it
-- positions, so both see the same instant).
-- KEYS[1] {P:s}:events, KEYS[2] {P:s}:epochs (record.lua).
-- Returns {incarnation, last generated ID, first entry ID, removed}: the
-- incarnation is the "~" field of the epochs hash (created here when no
-- apply has created it yet, as apply.lua does) and the server's
-- replication ID; removed is how many entries were ever trimmed from the
-- stream (entries-added - length; trimming does not set
-- max-deleted-entry-id). For a stream that does not exist: "0-0", "", 0.
local inc = redis.call('HGET', KEYS[2], '~')
if not inc then
  local t = redis.call('TIME')
  inc = t[1] .. '.' .. t[2]
  redis.call('HSET', KEYS[2], '~', inc)
end
inc = inc .. '/' .. (string.match(redis.call('INFO', 'replication'), 'master_replid:(%x+)') or '')
local last, first, added, length = '0-0', '', 0, 0
if redis.call('EXISTS', KEYS[1]) == 1 then
  local info = redis.call('XINFO', 'STREAM', KEYS[1])
  for i = 1, #info, 2 do
    local k, v = info[i], info[i + 1]
    if k == 'last-generated-id' then
      last = v
    elseif k == 'entries-added' then
      added = v
    elseif k == 'length' then
      length = v
    elseif k == 'first-entry' and type(v) == 'table' then
      first = v[1]
    end
  end
end
return {inc, last, first, added - length}
