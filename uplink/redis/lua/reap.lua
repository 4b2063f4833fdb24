-- Reap at most limit due entries of one shard, atomically (Store.Reap).
-- KEYS: exp, dev, events, epochs, inv (record.lua).
-- ARGV: limit, now ms or "", events maxlen.
-- Returns one flat array:
--   {trimmed, more (1|0), next deadline or -1, orphans, now,
--    then per offline event: id, device, ver, gw, session, deadline}
-- Every reap event is state offline, reason expired, at now, so those are
-- not repeated per event (the Go side fills them in); deadline is the
-- device's old score. orphans counts due entries without an online record
-- (removed, no event).
local limit, now, maxlen = tonumber(ARGV[1]), clock(ARGV[2]), ARGV[3]
local nowstr, nowpacked = string.format('%d', now), struct.pack('>I6', now)
local rcall, evkey = redis.call, KEYS[3]

-- offline turns the record of a device whose only session ran out (the
-- common due entry) into its offline record straight from the packed
-- bytes; it returns nil for other records, which take the general path.
-- Returns the new record, its ver, the gateway ref and the session id.
local HEAD1 = 2 + 1 + SINCE_LEN -- afterhead of a record whose ver is one byte
local function offline(p)
  local flags, v = byte(p, 1, 2)
  if flags ~= STEADY then return nil end
  if v < 127 then
    -- Fast path: one-byte ver (and ver + 1), last-session index 0, one-byte
    -- gateway ref and epoch, offset 0, and a literal sid shorter than 64
    -- bytes: from HEAD1 on the bytes are 0, gw, ep, 0, 2 * #sid, sid. The
    -- offline record keeps the gateway ref and the sid's literal bytes.
    local l, gw, ep, _, t = byte(p, HEAD1, HEAD1 + 4)
    if l == 0 and gw < 128 and ep < 128 and t < 128 and t % 2 == 0 then
      local j = HEAD1 + 4 + t / 2
      return char(0, v + 1) .. nowpacked .. char(gw) .. sub(p, HEAD1 + 4, j), v + 1, gw, sub(p, HEAD1 + 5, j)
    end
  end
  local ver = ruvarint(p, 2)
  local i = afterhead(p)
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
  due = rcall('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'WITHSCORES', 'LIMIT', 0, limit)
end
local devs = {}
for i = 1, #due, 2 do devs[#devs + 1] = due[i] end
local packed = {}
if #devs > 0 then packed = mcall('HMGET', KEYS[2], devs) end

-- out[1..5] are filled in at the end; n is the last index used.
local out, n = {0, 0, -1, 0, now}, 5
local trimmed, orphans = 0, 0
local hset, zadd, zrem = {}, {}, {}
for k, dev in ipairs(devs) do
  local p, old = packed[k], due[2 * k]
  local rec, ver, gw, sid
  if p then rec, ver, gw, sid = offline(p) end
  if not rec then
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
        ver, gw, sid = r.ver, r.lastgw, r.lastsid
      end
      hset[#hset + 1] = dev
      hset[#hset + 1] = encode(r)
    end
  else
    hset[#hset + 1] = dev
    hset[#hset + 1] = rec
  end
  if ver then
    -- the offline event, as emit (record.lua) writes it
    local gwn = gwname(gw)
    local id = rcall('XADD', evkey, '*',
      'device', dev, 'state', 'offline', 'ver', ver, 'at', nowstr, 'reason', 'expired',
      'gw', gwn, 'session', sid, 'deadline', old)
    out[n + 1], out[n + 2], out[n + 3], out[n + 4], out[n + 5], out[n + 6] = id, dev, ver, gwn, sid, old
    n = n + 6
    zrem[#zrem + 1] = dev
  end
end
emitted = emitted + (n - 5) / 6
if #hset > 0 then mcall('HSET', KEYS[2], hset) end
if #zadd > 0 then mcall('ZADD', KEYS[1], zadd) end
if #zrem > 0 then mcall('ZREM', KEYS[1], zrem) end
-- Invalidations older than an hour are of no use (a gateway uses a belief
-- for ten minutes at most, record.lua "Beliefs"): forget those of one
-- gateway ref per call, the refs in turn ("~r" in the epochs hash). In
-- the steady state there are none, and the call writes nothing for this.
local refs = rcall('ZCARD', KEYS[5]) > 0 and rcall('HMGET', KEYS[4], '#', '~r') or {}
local last = tonumber(refs[1])
if last then
  local r = (tonumber(refs[2]) or 0) % last + 1
  rcall('HSET', KEYS[4], '~r', r)
  rcall('ZREMRANGEBYLEX', KEYS[5], '[' .. r .. ':', '(' .. invalidation(r, now - 3600000, ''))
end

trim(maxlen)
local first = rcall('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
local more, nextdl = 0, -1
if #first > 0 then
  nextdl = tonumber(first[2])
  if nextdl <= now then more = 1 end
end
out[1], out[2], out[3], out[4] = trimmed, more, nextdl, orphans
return out
