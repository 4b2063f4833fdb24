-- Reap at most limit due entries of one shard, atomically (Store.Reap).
-- KEYS: exp, dev, events, epochs, inv (record.lua).
-- ARGV: limit, now ms or "", events maxlen.
-- Returns {trimmed, more (1|0), next deadline or -1, orphans, events...};
-- orphans counts due entries without an online record (removed, no event).
local limit, now, maxlen = tonumber(ARGV[1]), clock(ARGV[2]), ARGV[3]
local nowstr, nowpacked = string.format('%d', now), struct.pack('>I6', now)

-- offline turns the record of a device whose only session ran out (the
-- common due entry) into its offline record straight from the packed
-- bytes; it returns nil for other records, which take the general path.
local function offline(p)
  if byte(p, 1) ~= 7 then return nil end
  local ver, i = ruvarint(p, 2)
  i = i + 6
  if byte(p, i) ~= 0 then return nil end
  local gw, ep, sid
  gw, i = ruvarint(p, i + 1)
  ep, i = ruvarint(p, i)
  -- the only session's offset from the device deadline is 0: one byte
  sid = rsid(p, i + 1, gw, ep)
  ver = ver + 1
  return char(0) .. uvarint(ver) .. nowpacked .. uvarint(gw) .. uvarint(#sid * 2) .. sid, ver, gw, sid
end

local due = {}
if limit > 0 then
  due = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
end
local devs = {}
for i = 1, #due, 2 do devs[#devs + 1] = due[i] end
local packed = {}
if #devs > 0 then packed = mcall('HMGET', KEYS[2], devs) end

local trimmed, orphans = 0, 0
local hset, zadd, zrem, inv, events = {}, {}, {}, {}, {}
for k, dev in ipairs(devs) do
  local p, old = packed[k], due[2 * k]
  local rec, ver, gw, sid
  if p then rec, ver, gw, sid = offline(p) end
  if rec then
    events[#events + 1] = emit(dev, 'offline', ver, nowstr, 'expired', gwname(gw), sid, old)
    zrem[#zrem + 1] = dev
    hset[#hset + 1] = dev
    hset[#hset + 1] = rec
    -- the record was steady for gw: its belief about it is void
    inv[#inv + 1] = 0
    inv[#inv + 1] = invalidation(gw, now, dev)
  else
    local r = p and decode(p, tonumber(old))
    if not r or not r.on then
      orphans = orphans + 1
      zrem[#zrem + 1] = dev
    else
      dropexpired(r, now)
      local dl = maxdl(r)
      if dl then
        trimmed = trimmed + 1
        zadd[#zadd + 1] = dl
        zadd[#zadd + 1] = dev
      else
        r.on, r.ver, r.since = false, r.ver + 1, now
        events[#events + 1] = emit(dev, 'offline', r.ver, nowstr, 'expired', gwname(r.lastgw), r.lastsid, old)
        zrem[#zrem + 1] = dev
      end
      hset[#hset + 1] = dev
      hset[#hset + 1] = encode(r)
    end
  end
end
if #hset > 0 then mcall('HSET', KEYS[2], hset) end
if #zadd > 0 then mcall('ZADD', KEYS[1], zadd) end
if #zrem > 0 then mcall('ZREM', KEYS[1], zrem) end
if #inv > 0 then mcall('ZADD', KEYS[5], inv) end
-- Invalidations older than an hour are of no use (a gateway uses a belief
-- for ten minutes at most, record.lua "Beliefs"): forget those of one
-- gateway ref per call, the refs in turn ("~r" in the epochs hash).
local refs = redis.call('HMGET', KEYS[4], '#', '~r')
local last = tonumber(refs[1])
if last then
  local r = (tonumber(refs[2]) or 0) % last + 1
  redis.call('HSET', KEYS[4], '~r', r)
  redis.call('ZREMRANGEBYLEX', KEYS[5], '[' .. r .. ':', '(' .. invalidation(r, now - 3600000, ''))
end

trim(maxlen)
local first = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local more, nextdl = 0, -1
if #first > 0 then
  nextdl = tonumber(first[2])
  if nextdl <= now then more = 1 end
end
local out = {trimmed, more, nextdl, orphans}
for _, e in ipairs(events) do out[#out + 1] = e end
return out
